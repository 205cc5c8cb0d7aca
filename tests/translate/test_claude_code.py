"""Claude Code (the pinned npm package, tests/clients/) pointed at a route whose target speaks
OpenAI's format: `claude -p` is answered and billed at the OpenAI target's usage."""

from __future__ import annotations

import pytest

from ledger.models import Reservation, UsageRecord
from tests.clients import agents
from tests.clients.conftest import COMPLETION_TOKENS, PROMPT_TOKENS, agent_tenant  # noqa: F401
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)


def test_claude_code_is_served_by_an_openai_target(gateway, agent_tenant, upstream, tmp_path):  # noqa: F811
    # given: a blocking key cap and a route whose only target is an OpenAI connection
    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    agent_tenant.route("gpt-for-claude", agent_tenant.openai)
    # when
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="gpt-for-claude")
    # then: the agent printed the OpenAI target's answer
    assert run.returncode == 0, run.output
    result = run.json()
    assert result["is_error"] is False, result
    assert result["result"].startswith("The quick brown fox")
    # and the provider got a chat completion with Claude Code's system prompt and tools
    sent = upstream.last("/v1/chat/completions")
    assert sent["headers"]["authorization"] == "Bearer sk-up"
    body = sent["body"]
    assert body["messages"][0]["role"] == "system" and body["stream"] is True
    assert body["tools"] and all(t["type"] == "function" for t in body["tools"])
    # its adaptive thinking at effort high, as the target's reasoning effort
    assert body["reasoning_effort"] == "high"
    wait_settled()
    rec = UsageRecord.objects.filter(connection_id=agent_tenant.openai.id).latest("id")
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert rec.cost_nano == PROMPT_TOKENS * 15_000 + COMPLETION_TOKENS * 75_000
    assert not Reservation.objects.exists()


def test_claude_code_is_served_by_a_bedrock_converse_target(gateway, agent_tenant, upstream, tmp_path):  # noqa: F811
    # given: a blocking key cap and a route whose only target is a Bedrock connection on Converse
    from tests.translate.test_converse import STREAM, _converse_connection

    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    converse = _converse_connection(agent_tenant, upstream.url)
    agent_tenant.route("llama-for-claude", converse)
    # when
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="llama-for-claude")
    # then: the agent printed the Converse target's answer
    assert run.returncode == 0, run.output
    result = run.json()
    assert result["is_error"] is False, result
    assert result["result"].startswith("The quick brown fox")
    # and the provider got a Converse stream request with Claude Code's system prompt, its tools,
    # and its adaptive thinking at effort high
    body = upstream.last(STREAM)["body"]
    assert body["system"] and body["toolConfig"]["tools"]
    assert all("toolSpec" in t or "cachePoint" in t for t in body["toolConfig"]["tools"])
    assert body["outputConfig"]["effort"] == "high"
    wait_settled()
    rec = UsageRecord.objects.filter(connection_id=converse.id).latest("id")
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert rec.cost_nano == PROMPT_TOKENS * 15_000 + COMPLETION_TOKENS * 75_000
    assert not Reservation.objects.exists()


def test_claude_code_is_served_by_native_gemini(gateway, agent_tenant, upstream, tmp_path):  # noqa: F811
    # given: a blocking key cap and a route whose only target speaks Gemini's generateContent
    from catalog.models import Connection

    agent_tenant.budget(amount="50", scope="key", api_key=agent_tenant.key)
    native = Connection.objects.create(
        organization=agent_tenant.org,
        name="gemini-native",
        kind="gemini",
        base_url=upstream.url,
        secret="gemini-key",
        options={"api": "native", "forward_test_headers": True},
    )
    agent_tenant.route("gemini-for-claude", native)
    # when
    run = agents.claude(tmp_path, "Say hello", base_url=gateway.url, key=KEY, model="gemini-for-claude")
    # then: the agent printed Gemini's answer
    assert run.returncode == 0, run.output
    result = run.json()
    assert result["is_error"] is False, result
    assert result["result"].startswith("The quick brown fox")
    # and Gemini got a streamed generateContent with Claude Code's system prompt and tools
    sent = upstream.last(f"/v1beta/models/{agent_tenant.model.name}:streamGenerateContent")
    assert sent["headers"]["x-goog-api-key"] == "gemini-key" and sent["query"] == {"alt": "sse"}
    body = sent["body"]
    assert body["systemInstruction"]["parts"][0]["text"]
    assert body["tools"][0]["functionDeclarations"]
    assert body["generationConfig"]["maxOutputTokens"] > 0
    wait_settled()
    rec = UsageRecord.objects.filter(connection_id=native.id).latest("id")
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert rec.cost_nano == PROMPT_TOKENS * 15_000 + COMPLETION_TOKENS * 75_000
    assert not Reservation.objects.exists()
