"""The Converse translation tables (gateway/billing/translation.py) against the billing
inventory and the translators: every field an endpoint accepts has a rule for Converse, a
refused field is refused naming it, a dropped one is left out, and the translated body is a
ConverseRequest botocore's own service model accepts."""

from __future__ import annotations

import json

import pytest

from gateway import billing
from gateway.billing.translation import CHAT_TO_CONVERSE, DROPPED, FIELDS, MESSAGES_TO_CONVERSE, REFUSED
from gateway.translate import Untranslatable, translate_request
from tests.translate.test_table import BASE, DROPPED_VALUES, REFUSED_VALUES
from tests.upstream import converse as fake

DIRECTIONS = {"chat": CHAT_TO_CONVERSE, "messages": MESSAGES_TO_CONVERSE}
REFUSED_HERE = {
    "chat": {k: v for k, v in REFUSED_VALUES["chat"].items() if k != "reasoning_effort"},
    "messages": REFUSED_VALUES["messages"],
}
DROPPED_HERE = {
    "chat": {**DROPPED_VALUES["chat"], "user": "u1", "safety_identifier": "s1"},
    "messages": {"diagnostics": {}, "metadata": {"user_id": "u1"}},
}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def _converse(kind: str, body: dict, headers: dict | None = None) -> dict:
    return translate_request(kind=kind, body=body, headers=headers or {}, target="converse").body


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_every_field_the_endpoint_accepts_has_a_converse_rule(kind):
    assert set(FIELDS[DIRECTIONS[kind]]) == set(billing.FIELDS[kind])


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_every_refused_field_is_refused_naming_it(kind, settings):
    refused = {name for name, rule in FIELDS[DIRECTIONS[kind]].items() if rule.how == REFUSED}
    assert refused == set(REFUSED_HERE[kind]), "give each refused field a value to try"
    for name, value in REFUSED_HERE[kind].items():
        with pytest.raises(Untranslatable) as err:
            _converse(kind, {**BASE[kind], name: value})
        assert err.value.param == name and err.value.status == 400
        assert "Bedrock Converse" in err.value.message


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_dropped_fields_are_left_out(kind, settings):
    dropped = {name for name, rule in FIELDS[DIRECTIONS[kind]].items() if rule.how == DROPPED}
    assert dropped == set(DROPPED_HERE[kind])
    out = _converse(kind, {**BASE[kind], **DROPPED_HERE[kind]})
    assert set(out) == {"model", "messages", "inferenceConfig"}


def test_a_field_the_table_does_not_know_is_refused(settings):
    with pytest.raises(Untranslatable) as err:
        _converse("chat", {**BASE["chat"], "brand_new": 1})
    assert err.value.param == "brand_new"


def test_only_known_betas_reach_a_converse_target(settings):
    assert _converse("messages", BASE["messages"], {"anthropic-beta": "prompt-caching-2024-07-31"})
    with pytest.raises(Untranslatable) as err:
        _converse("messages", BASE["messages"], {"anthropic-beta": "context-1m-2025-08-07"})
    assert err.value.param == "anthropic-beta: context-1m"


CHAT = {
    "model": "m",
    "max_completion_tokens": 50,
    "top_p": 0.9,
    "service_tier": "flex",
    "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "user", "content": "and?"},
    ],
}
MESSAGES = {
    "model": "m",
    "max_tokens": 50,
    "temperature": 0.3,
    "service_tier": "standard_only",
    "cache_control": {"type": "ephemeral", "ttl": "1h"},
    "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
    "tool_choice": {"type": "any"},
    "messages": [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "boom"}],
                }
            ],
        },
    ],
}


@pytest.mark.parametrize(("kind", "body"), [("chat", CHAT), ("messages", MESSAGES)], ids=["chat", "messages"])
def test_the_translated_body_is_a_converse_request_botocore_accepts(kind, body, settings):
    translated = translate_request(kind=kind, body=body, headers={}, target="converse")
    out = {k: v for k, v in translated.body.items() if k not in ("model", "stream")}
    assert fake.check("meta.llama3-3-70b-instruct-v1:0", out) is None
    assert fake.check("meta.llama3-3-70b-instruct-v1:0", {**out, "max_tokens": 1}) is not None  # the check bites


def test_the_chat_mapping_in_detail(settings):
    translated = translate_request(kind="chat", body=CHAT, headers={}, target="converse")
    out = translated.body
    assert out["system"] == [{"text": "be brief"}]
    assert out["messages"][0] == {"role": "user", "content": [{"image": {"format": "jpeg", "source": {"bytes": PNG}}}]}
    assert out["messages"][1]["content"] == [{"toolUse": {"toolUseId": "c1", "name": "f", "input": {"a": 1}}}]
    # the tool result and the next user text merge into one user turn, the result first
    assert out["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "c1", "content": [{"text": "done"}]}},
        {"text": "and?"},
    ]
    assert out["toolConfig"]["tools"][0]["toolSpec"]["strict"] is True
    assert out["toolConfig"]["toolChoice"] == {"tool": {"name": "f"}}
    assert out["inferenceConfig"] == {"maxTokens": 50, "topP": 0.9}
    assert out["serviceTier"] == {"type": "flex"} and translated.shape.service_tier == "flex"
    assert out["outputConfig"]["textFormat"]["structure"]["jsonSchema"] == {"schema": '{"type": "object"}', "name": "w"}
    # the bound: one image at the model's maximum, not its base64 bytes; the output ceiling named
    assert (translated.shape.images, translated.shape.max_output) == (1, 50)
    assert PNG not in str(translated.shape)


def test_the_messages_mapping_in_detail(settings):
    translated = translate_request(kind="messages", body=MESSAGES, headers={}, target="converse")
    out = translated.body
    assert out["toolConfig"]["tools"][1] == {"cachePoint": {"type": "default"}}
    assert out["toolConfig"]["toolChoice"] == {"any": {}}
    assert out["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "boom"}], "status": "error"}},
        {"cachePoint": {"type": "default", "ttl": "1h"}},  # top-level cache_control: the end of the last turn
    ]
    assert out["serviceTier"] == {"type": "default"}
    assert translated.shape.cache_1h  # 1-hour cache writes are bounded at their own rate


def test_reasoning_effort_and_adaptive_thinking_become_converse_effort(settings):
    chat = _converse("chat", {**BASE["chat"], "reasoning_effort": "medium"})
    assert chat["outputConfig"] == {"effort": "medium"}
    adaptive = _converse("messages", {**BASE["messages"], "thinking": {"type": "adaptive"}})
    assert adaptive["outputConfig"] == {"effort": "high"}  # Anthropic's default effort
    body = {**BASE["messages"], "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body["output_config"]["format"] = {"type": "json_schema", "schema": schema}
    out = _converse("messages", body)
    assert out["outputConfig"]["effort"] == "max"
    assert json.loads(out["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"]) == schema
    assert fake.check("m.x", {k: v for k, v in out.items() if k != "model"}) is None
    for wrong, field in (
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
    ):
        with pytest.raises(Untranslatable) as err:
            _converse("messages", {**BASE["messages"], **wrong})
        assert err.value.param == field


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_a_system_message_between_turns_keeps_its_place(kind, settings):
    turns = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "now answer in French"},
        {"role": "user", "content": "b"},
    ]
    out = _converse(kind, {**BASE[kind], "messages": turns})
    assert [m["role"] for m in out["messages"]] == ["user", "system", "user"]
    assert out["messages"][1]["content"] == [{"text": "now answer in French"}]
    assert "system" not in out
    assert fake.check("m.x", {k: v for k, v in out.items() if k != "model"}) is None


def test_tool_settings_without_tools_change_nothing_and_are_left_out(settings):
    out = _converse("chat", {**BASE["chat"], "tool_choice": "none", "parallel_tool_calls": False})
    assert "toolConfig" not in out
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra, field in (
        ({"tool_choice": "none"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ):
        with pytest.raises(Untranslatable) as err:
            _converse("chat", {**BASE["chat"], "tools": tools, **extra})
        assert err.value.param == field
