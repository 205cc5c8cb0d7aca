"""Usage, stop reasons and errors carried into the other format (what the client reads; the bill
is always taken from the target's own usage first)."""

from __future__ import annotations

import json

from gateway.translate.replies import completion_to_message, error, message_to_chat, usage_to_chat, usage_to_messages
from gateway.translate.streaming import ChatFromMessages, MessagesFromChat


def test_anthropic_cache_reads_and_writes_are_part_of_the_chat_prompt():
    u = {"input_tokens": 100, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 50, "output_tokens": 7}
    assert usage_to_chat(u) == {
        "prompt_tokens": 1050,
        "completion_tokens": 7,
        "total_tokens": 1057,
        "prompt_tokens_details": {"cached_tokens": 900},
    }


def test_openai_cached_and_reasoning_tokens_as_anthropic_usage():
    # reasoning tokens are inside completion_tokens; thinking counted only in total_tokens
    # (as Gemini reports it) is output too
    u = {
        "prompt_tokens": 1000,
        "completion_tokens": 300,
        "total_tokens": 1400,
        "prompt_tokens_details": {"cached_tokens": 600},
        "completion_tokens_details": {"reasoning_tokens": 200},
    }
    assert usage_to_messages(u) == {
        "input_tokens": 400,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 600,
        "output_tokens": 400,
    }


def test_stop_reasons_map_both_ways():
    for stop, finish in [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("stop_sequence", "stop"),
        ("refusal", "content_filter"),
    ]:
        msg = {"id": "m", "content": [], "stop_reason": stop, "usage": {}}
        assert message_to_chat(msg, "x")["choices"][0]["finish_reason"] == finish
    for finish, stop in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ]:
        completion = {"id": "c", "choices": [{"message": {"content": "hi"}, "finish_reason": finish}]}
        assert completion_to_message(completion, "x")["stop_reason"] == stop


def test_errors_keep_their_message_in_the_endpoints_shape():
    anthropic = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}).encode()
    assert json.loads(error(anthropic, status=529, client="chat"))["error"]["message"] == "busy"
    openai = json.dumps({"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}})
    assert json.loads(error(openai.encode(), status=429, client="messages")) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    assert json.loads(error(b"<html>bad gateway</html>", status=502, client="messages"))["error"]["type"] == "api_error"


def test_a_chat_stream_without_done_is_closed_only_if_the_target_said_it_finished():
    cut = MessagesFromChat()
    cut.feed(json.dumps({"id": "c", "choices": [{"delta": {"content": "hel"}}]}).encode())
    assert cut.end() == []  # broken mid-answer: no message_stop, the client sees it broken
    done = MessagesFromChat()
    done.feed(json.dumps({"id": "c", "choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}).encode())
    assert [e.split(b"\n")[0] for e in done.end()] == [
        b"event: content_block_stop",
        b"event: message_delta",
        b"event: message_stop",
    ]


def test_thinking_deltas_are_not_relayed_to_a_chat_client():
    t = ChatFromMessages(wants_usage=False)
    t.feed(json.dumps({"type": "message_start", "message": {"id": "m", "usage": {}}}).encode())
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}
    assert t.feed(json.dumps(delta).encode()) == []
