"""The official SDKs, with retries on (max_retries=3), send a request capgate refuses exactly once:
every final refusal carries `x-should-retry: false`, which the OpenAI and Anthropic SDKs obey before
they look at the status. A 402 they would not retry anyway; a 409 (run_budget_conflict) they
would, three more times, without the header."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from openai.types.responses import ResponseFailedEvent

from gateway.http import errors
from ledger.models import Reservation
from requestlog.models import Refusal
from tests.clients.conftest import requests_seen
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)

MSG = [{"role": "user", "content": "hi"}]


def _openai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=3, timeout=30)


def _anthropic(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=3, timeout=30)


def _consume(result) -> None:
    """Read a stream to its end (a non-streamed call has nothing more to read)."""
    if isinstance(result, openai.Stream | anthropic.Stream):
        for _ in result:
            pass


CALLS = {
    "chat": lambda gw, **kw: _openai(gw).chat.completions.create(model="gpt-test", messages=MSG, **kw),
    "chat-stream": lambda gw, **kw: _openai(gw).chat.completions.create(
        model="gpt-test", messages=MSG, stream=True, **kw
    ),
    "responses": lambda gw, **kw: _openai(gw).responses.create(model="gpt-test", input="hi", **kw),
    "responses-stream": lambda gw, **kw: _openai(gw).responses.create(model="gpt-test", input="hi", stream=True, **kw),
    "messages": lambda gw, **kw: _anthropic(gw).messages.create(
        model="claude-test", max_tokens=1000, messages=MSG, **kw
    ),
    "messages-stream": lambda gw, **kw: _anthropic(gw).messages.create(
        model="claude-test", max_tokens=1000, messages=MSG, stream=True, **kw
    ),
}
ERRORS = (openai.APIStatusError, anthropic.APIStatusError)


def _refused(gateway, case: str, **kw) -> int:
    """The status the SDK raised for a refused call."""
    with pytest.raises(ERRORS) as raised:
        _consume(CALLS[case](gateway, **kw))
    return raised.value.status_code


@pytest.mark.parametrize("case", list(CALLS))
def test_an_sdk_sends_a_call_refused_by_a_budget_once(gateway, agent_tenant, upstream, case):
    # given: a key cap far below the call's worst case
    agent_tenant.budget(amount="0.0001", scope="key", api_key=agent_tenant.key)
    # when / then: the SDK raises the 402 after one request, none reached the provider
    assert _refused(gateway, case) == 402
    assert requests_seen() == 1
    assert Refusal.objects.get().code == "key_budget"
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()


def _conflicting_run(gateway, case: str) -> int:
    """A run created at $10 by one call, then called with $20: the requests the SDK sent for the
    conflicting call."""
    headers = {"X-Capgate-Run": f"run-{case}", "X-Capgate-Run-Budget-Usd": "10"}
    _consume(CALLS[case](gateway, extra_headers=headers))
    before = requests_seen()
    assert _refused(gateway, case, extra_headers={**headers, "X-Capgate-Run-Budget-Usd": "20"}) == 409
    return requests_seen() - before


@pytest.mark.parametrize("case", ["chat", "messages-stream"])
def test_an_sdk_sends_a_run_budget_conflict_once(gateway, agent_tenant, case):
    assert _conflicting_run(gateway, case) == 1


def test_without_the_header_an_sdk_repeats_a_run_budget_conflict(gateway, agent_tenant, monkeypatch):
    """Guard removal: the SDKs retry a 409 (a lock timeout, to them) unless told not to."""
    monkeypatch.setattr(errors.GUARDS, "should_retry_header", False)
    assert _conflicting_run(gateway, "chat") == 4


def _sse(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.parametrize(
    ("accept", "stream", "expected"),
    [
        ("text/event-stream", True, 200),  # Codex CLI's request
        ("application/json", True, 402),  # the SDKs'
        ("text/event-stream, application/json", True, 402),
        ("*/*", True, 402),
        ("text/event-stream", False, 402),  # not a stream: a JSON answer
    ],
)
def test_a_responses_stream_that_reads_only_events_is_refused_in_the_stream(
    gateway, agent_tenant, upstream, accept, stream, expected
):
    # given: a key cap far below the call's worst case
    agent_tenant.budget(amount="0.0001", scope="key", api_key=agent_tenant.key)
    # when
    resp = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "gpt-test", "input": "hi", "stream": stream},
        headers={"Authorization": f"Bearer {KEY}", "Accept": accept},
        timeout=30,
    )
    # then: refused either way, with the same headers; nothing reached the provider or is held
    assert resp.status_code == expected
    assert resp.headers["x-should-retry"] == "false"
    assert resp.headers["x-capgate-budget-code"] == "key_budget"
    assert requests_seen() == 1
    refusal = Refusal.objects.get()
    assert (refusal.code, refusal.http_status) == ("key_budget", 402)  # the request log keeps the 402
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()
    if expected == 402:
        assert resp.json()["error"]["code"] == "key_budget"
        return
    # the refusal is the stream's own failure, in the Responses API's shape, with capgate's words
    assert resp.headers["content-type"] == "text/event-stream"
    (created_name, created), (failed_name, failed) = _sse(resp.text)
    assert (created_name, failed_name) == ("response.created", "response.failed")
    assert created["response"]["status"] == "in_progress"
    assert failed["response"]["id"] == created["response"]["id"] == "resp_" + resp.headers["x-capgate-request-id"][4:]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "invalid_prompt"  # what Codex reads as final
    assert failed["response"]["error"]["message"].startswith("Refused by key budget: the request's worst case")
    # and openai's own types read it
    assert ResponseFailedEvent.model_validate(failed).response.error.code == "invalid_prompt"


def test_a_run_budget_conflict_in_a_responses_stream_is_refused_in_the_stream(gateway, agent_tenant):
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "text/event-stream", "X-Capgate-Run": "r"}
    body = {"model": "gpt-test", "input": "hi", "stream": True}
    url = gateway.url + "/v1/responses"
    assert httpx.post(url, json=body, headers={**headers, "X-Capgate-Run-Budget-Usd": "10"}, timeout=30).is_success
    resp = httpx.post(url, json=body, headers={**headers, "X-Capgate-Run-Budget-Usd": "20"}, timeout=30)
    assert resp.status_code == 200
    (_, failed) = _sse(resp.text)[-1]
    assert failed["response"]["error"]["code"] == "invalid_prompt"
    assert failed["response"]["error"]["message"].startswith("Run 'r' already has a budget of $10.00")
