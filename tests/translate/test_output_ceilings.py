"""The output ceiling reserved is the one each format's provider reads, wherever the request is
translated: chat served by Anthropic's Messages, Gemini's generateContent and Bedrock's Converse,
Messages served by an OpenAI-compatible server that knows only max_tokens, the Responses API
served by OpenAI and by Anthropic. Whatever ceiling parameters the caller sends, the body the
provider receives carries the reserved ceiling once, in that provider's own parameter, and the fake
(reading only that parameter, billing every token it allows and 8,000 when it is absent) records
no output past it on a $0.05 key cap. Slices on and off. The chat connection kinds are in
tests/gateway/test_output_ceiling_sent.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from catalog.models import Connection
from gateway.providers.base import OUTPUT_CEILINGS
from ledger.models import UsageRecord
from tests.conftest import usd, window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.bedrock import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.django_db(transaction=True)

CAP = "0.05"
SERVER_DEFAULT = 8000
CONVERSE_ID = "meta.llama3-3-70b-instruct-v1:0"
ENDPOINTS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
# Where each provider reads its ceiling (a nested one as "config.name").
READS = {
    "anthropic": "max_tokens",
    "gemini-native": "generationConfig.maxOutputTokens",
    "converse": "inferenceConfig.maxTokens",
    "mistral": "max_tokens",
    "openai": "max_output_tokens",
}
SEEN_AT = {
    "anthropic": "/v1/messages",
    "gemini-native": "/v1beta/models/echo-1:generateContent",
    "converse": f"/model/{CONVERSE_ID}/converse",
    "mistral": "/v1/chat/completions",
    "openai": "/v1/responses",
}


def _connection(wired, upstream, provider: str) -> Connection:
    test = {"forward_test_headers": True}
    if provider == "anthropic":
        assert wired.anthropic is not None
        return wired.anthropic
    if provider == "openai":
        assert wired.openai is not None
        return wired.openai
    kind, base, secret, options = {
        "gemini-native": ("gemini", "", "gemini-key", {"api": "native"}),
        "converse": (
            "bedrock",
            "",
            json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}),
            {"region": "us-east-1", "api": "converse", "model_ids": {"echo-1": CONVERSE_ID}},
        ),
        "mistral": ("mistral", "/v1", "sk-mi", {}),
    }[provider]
    return Connection.objects.create(
        organization=wired.org,
        name=provider,
        kind=kind,
        base_url=upstream.url + base,
        secret=secret,
        options={**options, **test},
    )


def _ceilings(body: dict[str, Any]) -> dict[str, Any]:
    """Every output ceiling in a provider's body, top-level or in its config."""
    found = {k: body[k] for k in (*OUTPUT_CEILINGS, "maxOutputTokens", "maxTokens") if k in body}
    for config, name in (("generationConfig", "maxOutputTokens"), ("inferenceConfig", "maxTokens")):
        if name in (body.get(config) or {}):
            found[f"{config}.{name}"] = body[config][name]
    return found


BOTH = {"max_completion_tokens": 1, "max_tokens": SERVER_DEFAULT}
# (endpoint, provider, the caller's ceilings, the ceiling reserved; None: capgate chose it)
CASES = [
    *[
        case
        for provider in ("anthropic", "gemini-native", "converse")
        for case in (
            ("chat", provider, {"max_tokens": 300}, 300),
            ("chat", provider, {"max_completion_tokens": 300}, 300),
            ("chat", provider, BOTH, 1),
            ("chat", provider, {}, None),
        )
    ],
    *[("messages", provider, {"max_tokens": 300}, 300) for provider in ("mistral", "gemini-native", "converse")],
    ("messages", "mistral", {}, None),
    ("responses", "openai", {"max_output_tokens": 300}, 300),
    ("responses", "openai", {}, None),
    ("responses", "anthropic", {"max_output_tokens": 300}, 300),
    ("responses", "anthropic", {}, None),
]


def _body(endpoint: str, ceilings: dict) -> dict:
    if endpoint == "responses":
        return {"model": "ceil", "input": "hi", **ceilings}
    return {"model": "ceil", "messages": [{"role": "user", "content": "hi"}], **ceilings}


@pytest.mark.parametrize(
    ("endpoint", "provider", "ceilings", "reserved"),
    CASES,
    ids=[f"{e}-to-{p}-{'+'.join(c) or 'none'}" for e, p, c, _ in CASES],
)
def test_each_format_carries_the_reserved_ceiling_in_its_own_parameter(
    gateway, wired, upstream, slices_mode, endpoint, provider, ceilings, reserved
):
    # given a $0.05 key cap and a route to a provider reading only its own ceiling parameter
    budget = wired.budget(amount=CAP, scope="key", api_key=wired.key)
    wired.route("ceil", _connection(wired, upstream, provider))
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-Upstream-completion_tokens": "max",
        # (Gemini's and Converse's fakes read only their config's ceiling in any case)
        "X-Upstream-ceiling_param": "" if "." in READS[provider] else READS[provider],
        "X-Upstream-default_max_tokens": str(SERVER_DEFAULT),
    }

    # when the caller names its ceiling in any parameter its endpoint takes, or in none
    resp = httpx.post(gateway.url + ENDPOINTS[endpoint], json=_body(endpoint, ceilings), headers=headers, timeout=30)

    # then the provider got one ceiling, the reserved one, where it reads it
    assert resp.status_code == 200, resp.text
    sent = _ceilings(upstream.last(SEEN_AT[provider])["body"])
    assert list(sent) == [READS[provider]], sent
    if reserved is not None:
        assert sent[READS[provider]] == reserved
    # and the output billed is that ceiling, within the reservation and the cap
    wait_settled()
    record = UsageRecord.objects.get()
    assert record.output_tokens == sent[READS[provider]]
    assert record.excess_nano == 0 and record.cost_nano <= record.reserved_nano
    assert window_of(budget).spent_nano <= usd(CAP)
