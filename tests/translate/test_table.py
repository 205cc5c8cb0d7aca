"""The translation table (gateway/billing/translation.py) against the billing inventory and the
translators: every field an endpoint accepts has a rule for the other format, a refused field is
refused naming it, a dropped one is left out, and docs/billing.md prints the table."""

from __future__ import annotations

import pytest

from gateway import billing
from gateway.billing.translation import (
    CHAT_TO_MESSAGES,
    DROPPED,
    FIELDS,
    MESSAGES_TO_CHAT,
    REFUSED,
    RESPONSES_TO_MESSAGES,
)
from gateway.translate import Untranslatable, translate_request

BASE = {
    "chat": {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    "messages": {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "max_output_tokens": 10, "input": "hi"},
}
# A value for each refused field that the target has no equivalent for.
REFUSED_VALUES = {
    "chat": {
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "logit_bias": {"50256": -100},
        "logprobs": True,
        "top_logprobs": 2,
        "reasoning_effort": "high",
        "verbosity": "low",
        "prediction": {"type": "content", "content": "x"},
        "audio": {"voice": "alloy", "format": "mp3"},
        "web_search_options": {},
        "moderation": {"type": "auto"},
        "functions": [{"name": "f", "parameters": {}}],
        "function_call": "auto",
    },
    "messages": {
        "top_k": 5,
        "container": "cntr_1",
        "mcp_servers": [{"type": "url", "url": "https://example.com", "name": "x"}],
        "inference_geo": "us",
        "speed": "fast",
        "safeguards": [{"type": "dangerous_tool_use"}],
        "thread": {"type": "create"},
    },
    "responses": {
        "reasoning": {"effort": "high"},
        "top_logprobs": 2,
        "previous_response_id": "resp_1",
        "conversation": "conv_1",
        "background": True,
        "background_options": {},
        "prompt": {"id": "pmpt_1"},
        "context_management": [{"type": "compaction"}],
        "moderation": {},
        "access_programs": {},
        "image": {},
    },
}
DROPPED_VALUES = {
    "chat": {
        "metadata": {"a": "b"},
        "store": True,
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {},
    },
    "messages": {"diagnostics": {}, "cache_control": {"type": "ephemeral"}},
    "responses": {
        "stream_options": {"include_obfuscation": False},
        "max_tool_calls": 3,
        "metadata": {"a": "b"},
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {},
        "client_metadata": {"session": "s"},
    },
}
DIRECTIONS = {"chat": CHAT_TO_MESSAGES, "messages": MESSAGES_TO_CHAT, "responses": RESPONSES_TO_MESSAGES}
KINDS = ["chat", "messages", "responses"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_the_endpoint_accepts_has_a_translation_rule(kind):
    assert set(FIELDS[DIRECTIONS[kind]]) == set(billing.FIELDS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_every_refused_field_is_refused_naming_it(kind, settings):
    refused = {name for name, rule in FIELDS[DIRECTIONS[kind]].items() if rule.how == REFUSED}
    assert refused == set(REFUSED_VALUES[kind]), "give each refused field a value to try"
    for name, value in REFUSED_VALUES[kind].items():
        with pytest.raises(Untranslatable) as err:
            translate_request(kind=kind, body={**BASE[kind], name: value}, headers={})
        assert err.value.param == name and err.value.status == 400


@pytest.mark.parametrize("kind", KINDS)
def test_every_dropped_field_is_left_out(kind, settings):
    dropped = {name for name, rule in FIELDS[DIRECTIONS[kind]].items() if rule.how == DROPPED}
    assert dropped == set(DROPPED_VALUES[kind])
    out = translate_request(kind=kind, body={**BASE[kind], **DROPPED_VALUES[kind]}, headers={}).body
    assert not dropped & set(out)


def test_a_field_the_table_does_not_know_is_refused(settings):
    with pytest.raises(Untranslatable) as err:
        translate_request(kind="chat", body={**BASE["chat"], "brand_new": 1}, headers={})
    assert err.value.param == "brand_new"


def test_an_anthropic_beta_only_an_anthropic_model_acts_on_is_refused(settings):
    body = BASE["messages"]
    assert translate_request(kind="messages", body=body, headers={"anthropic-beta": "claude-code-20250219"})
    with pytest.raises(Untranslatable) as err:
        translate_request(kind="messages", body=body, headers={"anthropic-beta": "context-1m-2025-08-07"})
    assert err.value.param == "anthropic-beta: context-1m"


def test_docs_print_the_translation_table():
    text = billing.markdown()
    assert "## Translation between formats" in text
    for rules in FIELDS.values():
        for name in rules:
            assert f"| `{name}` |" in text


def test_context_edits_that_change_the_context_are_refused(settings):
    body = BASE["messages"]
    clear = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert (
        "context_management"
        not in translate_request(kind="messages", body={**body, "context_management": clear}, headers={}).body
    )
    with pytest.raises(Untranslatable) as err:
        edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
        translate_request(kind="messages", body={**body, "context_management": edits}, headers={})
    assert err.value.param == "context_management"


def test_a_tool_setting_without_an_equivalent_is_refused(settings):
    tool = {"name": "f", "input_schema": {"type": "object"}, "defer_loading": True}
    with pytest.raises(Untranslatable) as err:
        translate_request(kind="messages", body={**BASE["messages"], "tools": [tool]}, headers={})
    assert err.value.param == "tools[0].defer_loading"


def test_adaptive_thinking_and_effort_become_reasoning_effort(settings):
    body = {**BASE["messages"], "thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}
    assert translate_request(kind="messages", body=body, headers={}).body["reasoning_effort"] == "low"
    body = {**BASE["messages"], "thinking": {"type": "adaptive", "display": "omitted"}}
    assert translate_request(kind="messages", body=body, headers={}).body["reasoning_effort"] == "high"
    for field, extra in [
        ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 2048}}),
        ("output_config.effort", {"output_config": {"effort": "max"}}),
        ("output_config.format", {"output_config": {"format": {"type": "json_schema", "schema": {}}}}),
    ]:
        with pytest.raises(Untranslatable) as err:
            translate_request(kind="messages", body={**BASE["messages"], **extra}, headers={})
        assert err.value.param == field


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("chat", {"tool_choice": {"type": "function", "function": "f"}}),
        ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": 5}}]}]}),
        ("messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": 5}]}]}),
        ("messages", {"system": [{"type": "text", "text": "x"}, "y"]}),
        ("messages", {"context_management": {"edits": "all"}}),
        ("responses", {"input": [5]}),
        ("responses", {"input": [{"role": "user", "content": 5}]}),
        ("responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": [5]}]}),
        ("responses", {"tools": [5]}),
    ],
)
def test_a_malformed_part_is_a_400_not_a_crash(kind, extra, settings):
    from core.errors import CapgateError

    with pytest.raises(CapgateError) as err:
        translate_request(kind=kind, body={**BASE[kind], **extra}, headers={})
    assert err.value.status == 400
