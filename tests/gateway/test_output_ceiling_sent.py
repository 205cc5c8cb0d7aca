"""The output ceiling a request is reserved for is the one its provider reads. Whatever ceiling
parameters the caller sends (max_tokens, max_completion_tokens, both, neither), the body that
leaves capgate carries the reserved ceiling alone, in the parameter the connection's provider
takes. Each chat connection kind is checked against the fake upstream reading only that
parameter and billing every token it allows (and its own default of 8,000 when the parameter is
absent); a burst on a $0.05 key cap shows the recorded spend stays within the cap. Slices on and
off. The Responses API's and the translated formats' ceilings are in
tests/gateway/test_output_ceiling_formats.py."""

from __future__ import annotations

import json

import httpx
import pytest

from catalog.models import Connection
from catalog.presets import PRESETS
from core.money import usd_str
from gateway.providers.base import OUTPUT_CEILINGS
from ledger.models import UsageRecord
from tests.concurrency import race
from tests.conftest import usd, window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.vertex import new_service_account

pytestmark = pytest.mark.django_db(transaction=True)

CAP = "0.05"
SERVER_DEFAULT = 8000  # what a server reading only its own parameter gives a body without it
CHAT = "/v1/chat/completions"
VERTEX_CHAT = "/v1/projects/capgate-test/locations/us-east5/endpoints/openapi/chat/completions"


def _kinds() -> list[tuple[str, str, str, dict, str, str]]:
    """(id, kind, base URL under the fake, options, the parameter the provider reads, the path it is called at)."""
    presets = [(kind, kind, "/v1", {}, preset.max_tokens_param, CHAT) for kind, preset in PRESETS.items()]
    azure = {"api_version": "2024-10-21", "deployments": {"echo-1": "prod-4o"}}
    vertex = {"project": "capgate-test", "region": "us-east5"}
    return presets + [
        ("openai", "openai", "/v1", {}, "max_completion_tokens", CHAT),
        # a server speaking OpenAI's format that knows only max_tokens, as the connection says
        ("openai-max_tokens", "openai", "/v1", {"max_tokens_param": "max_tokens"}, "max_tokens", CHAT),
        ("azure_openai", "azure_openai", "", azure, "max_completion_tokens", "/openai/deployments/prod-4o" + CHAT[3:]),
        ("gemini", "gemini", "/v1beta/openai/", {}, "max_completion_tokens", "/v1beta/openai" + CHAT[3:]),
        ("vertex", "vertex", "", vertex, "max_tokens", VERTEX_CHAT),
    ]


KINDS = _kinds()
# The caller's ceiling parameters, and the ceiling reserved for them (None: capgate chose one).
# With both, max_completion_tokens is the ceiling (OpenAI's: max_tokens is its deprecated name).
CALLERS = {
    "max_tokens": ({"max_tokens": 300}, 300),
    "max_completion_tokens": ({"max_completion_tokens": 300}, 300),
    "both": ({"max_completion_tokens": 1, "max_tokens": SERVER_DEFAULT}, 1),
    "neither": ({}, None),
}


def _connect(wired, upstream, kind: str, base: str, options: dict) -> Connection:
    secret = json.dumps(new_service_account(upstream.url + "/token", project="capgate-test"))
    conn = Connection.objects.create(
        organization=wired.org,
        name=f"c-{kind}",
        kind=kind,
        base_url=upstream.url + base,
        secret=secret if kind == "vertex" else "sk-up",
        options={**options, "forward_test_headers": True},
    )
    wired.route("ceil", conn)
    return conn


def _headers(param: str) -> dict[str, str]:
    """The fake bills every output token the one parameter `param` allows."""
    return {
        "Authorization": f"Bearer {KEY}",
        "X-Upstream-completion_tokens": "max",
        "X-Upstream-ceiling_param": param,
        "X-Upstream-default_max_tokens": str(SERVER_DEFAULT),
    }


def _ask(gateway, param: str, ceilings: dict) -> httpx.Response:
    body = {"model": "ceil", "messages": [{"role": "user", "content": "hi"}], **ceilings}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=_headers(param), timeout=30)


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(
    ("kind", "base", "options", "param", "path"), [k[1:] for k in KINDS], ids=[k[0] for k in KINDS]
)
def test_the_provider_reads_the_reserved_ceiling_in_its_own_parameter(
    gateway, wired, upstream, slices_mode, caller, kind, base, options, param, path
):
    # given a $0.05 key cap, and a connection whose provider reads only `param`
    budget = wired.budget(amount=CAP, scope="key", api_key=wired.key)
    _connect(wired, upstream, kind, base, options)
    ceilings, reserved = CALLERS[caller]

    # when the caller names its ceiling in any parameter, or in none
    resp = _ask(gateway, param, ceilings)

    # then the provider got the reserved ceiling alone, in its own parameter
    assert resp.status_code == 200, resp.text
    seen = upstream.last(path)["body"]
    sent = {name: seen[name] for name in OUTPUT_CEILINGS if name in seen}
    assert list(sent) == [param], sent
    if reserved is not None:
        assert sent[param] == reserved
    # and billed no more output than that ceiling, which the reservation covered
    wait_settled()
    record = UsageRecord.objects.get()
    assert record.output_tokens == sent[param]
    assert record.excess_nano == 0 and record.cost_nano <= record.reserved_nano
    assert window_of(budget).spent_nano <= usd(CAP)


BURST = 100


@pytest.mark.parametrize(
    "ceilings",
    [{"max_completion_tokens": 1, "max_tokens": SERVER_DEFAULT}, {"max_completion_tokens": 1}],
    ids=["both", "max_completion_tokens-alone"],
)
def test_a_burst_on_a_key_cap_with_a_ceiling_the_server_ignores_spends_within_the_cap(
    gateway, wired, upstream, slices_mode, ceilings
):
    # given a $0.05 key cap and a Mistral connection (its server reads only max_tokens)
    budget = wired.budget(amount=CAP, scope="key", api_key=wired.key)
    _connect(wired, upstream, "mistral", "/v1", {})

    # when 100 requests reserved for 1 output token arrive together
    responses = race(BURST, lambda _: _ask(gateway, "max_tokens", ceilings))

    # then every one is served within its reservation or refused, and the cap holds
    wait_settled(timeout=60)
    assert {r.status_code for r in responses} <= {200, 402}, {r.status_code for r in responses}
    records = list(UsageRecord.objects.filter(status="served"))
    assert len(records) == sum(r.status_code == 200 for r in responses) > 0
    spent = window_of(budget).spent_nano
    assert spent == sum(r.cost_nano for r in records)
    assert spent <= usd(CAP), f"recorded {usd_str(spent)} on a {CAP} cap"
    assert all(r.output_tokens == 1 and r.excess_nano == 0 for r in records)
