"""Converse's stream as each endpoint's event sequence, from the AWS event stream framing up:
decoded with botocore's EventStreamBuffer (gateway/providers/bedrock_converse.py), then
translated (gateway/translate/from_converse.py). Plain pytest: the events are built the way the
fake frames them (tests/upstream/converse.py), exceptions included."""

from __future__ import annotations

import asyncio
import json

from gateway.providers.bedrock_converse import ConverseStreamUsage, decode_converse_stream
from gateway.translate import stream_translator
from tests.upstream import bedrock

EVENTS = [
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hmm"}}}),
    ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sig"}}}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Hello "}}),
    ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "there"}}),
    ("contentBlockStop", {"contentBlockIndex": 1}),
    ("contentBlockStart", {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tu1", "name": "f"}}}),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"a":'}}}),
    ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": " 1}"}}}),
    ("contentBlockStop", {"contentBlockIndex": 2}),
    ("messageStop", {"stopReason": "tool_use"}),
    (
        "metadata",
        {
            "usage": {
                "inputTokens": 10,
                "outputTokens": 5,
                "totalTokens": 22,
                "cacheReadInputTokens": 4,
                "cacheWriteInputTokens": 3,
                "cacheDetails": [{"ttl": "1h", "inputTokens": 2}],
            },
            "metrics": {"latencyMs": 1},
            "serviceTier": {"type": "flex"},
        },
    ),
]


def _wire(events, exception: tuple[str, str] | None = None) -> bytes:
    out = b"".join(
        bedrock.message(
            {":event-type": name, ":content-type": "application/json", ":message-type": "event"},
            json.dumps(payload).encode(),
        )
        for name, payload in events
    )
    if exception is not None:
        headers = {":exception-type": exception[0], ":content-type": "application/json", ":message-type": "exception"}
        out += bedrock.message(headers, json.dumps({"message": exception[1]}).encode())
    return out


def _decoded(wire: bytes) -> list[bytes]:
    async def chunks():
        for i in range(0, len(wire), 7):  # split mid-message: the buffer reassembles them
            yield wire[i : i + 7]

    async def collect():
        return [e.data async for e in decode_converse_stream(chunks())]

    return asyncio.run(collect())


def _sse(raw: list[bytes]) -> list[dict]:
    return [json.loads(r.split(b"data: ", 1)[1]) for r in raw if b"[DONE]" not in r]


def test_the_event_stream_is_decoded_and_its_usage_read():
    data = _decoded(_wire(EVENTS))
    assert [next(iter(json.loads(d))) for d in data] == [name for name, _ in EVENTS]
    tracker = ConverseStreamUsage("converse")
    for d in data:
        tracker.feed(d)
    u = tracker.usage
    assert u is not None
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens) == (10, 5, 4)
    assert (u.cache_write_tokens, u.cache_write_1h_tokens, u.service_tier) == (1, 2, "flex")


def test_a_messages_client_reads_anthropics_event_sequence():
    translator = stream_translator(client="messages", upstream="converse", wants_usage=False)
    out = _sse([r for d in _decoded(_wire(EVENTS)) for r in translator.feed(d)] + translator.end())
    assert [e["type"] for e in out] == [
        "message_start",
        "content_block_start",  # the thinking block, opened by its first delta
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # the text block
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # the tool use
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    starts = [e for e in out if e["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    assert out[3]["delta"] == {"type": "signature_delta", "signature": "sig"}
    assert (
        "".join(e["delta"].get("partial_json", "") for e in out if e.get("index") == 2 and "delta" in e) == '{"a": 1}'
    )
    assert out[-2]["delta"]["stop_reason"] == "tool_use"
    assert out[-2]["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 4,
        "output_tokens": 5,
    }


def test_a_chat_client_reads_chunks_with_the_final_usage():
    translator = stream_translator(client="chat", upstream="converse", wants_usage=True)
    raw = [r for d in _decoded(_wire(EVENTS)) for r in translator.feed(d)] + translator.end()
    assert raw[-1] == b"data: [DONE]"
    chunks = _sse(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello there"  # the reasoning has no place in a chat completion
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "f" and calls[0]["id"] == "tu1"
    assert "".join(tc["function"].get("arguments") or "" for tc in calls) == '{"a": 1}'
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] == 17 and chunks[-1]["usage"]["completion_tokens"] == 5


def test_an_exception_mid_stream_ends_it_with_the_endpoints_error():
    wire = _wire(EVENTS[:5], exception=("throttlingException", "Too many tokens, please wait."))
    data = _decoded(wire)
    assert json.loads(data[-1]) == {"throttlingException": {"message": "Too many tokens, please wait."}}
    messages = stream_translator(client="messages", upstream="converse", wants_usage=False)
    out = _sse([r for d in data for r in messages.feed(d)] + messages.end())
    assert out[-1] == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Too many tokens, please wait."},
    }
    assert "message_stop" not in [e["type"] for e in out]  # broken for the client, as upstream broke it
    chat = stream_translator(client="chat", upstream="converse", wants_usage=True)
    chunks = _sse([r for d in data for r in chat.feed(d)] + chat.end())
    assert chunks[-1]["error"]["message"] == "Too many tokens, please wait."
    tracker = ConverseStreamUsage("converse")
    for d in data:
        tracker.feed(d)
    assert tracker.usage is None  # no metadata: the proxy charges the worst case


def test_a_stream_that_stopped_without_metadata_is_closed_for_the_client():
    messages = stream_translator(client="messages", upstream="converse", wants_usage=False)
    out = _sse([r for d in _decoded(_wire(EVENTS[:-1])) for r in messages.feed(d)] + messages.end())
    assert [e["type"] for e in out][-2:] == ["message_delta", "message_stop"]
