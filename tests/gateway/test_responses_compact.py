"""POST /v1/responses/compact (Codex compacts a long session with it; the SDK's
`responses.compact`) through the live gateway under a blocking cap: admitted like /v1/responses,
its output reserved at the model's maximum (the endpoint takes no ceiling, so none is sent), and
settled from the usage the compaction reports."""

from __future__ import annotations

import httpx
import openai
import pytest

from ledger.models import Reservation, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = {"authorization": f"Bearer {KEY}"}
MODEL_MAX_OUTPUT = 4096  # the `wired` model's catalog maximum
HISTORY = [
    {"role": "user", "content": "Fix the failing test."},
    {"role": "assistant", "content": "I changed the assertion."},
    {"role": "user", "content": "Now run it again."},
]
# What Codex's remote compaction sends (codex-rs CompactionInput): the SDK's fields and its turn's
# tools, parallel_tool_calls, reasoning and text.
CODEX_BODY = {
    "model": "gpt-test",
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "instructions": "You are Codex.",
    "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "web_search", "external_web_access": False},
    ],
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "text": {"verbosity": "low"},
    "prompt_cache_key": "session-1",
}


def test_the_sdks_compact_is_served_and_settled_under_a_blocking_cap(gateway, wired, upstream, slices_mode):
    # given: a blocking cap and a provider reporting 300 in, 120 out
    wired.budget(amount="5")
    upstream.control(prompt_tokens=300, completion_tokens=120)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    # when
    compacted = client.responses.compact(model="gpt-test", input=HISTORY)
    # then: the SDK reads the compaction, and the record is the reported usage at $15 / $75 per 1M
    assert compacted.object == "response.compaction"
    assert compacted.output[-1].type == "compaction"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 300, 120)
    assert rec.cost_nano == 300 * 15_000 + 120 * 75_000
    # reserved at the model's whole output, since no ceiling can be sent; none was sent
    assert rec.reserved_nano >= MODEL_MAX_OUTPUT * 75_000
    assert rec.excess_nano == 0
    sent = upstream.last("/v1/responses/compact")["body"]
    assert not {"max_output_tokens", "max_completion_tokens", "max_tokens"} & set(sent)
    assert sent["input"] == HISTORY
    assert not Reservation.objects.exists()


def test_codexs_compaction_body_is_admitted_under_a_cap_as_sent(gateway, wired, upstream):
    wired.budget(amount="5")
    resp = httpx.post(gateway.url + "/v1/responses/compact", json=CODEX_BODY, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    # the compaction runs no tool: nothing is injected (no max_tool_calls, no output ceiling)
    # (the provider gets the route target's own model id)
    assert upstream.last("/v1/responses/compact")["body"] == {**CODEX_BODY, "model": "echo-1"}
    wait_settled()
    assert UsageRecord.objects.get().status == "served"


def test_a_compaction_the_cap_cannot_hold_is_a_402_before_the_provider(gateway, wired, upstream):
    # given: $0.10 left, below the model's whole output at $75 per 1M ($0.31)
    wired.budget(amount="0.10")
    resp = httpx.post(
        gateway.url + "/v1/responses/compact", json={"model": "gpt-test", "input": HISTORY}, headers=AUTH, timeout=30
    )
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "organization_budget"
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()


def test_a_compaction_from_a_response_capgate_did_not_relay_is_refused_under_a_cap(gateway, wired, upstream):
    wired.budget(amount="5")
    body = {"model": "gpt-test", "previous_response_id": "resp_elsewhere"}
    resp = httpx.post(gateway.url + "/v1/responses/compact", json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "unknown_previous_response_id"
    assert upstream.stats()["requests"] == 0


@pytest.mark.parametrize("body", [{"input": HISTORY}, {"model": "gpt-test", "input": 7}, {"model": "gpt-test"}])
def test_a_malformed_compaction_is_a_400_and_changes_nothing(gateway, wired, upstream, body):
    wired.budget(amount="5")
    resp = httpx.post(gateway.url + "/v1/responses/compact", json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()
