"""echo: the built-in provider. Answers chat, messages, responses and embeddings with usage the
catalog prices, so the demo runs without a provider account (its jobs: echo/jobs.py).

echo/transport.py hands a live call here: `echo_response` for a plain answer, `echo_stream` for
its events. The connection's options shape the answers: prompt_tokens (else a quarter of the
gateway's input bound), completion_tokens (16; never above the request's output ceiling), text,
chunks, delay_ms, chunk_delay_ms, service_tier.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.providers import Adapter, SSEEvent


class Echo(Adapter):
    """The built-in provider serves every live endpoint in its own format, in-process (its
    transport, echo/transport.py, answers the call; registered in EchoConfig.ready)."""

    endpoints = frozenset({"chat", "messages", "embeddings", "responses", "videos"})
    jobs = frozenset({"batches", "message_batches", "background"})  # each in Redis (echo/jobs.py)


def max_output(body: dict) -> Any:
    return body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")


def usage_numbers(opts: dict, prompt_bound: int, ceiling: int | None) -> tuple[int, int]:
    """(prompt, completion) tokens echo reports for a request."""
    prompt = int(opts.get("prompt_tokens") or max(1, prompt_bound // 4))
    completion = int(opts.get("completion_tokens") or 16)
    if ceiling is not None:
        completion = min(completion, ceiling)
    return prompt, completion


def _searches(body: dict) -> int:
    """Echo bills web search like a provider that uses every search the request allows."""
    return sum(
        int(t.get("max_uses") or 0)
        for t in body.get("tools") or []
        if isinstance(t, dict) and str(t.get("type", "")).startswith("web_search")
    )


def _tier(opts: dict, body: dict, kind: str) -> str:
    requested = body.get("service_tier")
    if requested in (None, "auto"):
        requested = opts.get("service_tier")
    if requested == "fast":
        requested = "priority"
    if kind == "messages":
        return "priority" if requested == "priority" else "standard"
    return str(requested or "default")


def _response_object(opts: dict, body: dict, prompt: int, completion: int, text: str, rid: str) -> dict:
    """A completed Responses API object; web searches use every allowed tool call."""
    searches = (
        int(body.get("max_tool_calls") or 0)
        if any(isinstance(t, dict) and str(t.get("type", "")).startswith("web_search") for t in body.get("tools") or [])
        else 0
    )
    output: list[dict] = [
        {
            "type": "web_search_call",
            "id": f"ws_{rid}_{i}",
            "status": "completed",
            "action": {"type": "search", "query": "echo"},
        }
        for i in range(searches)
    ]
    output.append(
        {
            "type": "message",
            "id": f"msg_{rid}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body["model"],
        "output": output,
        "service_tier": _tier(opts, body, "responses"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


def echo_body(opts: dict, kind: str, body: dict, prompt_bound: int, rid: str | None = None) -> dict:
    """The non-stream answer to a request of `kind` (chat | messages | responses | embeddings)."""
    ceiling = max_output(body)
    prompt, completion = usage_numbers(opts, prompt_bound, ceiling if isinstance(ceiling, int) else None)
    text = str(opts.get("text") or "echo")
    rid = rid or uuid.uuid4().hex[:24]
    if kind == "messages":
        return {
            "id": f"msg_{rid}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt,
                "output_tokens": completion,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "server_tool_use": {
                    "web_search_requests": _searches(body),
                    "web_fetch_requests": 0,
                },
                "service_tier": _tier(opts, body, kind),
            },
        }
    if kind == "responses":
        return _response_object(opts, body, prompt, completion, text, rid)
    if kind == "embeddings":
        items = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return {
            "object": "list",
            "model": body["model"],
            "data": [{"object": "embedding", "index": i, "embedding": [0.0] * 8} for i in range(len(items))],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
    n = int(body.get("n") or 1)
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "service_tier": _tier(opts, body, kind),
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} for i in range(n)
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion * n,
            "total_tokens": prompt + completion * n,
        },
    }


async def echo_response(opts: dict, kind: str, body: dict, prompt_bound: int) -> bytes:
    """A fixed response priced from the catalog, after the connection's configured delay."""
    await asyncio.sleep(int(opts.get("delay_ms") or 0) / 1000)
    return json.dumps(echo_body(opts, kind, body, prompt_bound)).encode()


async def echo_stream(opts: dict, kind: str, body: dict, prompt_bound: int) -> AsyncIterator[SSEEvent]:
    await asyncio.sleep(int(opts.get("delay_ms") or 0) / 1000)
    chunk_delay = int(opts.get("chunk_delay_ms") or 0) / 1000
    chunks = int(opts.get("chunks") or 4)
    prompt, completion = usage_numbers(opts, prompt_bound, max_output(body))
    text = str(opts.get("text") or "echo")
    rid = uuid.uuid4().hex[:24]

    def ev(data: dict, event: str | None = None) -> SSEEvent:
        payload = json.dumps(data).encode()
        raw = (f"event: {event}\n".encode() if event else b"") + b"data: " + payload
        return SSEEvent(raw=raw, data=payload)

    if kind == "responses":
        final = _response_object(opts, body, prompt, completion, text * chunks, rid)
        started = {**final, "status": "in_progress", "output": [], "usage": None}
        yield ev(
            {"type": "response.created", "sequence_number": 0, "response": started},
            "response.created",
        )
        message = final["output"][-1]
        yield ev(
            {
                "type": "response.output_item.added",
                "sequence_number": 1,
                "output_index": 0,
                "item": {**message, "status": "in_progress", "content": []},
            },
            "response.output_item.added",
        )
        yield ev(
            {
                "type": "response.content_part.added",
                "sequence_number": 2,
                "item_id": message["id"],
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
            "response.content_part.added",
        )
        for i in range(chunks):
            await asyncio.sleep(chunk_delay)
            yield ev(
                {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 3,
                    "item_id": message["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
                "response.output_text.delta",
            )
        # Each part and item closed before the response, as OpenAI streams them: clients build
        # the answer from output_item.done (Codex shows nothing without it).
        seq = chunks + 3
        where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
        yield ev(
            {
                "type": "response.output_text.done",
                "sequence_number": seq,
                **where,
                "text": text * chunks,
                "logprobs": [],
            },
            "response.output_text.done",
        )
        yield ev(
            {"type": "response.content_part.done", "sequence_number": seq + 1, **where, "part": message["content"][0]},
            "response.content_part.done",
        )
        yield ev(
            {"type": "response.output_item.done", "sequence_number": seq + 2, "output_index": 0, "item": message},
            "response.output_item.done",
        )
        final["output"] = [message, *final["output"][:-1]]  # the message first, as streamed
        yield ev(
            {"type": "response.completed", "sequence_number": seq + 3, "response": final},
            "response.completed",
        )
        return
    if kind == "messages":
        yield ev(
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{rid}",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": prompt,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            },
            "message_start",
        )
        yield ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        )
        for _ in range(chunks):
            await asyncio.sleep(chunk_delay)
            yield ev(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
                "content_block_delta",
            )
        yield ev({"type": "content_block_stop", "index": 0}, "content_block_stop")
        yield ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {
                    "output_tokens": completion,
                    "server_tool_use": {"web_search_requests": _searches(body)},
                    "service_tier": _tier(opts, body, kind),
                },
            },
            "message_delta",
        )
        yield ev({"type": "message_stop"}, "message_stop")
        return
    base = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body["model"],
    }
    yield ev(
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
    )
    for _ in range(chunks):
        await asyncio.sleep(chunk_delay)
        yield ev({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    yield ev({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield ev(
            {
                **base,
                "service_tier": _tier(opts, body, kind),
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )
    yield SSEEvent(raw=b"data: [DONE]", data=b"[DONE]")
