"""Claude Code's auto mode and Anthropic's message threads through the live gateway under a
blocking cap: the safety classifier's field and betas reach the provider (they are free), a
thread's `continue` is admitted with the context the provider adds from what capgate relayed,
and what cannot be bounded is a visible 402 naming it."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic import beta_tool

from ledger.models import Reservation, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = {"authorization": f"Bearer {KEY}"}
# What `claude -p --permission-mode auto` adds to its own betas and body (.clients' Claude Code).
AUTO_MODE_BETAS = "claude-code-20250219,afk-mode-2026-01-31,dangerous-tool-use-2026-09-03"
SAFEGUARDS = [{"type": "dangerous_tool_use", "classifier_context": {"permission_mode": "auto", "v": 1}}]
THREADS_BETA = "message-threads-2026-08-12"


def _messages(gateway, body: dict, headers: dict) -> httpx.Response:
    full = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(gateway.url + "/v1/messages", json=full, headers={**AUTH, **headers}, timeout=30)


def test_auto_modes_safeguards_and_betas_reach_the_provider_under_a_blocking_cap(gateway, wired, upstream, slices_mode):
    # given: a blocking cap
    wired.budget(amount="5")
    # when: auto mode's request
    resp = _messages(gateway, {"safeguards": SAFEGUARDS}, {"anthropic-beta": AUTO_MODE_BETAS})
    # then: served, and the provider saw the classifier's field and both betas
    assert resp.status_code == 200, resp.text
    sent = upstream.last("/v1/messages")
    assert sent["body"]["safeguards"] == SAFEGUARDS
    assert {"afk-mode-2026-01-31", "dangerous-tool-use-2026-09-03"} <= set(sent["headers"]["anthropic-beta"].split(","))
    wait_settled()
    assert UsageRecord.objects.get().status == "served"
    assert not Reservation.objects.exists()


def test_a_refused_beta_is_a_402_naming_the_beta_and_what_to_do(gateway, wired, upstream):
    wired.budget(amount="5")
    resp = _messages(gateway, {}, {"anthropic-beta": "claude-code-20250219,server-side-fallback-2026-07-01"})
    assert resp.status_code == 402
    message = resp.json()["error"]["message"]
    assert "'server-side-fallback-2026-07-01'" in message and "claude-code" not in message
    assert "without it" in message
    assert upstream.stats()["requests"] == 0


def _run_tool_loop(gateway, turns: int) -> list:
    @beta_tool
    def lookup(city: str, units: str) -> str:  # the fake provider calls it with these arguments
        """Look up the weather."""
        return f"{city}: 21 degrees {units}"

    client = anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)
    runner = client.beta.messages.tool_runner(
        model="claude-test",
        max_tokens=2000,
        messages=[{"role": "user", "content": "Find the answer."}],
        tools=[lookup],
        max_iterations=turns,
    )
    return list(runner)


def test_the_sdks_tool_runner_runs_a_threaded_loop_under_a_cap_within_each_worst_case(
    gateway, wired, upstream, slices_mode
):
    # given: a blocking cap, a provider that calls the tool on every turn and writes its whole
    # output ceiling, so each continue adds a large earlier context the request body does not show
    wired.budget(amount="5")
    upstream.control(tool_call=True, prompt_tokens=5, completion_tokens="max")
    # when: the real SDK's tool runner, which threads its requests
    replies = _run_tool_loop(gateway, turns=3)
    # then: three turns, each served; the second and third continue the thread from the one before
    assert len(replies) == 3
    wait_settled()
    records = list(UsageRecord.objects.order_by("admitted_at", "id"))
    assert [r.status for r in records] == ["served"] * 3
    assert records[2].input_tokens > records[1].input_tokens > 2000  # the kept context was billed
    # every turn was billed within the worst case admitted for it
    assert [r.excess_nano for r in records] == [0, 0, 0]
    assert all(r.cost_nano <= r.reserved_nano for r in records)
    sent = upstream.last("/v1/messages")
    assert sent["body"]["thread"] == {"type": "continue", "previous_message_id": replies[1].id}
    assert THREADS_BETA in sent["headers"]["anthropic-beta"]
    assert not Reservation.objects.exists()


def test_without_the_kept_context_a_continue_would_be_billed_above_its_worst_case(
    gateway, wired, upstream, monkeypatch
):
    # The guard's removal: a continue bounded by its body alone (no earlier context added).
    from gateway.upstream import continuations

    monkeypatch.setattr(continuations, "context_tokens", lambda **kw: 0)
    wired.budget(amount="5")
    upstream.control(tool_call=True, prompt_tokens=5, completion_tokens="max")
    _run_tool_loop(gateway, turns=2)
    wait_settled()
    assert UsageRecord.objects.order_by("admitted_at", "id").last().excess_nano > 0


def test_a_continue_from_a_message_capgate_did_not_relay_is_a_402_under_a_cap(gateway, wired, upstream):
    thread = {"type": "continue", "previous_message_id": "msg_elsewhere"}
    # under alert budgets only it is passed on (the provider decides)
    wired.budget(amount="5", mode="alert")
    passed = _messages(gateway, {"thread": thread}, {"anthropic-beta": THREADS_BETA})
    assert passed.status_code == 404  # the fake provider does not know it either
    assert upstream.stats()["requests"] == 1
    # under a blocking cap it is refused before the provider, saying what to do
    wired.budget(amount="5")
    resp = _messages(gateway, {"thread": thread}, {"anthropic-beta": THREADS_BETA})
    assert resp.status_code == 402
    error = resp.json()["error"]
    assert "msg_elsewhere" in error["message"] and "create" in error["message"]
    assert "unknown_previous_message_id" in resp.text
    assert upstream.stats()["requests"] == 1


@pytest.mark.parametrize(
    "thread", [{"type": "continue"}, {"type": "fork"}, {"type": "continue", "previous_message_id": 7}, []]
)
def test_a_malformed_thread_is_a_400_and_changes_nothing(gateway, wired, upstream, thread):
    wired.budget(amount="5")
    resp = _messages(gateway, {"thread": thread}, {"anthropic-beta": THREADS_BETA})
    assert resp.status_code == 400
    assert "thread" in resp.json()["error"]["message"]
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()


def test_a_streamed_threaded_message_can_be_continued_under_a_cap(gateway, wired, upstream):
    # given: a thread created by a streamed request (its id and usage come from the events)
    wired.budget(amount="5")
    upstream.control(prompt_tokens=5, completion_tokens=10)
    headers = {"anthropic-beta": THREADS_BETA}
    with httpx.stream(
        "POST",
        gateway.url + "/v1/messages",
        json={
            "model": "claude-test",
            "max_tokens": 10,
            "stream": True,
            "thread": {"type": "create"},
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={**AUTH, **headers},
        timeout=30,
    ) as created:
        assert created.status_code == 200
        lines = [line for line in created.iter_lines() if line.startswith("data: ") and "message_start" in line]
    message_id = httpx.Response(200, content=lines[0].removeprefix("data: ")).json()["message"]["id"]
    # when: the next turn continues it
    thread = {"type": "continue", "previous_message_id": message_id}
    resp = _messages(gateway, {"thread": thread, "messages": []}, headers)
    # then: admitted with the kept context (5 in + 10 out), not refused as unknown
    assert resp.status_code == 200, resp.text
    assert int(resp.headers["x-capgate-reserved-input-tokens"]) >= 15
    wait_settled()
    assert UsageRecord.objects.order_by("admitted_at", "id").last().input_tokens == 5 + 15
