"""Codex CLI (the pinned npm package) through capgate under a blocking key cap: `codex exec` is
served over the Responses API and recorded at the provider's usage, hosted web search included,
and an exhausted cap reaches it as capgate's 402 text, without a retry."""

from __future__ import annotations

import json

import pytest

from gateway.http import errors
from ledger.models import Budget, Reservation, UsageRecord
from requestlog.models import Refusal
from tests.clients import agents
from tests.clients.conftest import COMPLETION_TOKENS, PROMPT_TOKENS, requests_seen
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)


def _events(run: agents.Run) -> list[dict]:
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def test_codex_is_served_and_recorded_under_a_blocking_key_cap(gateway, agent_tenant, upstream, tmp_path):
    # given: a $50 blocking cap on the key
    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    # when
    run = agents.codex(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="gpt-test")
    # then: the turn completed with the upstream's answer
    assert run.returncode == 0, run.output
    events = _events(run)
    messages = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert messages and messages[-1].startswith("The quick brown fox"), run.output
    assert any(e["type"] == "turn.completed" for e in events)
    # and what reached the provider is Codex's own request, with the search uses bounded
    sent = upstream.last("/v1/responses")["body"]
    assert "client_metadata" in sent and sent["store"] is False
    assert {t["type"] for t in sent["tools"]} >= {"function", "namespace", "web_search"}
    searches = sent["max_tool_calls"]  # injected: the fake provider searches every allowed time
    wait_settled()
    rec = UsageRecord.objects.get()
    # each search is one more pass over the context, like the provider bills it
    input_tokens = PROMPT_TOKENS * (searches + 1)
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", input_tokens, COMPLETION_TOKENS)
    assert rec.cost_nano == input_tokens * 15_000 + COMPLETION_TOKENS * 75_000 + searches * 10_000_000
    assert rec.api_key_id == agent_tenant.key.id
    assert not Reservation.objects.exists()


def _refused_turn(gateway, agent_tenant, tmp_path, **kw) -> tuple[list[dict], int]:
    """Codex's failed turns and the requests it sent, its cap far below one turn's worst case."""
    agent_tenant.budget(amount="0.05", scope="key", api_key=agent_tenant.key)
    run = agents.codex(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="gpt-test", **kw)
    assert run.returncode != 0
    return [e for e in _events(run) if e["type"] == "turn.failed"], requests_seen()


@pytest.mark.parametrize("stream_retries", [True, False], ids=["default-retries", "no-stream-retries"])
def test_codex_shows_capgates_refusal_and_does_not_retry(gateway, agent_tenant, upstream, tmp_path, stream_retries):
    # given: a key cap far below one Codex turn's worst case; Codex's retry settings as it ships
    # them (five reconnects) or with stream_max_retries = 0
    failed, seen = _refused_turn(gateway, agent_tenant, tmp_path, stream_retries=stream_retries)
    # then: the turn failed with capgate's refusal, in capgate's words
    assert failed and failed[0]["error"]["message"].startswith("Refused by key budget"), failed
    # one request reached the gateway (no retry), none reached the provider, nothing is held
    assert seen == 1
    assert Refusal.objects.get().code == "key_budget"
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()


def test_refused_with_a_402_codex_repeats_the_refusal(gateway, agent_tenant, tmp_path, monkeypatch):
    """Guard removal: answered with a 402 (x-should-retry: false, which it does not read), Codex
    reconnects five times, ~8 s, before it shows the refusal."""
    monkeypatch.setattr(errors.GUARDS, "refuse_in_stream", False)
    failed, seen = _refused_turn(gateway, agent_tenant, tmp_path)
    assert seen == 6
    assert failed and "402" in failed[0]["error"]["message"]


def test_codex_env_http_headers_put_a_session_under_its_own_run_budget(gateway, agent_tenant, upstream, tmp_path):
    # given: the README's provider block reading the run headers from the environment
    env_headers = {"X-Capgate-Run": "CAPGATE_RUN", "X-Capgate-Run-Budget-Usd": "CAPGATE_RUN_BUDGET_USD"}
    env = {"CAPGATE_RUN": "codex-task-7", "CAPGATE_RUN_BUDGET_USD": "10"}
    # when
    run = agents.codex(
        tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="gpt-test", env=env, env_headers=env_headers
    )
    # then: the turn is charged to a lifetime run budget of $10
    assert run.returncode == 0, run.output
    wait_settled()
    budget = Budget.objects.get(scope="run")
    assert (budget.run_id, budget.amount_nano) == ("codex-task-7", 10 * 10**9)
    rec = UsageRecord.objects.get()
    assert rec.run_id == "codex-task-7"
    assert window_of(budget).spent_nano == rec.cost_nano > 0
