"""Routes across formats: failover from a failing target of one format to a healthy one of the
other, each attempt priced at the model called; the worst case taken on the translated body at
the priciest target; untranslatable fields refused with 400 naming them; errors in the endpoint's
own shape."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import pytest

from catalog.models import Connection, Model
from gateway.admission.bounds import shape_chat, shape_messages
from gateway.translate import translate_request
from ledger.models import Reservation, UsageRecord
from tests.conftest import usd, window_of
from tests.gateway.conftest import KEY, assert_nothing_held, wait_settled
from tests.upstream.server import run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

OPENAI_HEADERS = {"authorization": f"Bearer {KEY}"}
ANTHROPIC_HEADERS = {"x-api-key": KEY}


@pytest.fixture
def broken():
    """A second fake provider that answers every call with 503."""
    handle = run_in_thread()
    handle.control(fail="503")
    yield handle
    handle.stop()


def _connection(wired, kind: str, url: str) -> Connection:
    base = url + "/v1" if kind == "openai" else url
    return Connection.objects.create(
        organization=wired.org,
        name=f"{kind}-{url[-5:]}",
        kind=kind,
        base_url=base,
        secret="sk-x",
        options={"forward_test_headers": True},
    )


def _cheap_model(wired) -> Model:
    """A second model at a fifth of the test model's prices ($3 / $15 per 1M)."""
    return Model.objects.create(
        provider=wired.model.provider,
        name="cheap-1",
        input_usd_per_mtok=Decimal("3"),
        output_usd_per_mtok=Decimal("15"),
        max_output_tokens=4096,
        max_image_tokens=1600,
    )


def _post(gateway, kind: str, body: dict, headers: dict | None = None) -> httpx.Response:
    path, auth = ("/v1/chat/completions", OPENAI_HEADERS) if kind == "chat" else ("/v1/messages", ANTHROPIC_HEADERS)
    return httpx.post(gateway.url + path, headers={**auth, **(headers or {})}, json=body, timeout=30)


CASES = {
    # endpoint: (failing target's kind, healthy target's kind)
    "chat": ("openai", "anthropic"),
    "messages": ("anthropic", "openai"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_failover_crosses_formats_and_bills_the_model_called(
    gateway, wired, upstream, broken, slices_mode, kind, stream
):
    # given: a blocking cap; the first target (the endpoint's own format, on the priced model) fails
    # with 503, the second (the other format, on a model at a fifth of the price) is healthy
    budget = wired.budget(amount="5")
    failing, healthy = CASES[kind]
    first = _connection(wired, failing, broken.url)
    second = Connection.objects.get(pk=(wired.anthropic if healthy == "anthropic" else wired.openai).pk)
    cheap = _cheap_model(wired)
    route = wired.route("cross", first)
    route.targets.create(connection=second, model=cheap, position=1)
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    body = {"model": "cross", "max_tokens": 300, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    # when
    r = _post(gateway, kind, body)
    # then: served by the healthy target, in the endpoint's own format
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]") if kind == "chat" else "event: message_stop" in r.text
    else:
        assert ("choices" in r.json()) if kind == "chat" else (r.json()["type"] == "message")
    assert broken.stats()["requests"] == 1
    # one record for the request, at the attempt that billed: the cheap model's price
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id) == ("served", second.id)
    assert rec.cost_nano == 1000 * 3_000 + 200 * 15_000
    assert window_of(budget).spent_nano == rec.cost_nano and window_of(budget).reserved_nano == 0
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("guarded", [True, False], ids=["bound-on-translation", "removed"])
def test_the_worst_case_is_the_translated_body_at_the_priciest_target(
    gateway, wired, upstream, slices_mode, monkeypatch, guarded
):
    # given: a messages request whose chat translation is bigger (each tool result becomes a
    # message of its own, with its own framing), on a route whose only target speaks chat
    if not guarded:  # the removal: targets of the other format bounded on the client's own body
        from gateway.admission import sizing

        def client_shape_only(shape, targets, translation):
            translation("chat")  # still made (the proxy sends it), but not what the bound is taken from
            return {}, targets

        monkeypatch.setattr(sizing, "_translate", client_shape_only)
    wired.budget(amount="5")
    wired.route("gpt-via-anthropic", wired.openai)
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"} for i in range(40)]
    uses = [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {"q": 'say "x"'}} for i in range(40)]
    body = {
        "model": "gpt-via-anthropic",
        "max_tokens": 100,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ],
    }
    own = shape_messages(body).text_tokens
    translated = shape_chat(translate_request(kind="messages", body=body, headers={}).body).text_tokens
    assert translated > own  # the case the bound must follow
    # when
    r = _post(gateway, "messages", body)
    # then: the reservation covers the translated body, not the client's
    assert r.status_code == 200, r.text
    if not guarded:  # without the guard, the reservation falls short of the body that was sent
        assert int(r.headers["x-capgate-reserved-input-tokens"]) == own < translated
        return
    assert int(r.headers["x-capgate-reserved-input-tokens"]) == translated
    reserved = Decimal(r.headers["x-capgate-reserved-usd"])
    # at the most expensive input rate (the cache write, $18.75/M) plus 100 output tokens at $75/M
    assert reserved == Decimal(translated * 18_750 + 100 * 75_000) / 10**9


def test_an_image_is_bounded_by_the_translated_targets_image_rule(gateway, wired):
    # given: a chat request with an image, to an Anthropic target whose model has no image bound
    wired.budget(amount="5")
    Model.objects.filter(pk=wired.model.pk).update(max_image_tokens=None)
    wired.route("claude-via-openai", wired.anthropic)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"model": "claude-via-openai", "max_tokens": 10, "messages": [{"role": "user", "content": [image]}]}
    # when
    r = _post(gateway, "chat", body)
    # then: refused under the cap, before the provider, in OpenAI's shape
    assert r.status_code == 402, r.text
    assert r.json()["error"]["code"] == "unbounded_input_under_budget"
    assert_nothing_held()


@pytest.mark.parametrize(
    ("kind", "route_to", "field", "extra"),
    [
        ("chat", "anthropic", "logprobs", {"logprobs": True}),
        ("chat", "anthropic", "n", {"n": 2}),
        ("chat", "anthropic", "temperature", {"temperature": 1.5}),
        ("chat", "anthropic", "response_format", {"response_format": {"type": "json_object"}}),
        ("messages", "openai", "top_k", {"top_k": 5}),
        ("messages", "openai", "thinking", {"thinking": {"type": "enabled", "budget_tokens": 1024}}),
        ("messages", "openai", "tools[0].type", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    ],
)
def test_a_field_without_a_faithful_translation_is_refused_naming_it(
    gateway, wired, upstream, kind, route_to, field, extra
):
    # given: a route whose only target speaks the other format
    wired.route("other", wired.anthropic if route_to == "anthropic" else wired.openai)
    body = {"model": "other", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **extra}
    # when
    r = _post(gateway, kind, body)
    # then: 400 in the endpoint's shape, naming the field; nothing sent, nothing held
    assert r.status_code == 400, r.text
    if kind == "chat":
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("untranslatable_field", field)
    else:
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert f"'{field}'" in r.json()["error"]["message"]
    assert upstream.stats()["requests"] == 0
    assert_nothing_held()


def test_an_untranslatable_request_is_served_by_the_routes_own_format(gateway, wired, upstream):
    # given: a route with a target of the endpoint's format behind one of the other
    route = wired.route("mixed", wired.anthropic)
    route.targets.create(connection=wired.openai, model=wired.model, position=1)
    # when: a chat request with a field Anthropic has no equivalent for
    r = _post(
        gateway,
        "chat",
        {"model": "mixed", "max_tokens": 10, "logprobs": True, "messages": [{"role": "user", "content": "hi"}]},
    )
    # then: the target it cannot be translated to is left out; the OpenAI target serves it
    assert r.status_code == 200, r.text
    assert upstream.stats()["by_path"] == {"/v1/chat/completions": 1}


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_an_upstream_error_reaches_the_client_in_the_endpoints_shape(gateway, wired, upstream, kind):
    # given: a target of the other format that rejects the request
    wired.route("other", wired.anthropic if kind == "chat" else wired.openai)
    body = {"model": "other", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    # when
    r = _post(gateway, kind, body, headers={"x-upstream-fail": "400"})
    # then
    assert r.status_code == 400
    if kind == "chat":
        assert r.json()["error"]["message"] == "fake upstream 400"
    else:
        assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "fake upstream 400"}}
    wait_settled()
    assert UsageRecord.objects.get().status == "failed_upstream"


def test_a_stream_from_the_other_format_that_breaks_is_charged_and_not_closed(gateway, wired, upstream):
    # given: an Anthropic target that drops the connection mid-stream, under a cap (its events
    # spaced out, so those before the drop reach the gateway on their own)
    budget = wired.budget(amount="5")
    upstream.control(chunk_delay_ms=50)
    wired.route("claude-via-openai", wired.anthropic)
    body = {
        "model": "claude-via-openai",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    # when
    r = _post(gateway, "chat", body, headers={"x-upstream-fail": "drop_mid_stream"})
    # then: the client never sees [DONE], and the unknown outcome is charged at the worst case
    assert "[DONE]" not in r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == usd(r.headers["x-capgate-reserved-usd"])
    assert window_of(budget).spent_nano == rec.cost_nano
