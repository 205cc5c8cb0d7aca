"""Provider adapters: where a request goes, with which headers, and how its usage is read back.

Upstream responses are consumed as raw bytes (non-stream) or as SSE events (stream) so the
client receives the provider's own wire format, untouched except where noted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from catalog.pricing import Usage
from gateway.service import Target

ANTHROPIC_VERSION = "2023-06-01"
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "embeddings": "/v1/embeddings"}


def upstream_url(target: Target, kind: str) -> str:
    base = target.connection.base_url.rstrip("/")
    if base.endswith("/v1"):  # accept the SDK-style base URL too
        base = base[: -len("/v1")]
    return base + PATHS[kind]


def upstream_headers(target: Target, client_headers: dict[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    secret = target.connection.plain_secret
    if target.connection.kind == "anthropic":
        headers["x-api-key"] = secret
        headers["anthropic-version"] = client_headers.get("anthropic-version", ANTHROPIC_VERSION)
        if "anthropic-beta" in client_headers:
            headers["anthropic-beta"] = client_headers["anthropic-beta"]
    elif secret:
        headers["authorization"] = f"Bearer {secret}"
    # The fake upstream used by tests and benchmarks takes its fault knobs from these.
    for name, value in client_headers.items():
        if name.startswith("x-upstream-") and target.connection.options.get("forward_test_headers"):
            headers[name] = value
    return headers


def usage_openai(u: dict | None) -> Usage | None:
    if not isinstance(u, dict):
        return None
    prompt = int(u.get("prompt_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Usage(input_tokens=max(prompt - cached, 0), output_tokens=int(u.get("completion_tokens") or 0),
                 cache_read_tokens=cached)


def usage_anthropic(u: dict | None) -> Usage | None:
    if not isinstance(u, dict):
        return None
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_tokens=int(u.get("cache_read_input_tokens") or 0),
        cache_write_tokens=int(u.get("cache_creation_input_tokens") or 0),
    )


def usage_from_body(kind: str, body: bytes) -> tuple[Usage | None, str]:
    try:
        data = json.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    reader = usage_anthropic if kind == "messages" else usage_openai
    return reader(data.get("usage")), str(data.get("model") or "")


class StreamUsage:
    """Follows a stream's events and keeps the usage they report.

    OpenAI: the last chunk (requested with stream_options.include_usage) carries `usage`.
    Anthropic: message_start carries input usage, message_delta the final output count; the
    usage is complete only once message_delta arrives.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self.usage: Usage | None = None
        self.model = ""
        self._start: dict = {}

    def feed(self, data: bytes) -> bool:
        """Read one event's data; return True if it was OpenAI's usage-only chunk."""
        if self.kind == "messages":
            if b'"message_start"' in data:
                msg = json.loads(data).get("message") or {}
                self._start = msg.get("usage") or {}
                self.model = str(msg.get("model") or "")
            elif b'"message_delta"' in data:
                delta_usage = json.loads(data).get("usage")
                if isinstance(delta_usage, dict):
                    self.usage = usage_anthropic({**self._start, **delta_usage})
            return False
        if b'"usage":{' in data or b'"usage": {' in data:
            chunk = json.loads(data)
            self.usage = usage_openai(chunk.get("usage"))
            self.model = str(chunk.get("model") or self.model)
            return not chunk.get("choices")
        return False


@dataclass
class SSEEvent:
    raw: bytes  # the event as sent, without the blank line that ends it
    data: bytes  # its data field


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[SSEEvent]:
    buf: list[str] = []
    async for line in lines:
        if line == "":
            if buf:
                yield _event(buf)
                buf = []
            continue
        buf.append(line)
    if buf:
        yield _event(buf)


def _event(lines: list[str]) -> SSEEvent:
    data = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:"))
    return SSEEvent(raw="\n".join(lines).encode(), data=data.encode())


# --- echo: the built-in provider ------------------------------------------------------------


def _echo_usage(target: Target, prompt_bound: int, max_output: int | None) -> tuple[int, int]:
    opts = target.connection.options
    prompt = int(opts.get("prompt_tokens") or max(1, prompt_bound // 4))
    completion = int(opts.get("completion_tokens") or 16)
    if max_output is not None:
        completion = min(completion, max_output)
    return prompt, completion


async def echo_response(target: Target, kind: str, body: dict, prompt_bound: int) -> bytes:
    """A fixed response priced from the catalog, after the connection's configured delay."""
    opts = target.connection.options
    await asyncio.sleep(int(opts.get("delay_ms") or 0) / 1000)
    max_output = body.get("max_completion_tokens") or body.get("max_tokens")
    prompt, completion = _echo_usage(target, prompt_bound, max_output)
    text = str(opts.get("text") or "echo")
    rid = uuid.uuid4().hex[:24]
    if kind == "messages":
        return json.dumps({
            "id": f"msg_{rid}", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }).encode()
    if kind == "embeddings":
        items = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return json.dumps({
            "object": "list", "model": body["model"],
            "data": [{"object": "embedding", "index": i, "embedding": [0.0] * 8} for i in range(len(items))],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }).encode()
    n = int(body.get("n") or 1)
    return json.dumps({
        "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
        "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    for i in range(n)],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion * n, "total_tokens": prompt + completion * n},
    }).encode()


async def echo_stream(target: Target, kind: str, body: dict, prompt_bound: int) -> AsyncIterator[SSEEvent]:
    opts = target.connection.options
    await asyncio.sleep(int(opts.get("delay_ms") or 0) / 1000)
    chunk_delay = int(opts.get("chunk_delay_ms") or 0) / 1000
    chunks = int(opts.get("chunks") or 4)
    max_output = body.get("max_completion_tokens") or body.get("max_tokens")
    prompt, completion = _echo_usage(target, prompt_bound, max_output)
    text = str(opts.get("text") or "echo")
    rid = uuid.uuid4().hex[:24]

    def ev(data: dict, event: str | None = None) -> SSEEvent:
        payload = json.dumps(data).encode()
        raw = (f"event: {event}\n".encode() if event else b"") + b"data: " + payload
        return SSEEvent(raw=raw, data=payload)

    if kind == "messages":
        yield ev({"type": "message_start", "message": {
            "id": f"msg_{rid}", "type": "message", "role": "assistant", "model": body["model"], "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 1, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}}, "message_start")
        yield ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                 "content_block_start")
        for _ in range(chunks):
            await asyncio.sleep(chunk_delay)
            yield ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                     "content_block_delta")
        yield ev({"type": "content_block_stop", "index": 0}, "content_block_stop")
        yield ev({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                  "usage": {"output_tokens": completion}}, "message_delta")
        yield ev({"type": "message_stop"}, "message_stop")
        return
    base = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body["model"]}
    yield ev({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    for _ in range(chunks):
        await asyncio.sleep(chunk_delay)
        yield ev({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    yield ev({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield ev({**base, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                    "total_tokens": prompt + completion}})
    yield SSEEvent(raw=b"data: [DONE]", data=b"[DONE]")
