"""A caller's output ceiling above its model's catalog maximum is reserved, and sent, at that
maximum: the model cannot write more, and the ceiling that leaves capgate makes sure of it. On
every endpoint family (chat, messages, responses), the reservation API and batch lines, a request
asking for 32,000 output tokens of a model whose maximum is lower holds exactly what a request
asking for the maximum holds, and the provider gets the maximum in its own parameter. A provider
that bills past it anyway is recorded as excess. Slices on and off."""

from __future__ import annotations

import json

import pytest

from jobs.sizing import size_message_batch, size_openai_file
from ledger.models import UsageRecord
from tests.gateway.conftest import wait_settled
from tests.gateway.test_billing import claude, gpt, post  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

ASKED = 32_000  # Claude Code's max_tokens
# (path, route, ceiling parameter, the model's catalog maximum)
FAMILIES = {
    "chat": ("/v1/chat/completions", "gpt-real", "max_completion_tokens", 16_384),
    "messages": ("/v1/messages", "claude-real", "max_tokens", 8_192),
    "responses": ("/v1/responses", "gpt-real", "max_output_tokens", 16_384),
}
# nano-USD per input token at each model's priciest input rate (claude-real's cache write, $3.75
# per 1M; gpt-real's input, $2): a longer number in the body is a longer byte bound.
INPUT_NANO = {"gpt-real": 2_000, "claude-real": 3_750}


def _digits(a: int, b: int) -> int:
    return len(str(a)) - len(str(b))


def _body(family: str, ceiling: int) -> dict:
    _, route, param, _ = FAMILIES[family]
    if family == "responses":
        return {"model": route, "input": "hello", param: ceiling}
    return {"model": route, "messages": [{"role": "user", "content": "hello"}], param: ceiling}


def _reserved(gateway, upstream, family: str, ceiling: int) -> tuple[int, dict]:
    """The reservation of one request asking for `ceiling`, and the body the provider got."""
    path, *_ = FAMILIES[family]
    resp = post(gateway, _body(family, ceiling), path=path)
    assert resp.status_code == 200, resp.text
    wait_settled()
    record = UsageRecord.objects.get(request_id=resp.headers["x-capgate-request-id"])
    return record.reserved_nano, upstream.last(path)["body"]


@pytest.fixture
def priced(wired, upstream, gpt, claude, slices_mode):  # noqa: F811
    """A $5 blocking cap; the fake upstream bills every output token a request allows."""
    wired.budget(amount="5")
    upstream.control(completion_tokens="max")
    return wired


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_ceiling_above_the_models_maximum_holds_and_sends_the_maximum(gateway, upstream, priced, family):
    _, route, param, maximum = FAMILIES[family]
    # given what a request asking for exactly the model's maximum holds
    at_max, _ = _reserved(gateway, upstream, family, maximum)
    # when the caller asks for more than the model can write
    above, sent = _reserved(gateway, upstream, family, ASKED)
    # then it holds the same (but for the longer number's bytes), and the provider was told the
    # maximum, alone, in its own parameter
    assert above == at_max + _digits(ASKED, maximum) * INPUT_NANO[route]
    assert sent[param] == maximum
    assert [p for p in ("max_tokens", "max_completion_tokens", "max_output_tokens") if p in sent] == [param]
    record = UsageRecord.objects.order_by("-id").first()
    assert record is not None and record.output_tokens == maximum and record.excess_nano == 0


def test_a_provider_billing_past_the_maximum_is_recorded_as_excess(gateway, priced, upstream):
    # given a provider that bills more output than the model's catalog maximum
    upstream.control(completion_tokens=20_000)
    # when a request asks for more than that maximum
    resp = post(gateway, _body("chat", ASKED))
    assert resp.status_code == 200, resp.text
    wait_settled()
    # then the bill is recorded in full, its part above the reservation as excess
    record = UsageRecord.objects.get()
    assert record.output_tokens == 20_000
    assert record.cost_nano > record.reserved_nano
    assert record.excess_nano == record.cost_nano - record.reserved_nano


def test_the_reservation_api_bounds_a_ceiling_at_the_models_maximum(gateway, priced):
    def reserve(ceiling: int) -> int:
        body = {"model": "gpt-real", "messages": [{"role": "user", "content": "hello"}], "max_tokens": ceiling}
        resp = post(gateway, body, path="/v1/reservations")
        assert resp.status_code == 201, resp.text
        return int(resp.json()["amount_nano"])

    assert reserve(ASKED) == reserve(16_384)


def test_batch_lines_are_bounded_and_written_at_the_models_maximum(priced):
    key = priced.key

    def openai_file(ceiling: int) -> tuple[int, dict]:
        line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": _body("chat", ceiling)}
        sized, raw = size_openai_file(key=key, raw=json.dumps(line).encode())
        return sized.worst_nano, json.loads(raw)["body"]

    def message_batch(ceiling: int) -> tuple[int, dict]:
        sized, out = size_message_batch(
            key=key, body={"requests": [{"custom_id": "a", "params": _body("messages", ceiling)}]}
        )
        return sized.worst_nano, out[0]["params"]

    for size, param, maximum in ((openai_file, "max_completion_tokens", 16_384), (message_batch, "max_tokens", 8_192)):
        at_max, _ = size(maximum)
        above, sent = size(ASKED)
        # (batch price: half of each rate, gpt-real's and claude-real's)
        assert at_max <= above <= at_max + _digits(ASKED, maximum) * INPUT_NANO["claude-real"]
        assert sent[param] == maximum
