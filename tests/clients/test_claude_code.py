"""Claude Code (the pinned npm package) through capgate under a blocking key cap: `claude -p`
is served and recorded at the provider's usage, and an exhausted cap reaches it as capgate's 402
text, without a retry."""

from __future__ import annotations

import pytest

from ledger.models import Budget, Reservation, UsageRecord
from requestlog.models import Refusal
from tests.clients import agents
from tests.clients.conftest import COMPLETION_TOKENS, PROMPT_TOKENS, requests_seen
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

# The test model's prices: $15 in / $75 out per 1M tokens.
COST_NANO = PROMPT_TOKENS * 15_000 + COMPLETION_TOKENS * 75_000


def test_claude_code_is_served_and_recorded_under_a_blocking_key_cap(gateway, agent_tenant, upstream, tmp_path):
    # given: a $50 blocking cap on the key
    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    # when
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="claude-test")
    # then: the agent printed the upstream's answer
    assert run.returncode == 0, run.output
    result = run.json()
    assert result["is_error"] is False, result
    assert result["result"].startswith("The quick brown fox")
    # and what reached the provider is Claude Code's own request, betas and context edits included
    sent = upstream.last("/v1/messages")
    assert "claude-code" in sent["headers"]["anthropic-beta"]
    assert sent["body"]["context_management"]["edits"][0]["type"].startswith("clear_thinking")
    assert sent["headers"]["x-api-key"] == "sk-ant-up"  # the connection's key, not the client's
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert rec.cost_nano == COST_NANO
    assert rec.api_key_id == agent_tenant.key.id
    assert not Reservation.objects.exists()


def test_claude_codes_auto_mode_keeps_its_safety_classifier_under_a_blocking_cap(
    gateway, agent_tenant, upstream, tmp_path
):
    # given: a $50 blocking cap on the key
    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    # when: auto mode, which asks the provider to check its tool calls
    run = agents.claude(
        tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="claude-test", permission_mode="auto"
    )
    # then: served at the first attempt, and the provider got the safeguards and both betas
    assert run.returncode == 0, run.output
    assert run.json()["is_error"] is False, run.output
    sent = upstream.last("/v1/messages")
    assert sent["body"]["safeguards"][0]["type"] == "dangerous_tool_use"
    betas = sent["headers"]["anthropic-beta"]
    assert "afk-mode-2026-01-31" in betas and "dangerous-tool-use-2026-09-03" in betas
    assert not Refusal.objects.exists()  # no 400 it worked around
    wait_settled()
    assert {r.status for r in UsageRecord.objects.all()} == {"served"}
    assert not Reservation.objects.exists()


def test_claude_code_shows_capgates_402_and_does_not_retry(gateway, agent_tenant, upstream, tmp_path):
    # given: a key cap far below Claude Code's worst case (its 32k max_tokens alone is $2.40)
    agent_tenant.budget(amount="0.05", scope="key", api_key=agent_tenant.key)
    # when
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="claude-test")
    # then: the agent reports capgate's refusal, in capgate's words
    result = run.json()
    assert result["is_error"] is True
    assert result["api_error_status"] == 402
    assert "Refused by key budget" in result["result"], result["result"]
    # one request reached the gateway (no retry), none reached the provider, nothing is held
    assert requests_seen() == 1
    refusal = Refusal.objects.get()
    assert (refusal.http_status, refusal.code) == (402, "key_budget")
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()
    assert not UsageRecord.objects.exists()


def test_claude_codes_custom_headers_put_a_session_under_its_own_run_budget(gateway, agent_tenant, upstream, tmp_path):
    # given: the README's ANTHROPIC_CUSTOM_HEADERS naming a run and its budget
    run_headers = {"X-Capgate-Run": "fix-issue-42", "X-Capgate-Run-Budget-Usd": "10"}
    # when: two prompts of the same run
    for _ in range(2):
        run = agents.claude(
            tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="claude-test", headers=run_headers
        )
        assert run.returncode == 0 and run.json()["is_error"] is False, run.output
    # then: one lifetime run budget of $10, charged with both calls
    wait_settled()
    budget = Budget.objects.get(scope="run")
    assert (budget.run_id, budget.amount_nano, budget.period) == ("fix-issue-42", 10 * 10**9, "lifetime")
    assert list(UsageRecord.objects.values_list("run_id", flat=True)) == ["fix-issue-42"] * 2
    assert window_of(budget).spent_nano == 2 * COST_NANO


def test_a_run_whose_budget_is_spent_is_refused_and_the_agent_shows_why(gateway, agent_tenant, upstream, tmp_path):
    run_headers = {"X-Capgate-Run": "tiny-run", "X-Capgate-Run-Budget-Usd": "0.01"}
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="claude-test", headers=run_headers)
    assert run.json()["api_error_status"] == 402
    assert "Refused by run budget" in run.json()["result"]
    assert upstream.stats()["requests"] == 0
