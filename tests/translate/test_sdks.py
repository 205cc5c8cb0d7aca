"""The official SDKs served by a target of the other format: the OpenAI SDK by an Anthropic
target and the Anthropic SDK by an OpenAI target, streamed and not, with tools and images. The
fake upstream speaks each provider's real format; what it received is checked too."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from ledger.models import UsageRecord
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.server import TOOL_ARGUMENTS

pytestmark = pytest.mark.django_db(transaction=True)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}}},
}
COST = 1000 * 15_000 + 200 * 75_000  # 1000 in at $15/M, 200 out at $75/M


def _openai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def _anthropic(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def _chat_request() -> dict:
    return {
        "model": "claude-via-openai",
        "max_tokens": 300,
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather where this photo was taken?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
        ],
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
        "stop": "END",
    }


def _recorded(connection) -> UsageRecord:
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id, rec.input_tokens, rec.output_tokens) == ("served", connection.id, 1000, 200)
    assert rec.cost_nano == COST
    return rec


def test_openai_sdk_is_served_by_an_anthropic_target(gateway, wired, upstream):
    # given: a route whose only target speaks Anthropic's format, and a model that calls the tool
    wired.route("claude-via-openai", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when
    reply = _openai(gateway).chat.completions.create(**_chat_request())
    # then: the SDK reads a chat completion with the tool call
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1000, 200)
    # and the provider got an Anthropic request: system, image block, tool schema, tool choice
    sent = upstream.last("/v1/messages")
    body = sent["body"]
    assert sent["headers"]["x-api-key"] == "sk-ant-up"
    assert body["system"] == "Answer briefly."
    assert body["messages"][0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    assert body["tools"] == [
        {"name": "get_weather", "input_schema": WEATHER["parameters"], "description": WEATHER["description"]}
    ]
    assert (body["tool_choice"], body["max_tokens"], body["stop_sequences"]) == ({"type": "any"}, 300, ["END"])
    assert body["model"] == wired.model.name
    _recorded(wired.anthropic)


def test_openai_sdk_stream_is_served_by_an_anthropic_target(gateway, wired, upstream):
    wired.route("claude-via-openai", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when
    chunks = list(
        _openai(gateway).chat.completions.create(**_chat_request(), stream=True, stream_options={"include_usage": True})
    )
    # then: chat.completion.chunk events with the text, the tool call in pieces and the usage
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The quick brown fox")
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == TOOL_ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (1000, 200)
    assert upstream.last("/v1/messages")["body"]["stream"] is True
    _recorded(wired.anthropic)


def test_openai_stream_without_include_usage_gets_no_usage_chunk(gateway, wired, upstream):
    wired.route("claude-via-openai", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    chunks = list(
        _openai(gateway).chat.completions.create(
            model="claude-via-openai", max_tokens=300, stream=True, messages=[{"role": "user", "content": "hi"}]
        )
    )
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    _recorded(wired.anthropic)  # billed from the target's own events all the same


def _messages_request() -> dict:
    return {
        "model": "gpt-via-anthropic",
        "max_tokens": 300,
        "system": [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather where this photo was taken?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            }
        ],
        "tools": [
            {"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
    }


def _check_chat_sent(upstream) -> None:
    sent = upstream.last("/v1/chat/completions")
    body = sent["body"]
    assert sent["headers"]["authorization"] == "Bearer sk-up"
    assert body["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert body["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PNG}"},
    }
    assert body["tools"] == [{"type": "function", "function": WEATHER}]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    assert (body["max_completion_tokens"], body["stop"]) == (300, ["END"])


def test_anthropic_sdk_is_served_by_an_openai_target(gateway, wired, upstream):
    wired.route("gpt-via-anthropic", wired.openai)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when
    msg = _anthropic(gateway).messages.create(**_messages_request())
    # then: an Anthropic message with the tool use
    assert msg.stop_reason == "tool_use"
    use = [b for b in msg.content if b.type == "tool_use"][0]
    assert (use.name, use.input) == ("get_weather", TOOL_ARGUMENTS)
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (1000, 200)
    _check_chat_sent(upstream)
    _recorded(wired.openai)


def test_anthropic_sdk_stream_is_served_by_an_openai_target(gateway, wired, upstream):
    wired.route("gpt-via-anthropic", wired.openai)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when
    with _anthropic(gateway).messages.stream(**_messages_request()) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    # then: Anthropic's own event sequence, the text and the tool use accumulated from it
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    assert final.content[0].type == "text" and final.content[0].text.startswith("The quick brown fox")
    use = final.content[1]
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", TOOL_ARGUMENTS)
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("tool_use", 1000, 200)
    body = upstream.last("/v1/chat/completions")["body"]
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    _check_chat_sent(upstream)
    _recorded(wired.openai)


def test_a_tool_result_turn_is_translated_both_ways(gateway, wired, upstream):
    # given: the second turn of a tool loop, in each format, to a target of the other
    wired.route("claude-via-openai", wired.anthropic)
    wired.route("gpt-via-anthropic", wired.openai)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    _openai(gateway).chat.completions.create(
        model="claude-via-openai",
        max_tokens=50,
        tools=[{"type": "function", "function": WEATHER}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
        ],
    )
    sent = upstream.last("/v1/messages")["body"]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
    }
    assert sent[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18C and sunny"}],
    }
    _anthropic(gateway).messages.create(
        model="gpt-via-anthropic",
        max_tokens=50,
        tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C and sunny"}],
            },
        ],
    )
    sent = upstream.last("/v1/chat/completions")["body"]["messages"]
    assert sent[1]["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "18C and sunny"}
