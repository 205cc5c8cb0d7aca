"""Fake LLM provider speaking the OpenAI, Anthropic, Azure OpenAI, Gemini (OpenAI-compatible and
native generateContent), Amazon Bedrock (InvokeModel, SigV4, the AWS event stream) and Google Vertex AI (rawPredict, the
OpenAI-compatible endpoint, the OAuth token endpoint) wire formats, for tests and benchmarks.

A plain ASGI app served by uvicorn. Behaviour is driven by "knobs" (see ``DEFAULTS``) that can be
set globally with ``POST /_control`` or per request with ``X-Upstream-<knob>`` headers
(``X-Upstream-Delay-Ms`` and ``X-Upstream-delay_ms`` are equivalent; the header wins).

Run standalone:  ``python -m tests.upstream.server --port 18001 [--host 127.0.0.1]``
In-process:      ``handle = run_in_thread()`` ... ``handle.stop()``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx
import uvicorn

from tests.upstream import azure, bedrock, converse, files, gemini, gemini_native, job_routes, jobs, media, vertex

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = dict[str, str]

DEFAULTS: dict[str, Any] = {
    "delay_ms": 0,
    "chunk_delay_ms": 0,
    "chunks": 4,
    "prompt_tokens": 10,
    "completion_tokens": 5,  # int, or "max" to echo the request's max_tokens
    "fail": "",
    "fail_every": 0,
    "overbill": 1,
    "ignore_max_tokens": False,
    # The one parameter "max" reads the ceiling from, as a server that knows only that one ("" =
    # max_completion_tokens, else max_tokens, else max_output_tokens), and what a request without
    # it is billed under "max" (the server's own default ceiling).
    "ceiling_param": "",
    "default_max_tokens": 16,
    # Paid features, billed the way the providers document them:
    "search_result_tokens": 0,  # input tokens each web search adds to the context
    "tier": "",  # the tier a request without one (or "auto") is served at ("" = standard)
    # Anthropic: the speed a `speed: "fast"` request is served and reported at ("" = fast;
    # "standard" = fast mode unavailable, served at the standard speed and price).
    "speed": "",
    "cache_write_1h_tokens": 0,  # of the input, written to the 1-hour cache when ttl "1h" is asked
    "audio_tokens": 0,  # completion audio tokens reported (a paid field capgate cannot price)
    "thoughts_tokens": 0,  # thinking tokens counted in total_tokens only, as Gemini reports them
    "cached_tokens": 0,  # chat: of the prompt, read from the cache (prompt_tokens_details.cached_tokens)
    "cache_write_tokens": 0,  # Converse: cacheWriteInputTokens reported
    # "o200k_base" | "cl100k_base": chat prompt_tokens and Responses input_tokens counted like the
    # provider (tests/upstream/chatml.py) instead of the fixed prompt_tokens knob.
    "count_prompt": "",
    # Jobs (batches, background responses, videos; tests/upstream/jobs.py): a job created while
    # this is on completes on its first status read, as the echo provider's jobs do.
    "job_auto_complete": False,
    # A request with tools is answered with a call of its first tool (TOOL_ARGUMENTS), as a model
    # that decides to use it does: finish_reason tool_calls / stop_reason tool_use.
    "tool_call": False,
    # A Set-Cookie header on the answer (as a provider's edge sets one): a gateway that kept it
    # would send it on its next call, whoever that is for (tests/gateway/test_upstream_cookies.py).
    "set_cookie": "",
}
TOOL_ARGUMENTS = {"city": "Paris", "units": "celsius"}
FAIL_MODES = {"", "500", "503", "429", "400", "close", "stall", "drop_mid_stream", "no_usage"}
STALL_CAP_S = 300.0
HEADER_PREFIX = "x-upstream-"
WORDS = "The quick brown fox jumps over the lazy dog".split()

# (type, code) for OpenAI errors and type for Anthropic errors, by status.
OPENAI_ERRORS = {
    400: ("invalid_request_error", "invalid_value"),
    404: ("invalid_request_error", "unknown_url"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}
ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def _coerce(knob: str, value: Any) -> Any:
    """Convert a knob value from JSON or a header string; raises ValueError when invalid."""
    if knob not in DEFAULTS:
        raise ValueError(f"unknown knob {knob!r}")
    if knob == "fail":
        if str(value) not in FAIL_MODES:
            raise ValueError(f"fail must be one of {sorted(FAIL_MODES)}")
        return str(value)
    if knob == "completion_tokens" and str(value) == "max":
        return "max"
    if knob == "overbill":
        return float(value)
    if knob in ("tier", "count_prompt", "speed", "set_cookie", "ceiling_param"):
        return str(value)
    if knob in ("ignore_max_tokens", "job_auto_complete", "tool_call"):
        truthy = {"1", "true", "yes", "on"}
        return value if isinstance(value, bool) else str(value).strip().lower() in truthy
    if isinstance(value, bool):
        raise ValueError(f"{knob} must be an integer")
    return int(value)


def _completion_tokens(knobs: dict[str, Any], body: dict[str, Any]) -> int:
    tokens = knobs["completion_tokens"]
    if tokens == "max":
        if knobs["ceiling_param"]:
            requested = body.get(knobs["ceiling_param"])
        else:
            requested = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
        tokens = requested if isinstance(requested, int) else knobs["default_max_tokens"]
        if knobs["ignore_max_tokens"]:
            tokens *= 4
    return int(tokens * knobs["overbill"])


def _pieces(n: int) -> list[str]:
    """The streamed content chunks; the non-stream text is their concatenation."""
    return [WORDS[i % len(WORDS)] + " " for i in range(max(n, 0))]


def _error_body(dialect: str, status: int, message: str) -> dict[str, Any]:
    if dialect == "gemini":
        return gemini_native.error(status, message)
    if dialect == "anthropic":
        return {
            "type": "error",
            "error": {"type": ANTHROPIC_ERRORS.get(status, "api_error"), "message": message},
        }
    kind, code = OPENAI_ERRORS.get(status, ("server_error", None))
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


class _Exchange:
    """One request/response: send helpers plus a watcher noticing when the client goes away."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive, self._send = receive, send
        self.body: dict[str, Any] = {}
        self.uploads: dict[str, tuple[str, bytes]] = {}  # multipart files: name -> (filename, bytes)
        self.query: dict[str, str] = {}
        self.deployment = ""  # Azure OpenAI: the deployment in the URL (tests/upstream/azure.py)
        self.gemini_call = ("", False)  # Gemini native: (model, streamed) from the URL (gemini_native.py)
        # How a stream's SSE frames go on the wire (Bedrock: AWS event stream messages).
        self.stream_type = "text/event-stream"
        self.encode_frame: Callable[[str], bytes] = str.encode
        self.headers: Headers = {}
        self.store: jobs.JobStore | None = None
        self.knobs: dict[str, Any] = dict(DEFAULTS)
        self.fail = ""  # the failure mode applying to this request ("" when normal)
        self._watcher: asyncio.Future[None] | None = None
        self.completed = False  # the whole response was sent
        self.aborted = False  # we dropped the connection on purpose

    def watch(self) -> None:
        self._watcher = asyncio.ensure_future(self._wait_disconnect())

    async def _wait_disconnect(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

    @property
    def client_gone(self) -> bool:
        # uvicorn's receive() also reports http.disconnect once the response is complete,
        # so only an unfinished, non-aborted exchange counts as the client leaving.
        done = self._watcher is not None and self._watcher.done() and not self._watcher.cancelled()
        return done and not self.completed and not self.aborted

    async def wait(self, seconds: float) -> bool:
        """Sleep, waking early if the client disconnects. True if the client is still there."""
        if self._watcher is None:
            await asyncio.sleep(seconds)
            return True
        if seconds > 0:
            await asyncio.wait({self._watcher}, timeout=seconds)
        return not self._watcher.done()

    async def start(self, status: int, content_type: str, *extra: tuple[bytes, bytes]) -> None:
        headers = [(b"content-type", content_type.encode()), *extra]
        if self.knobs.get("set_cookie"):
            headers.append((b"set-cookie", str(self.knobs["set_cookie"]).encode()))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body_chunk(self, data: bytes, more: bool = False) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})
        self.completed = not more

    async def json(self, status: int, obj: Any) -> None:
        await self.start(status, "application/json")
        await self.body_chunk(json.dumps(obj).encode())

    async def abort(self) -> None:
        """Drop the TCP connection without finishing (or starting) the response.

        ASGI has no "abort" message and uvicorn answers an exception raised before the response
        starts with a 500, so reach for the transport behind uvicorn's bound ``send``.
        """
        self.aborted = True
        transport = getattr(getattr(self._send, "__self__", None), "transport", None)
        if transport is None:  # not uvicorn: an exception is the closest we can get
            raise ConnectionAbortedError("fake upstream: connection dropped on purpose")
        transport.close()
        # Let uvicorn process connection_lost, so it neither logs nor tries to send a 500.
        if self._watcher is not None:
            await asyncio.wait({self._watcher}, timeout=1.0)

    async def respond(self, obj: dict[str, Any]) -> None:
        """Send a non-stream 200, applying the failure modes that make sense without a stream."""
        if self.fail == "no_usage":
            obj.pop("usage", None)
        data = json.dumps(obj).encode()
        if self.fail == "drop_mid_stream":  # the non-stream analogue: half a body, then hang up
            await self.start(200, "application/json", (b"content-length", b"%d" % len(data)))
            await self.body_chunk(data[: len(data) // 2], more=True)
            await self.abort()
        else:
            await self.json(200, obj)

    async def stream(self, frames: list[str], drop_at: int) -> None:
        """Send SSE frames, pausing chunk_delay_ms between them.

        With fail=drop_mid_stream the connection is dropped just before frame ``drop_at``.
        """
        if self.fail != "drop_mid_stream":
            drop_at = -1
        await self.start(200, self.stream_type, (b"cache-control", b"no-cache"))
        for i, frame in enumerate(frames):
            if i == drop_at:
                await self.abort()
                return
            if i and not await self.wait(self.knobs["chunk_delay_ms"] / 1000):
                return  # client went away
            if frame.startswith("data: [DONE]") and self.encode_frame is not str.encode:
                continue
            await self.body_chunk(self.encode_frame(frame), more=True)
        await self.body_chunk(b"")


# -- provider endpoints (the parsed request, knobs and failure mode live on the exchange) ---


def _served_tier(knobs: dict[str, Any], body: dict[str, Any], dialect: str) -> str:
    """The tier a provider reports: the requested one (fast is priority), else the project's."""
    tier = body.get("service_tier")
    if tier in (None, "auto"):
        tier = knobs["tier"] or None
    if tier == "fast":
        tier = "priority"
    if dialect == "anthropic":
        return "priority" if tier == "priority" else "standard"
    return str(tier or "default")


def _web_searches(body: dict[str, Any]) -> int:
    """Like a provider whose model searches as often as it may: every allowed use."""
    tools = body.get("tools") or []
    return sum(
        int(t.get("max_uses") or 0)
        for t in tools
        if isinstance(t, dict) and str(t.get("type", "")).startswith("web_search")
    )


def _searched_input(prompt: int, searches: int, result: int) -> int:
    """The input a provider bills for a call that searches `searches` times, one search per
    sampling pass: every pass reads the prompt and the results of the searches before it."""
    return sum(prompt + done * result for done in range(searches + 1))


def _wants_1h_cache(body: dict[str, Any]) -> bool:
    return '"ttl": "1h"' in json.dumps(body) or '"ttl":"1h"' in json.dumps(body)


def _tool_name(ex: _Exchange, dialect: str) -> str | None:
    """The tool a tool_call answer calls: the request's first, when the knob is on."""
    tools = ex.body.get("tools") or []
    if not ex.knobs["tool_call"] or not tools or not isinstance(tools[0], dict):
        return None
    return str(tools[0].get("name") if dialect == "anthropic" else (tools[0].get("function") or {}).get("name"))


# Audio outputs the fake provider made: id -> its audio tokens. Like OpenAI, an assistant message
# naming one (`"audio": {"id": ...}`) is billed for that audio again, as input audio tokens.
AUDIO_OUTPUTS: dict[str, int] = {}


def _referenced_audio(body: dict[str, Any]) -> int:
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    refs = [m["audio"].get("id") for m in messages if isinstance(m, dict) and isinstance(m.get("audio"), dict)]
    return sum(AUDIO_OUTPUTS.get(str(ref), 0) for ref in refs)


async def _chat(ex: _Exchange) -> None:
    body, knobs = ex.body, ex.knobs
    model = body.get("model", "fake-model")
    n = max(1, int(body.get("n") or 1))
    pieces = _pieces(knobs["chunks"])
    prompt, completion = knobs["prompt_tokens"], _completion_tokens(knobs, body)
    if knobs["count_prompt"]:
        from tests.upstream import chatml

        prompt = chatml.prompt_tokens(body, knobs["count_prompt"])
    audio_in = _referenced_audio(body)
    prompt += audio_in
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion + knobs["thoughts_tokens"]
    if knobs["audio_tokens"]:
        usage["completion_tokens_details"] = {"audio_tokens": knobs["audio_tokens"]}
    if audio_in:
        usage["prompt_tokens_details"] = {"audio_tokens": audio_in}
    if knobs["cached_tokens"]:
        usage.setdefault("prompt_tokens_details", {})["cached_tokens"] = knobs["cached_tokens"]
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    tier = _served_tier(knobs, body, "openai")

    def head(kind: str) -> dict[str, Any]:
        return {"id": cid, "object": kind, "created": created, "model": model, "service_tier": tier}

    tool = _tool_name(ex, "openai")
    call = {"id": f"call_{cid[-12:]}", "type": "function"}
    arguments = json.dumps(TOOL_ARGUMENTS)
    finish = "tool_calls" if tool else "stop"
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces), "refusal": None}
        if isinstance(body.get("audio"), dict) and knobs["audio_tokens"]:  # audio output, as OpenAI returns it
            audio_id = f"audio_{uuid.uuid4().hex[:24]}"
            AUDIO_OUTPUTS[audio_id] = knobs["audio_tokens"]
            message |= {
                "content": None,
                "audio": {
                    "id": audio_id,
                    "expires_at": created + 3600,
                    "data": base64.b64encode(b"RIFF fake wav").decode(),
                    "transcript": "".join(pieces),
                },
            }
        if tool:
            message |= {"content": None, "tool_calls": [{**call, "function": {"name": tool, "arguments": arguments}}]}
        choices = [{"index": i, "message": message, "logprobs": None, "finish_reason": finish} for i in range(n)]
        await ex.respond({**head("chat.completion"), "choices": choices, "usage": usage})
        return

    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    include_usage = include_usage and ex.fail != "no_usage"

    def frame(choices: list[dict[str, Any]], chunk_usage: dict[str, Any] | None = None) -> str:
        chunk = {**head("chat.completion.chunk"), "choices": choices}
        if include_usage:  # like OpenAI: "usage": null on every chunk but the last
            chunk["usage"] = chunk_usage
        return f"data: {json.dumps(chunk)}\n\n"

    def choice(i: int, delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}]

    frames = [frame(choice(i, {"role": "assistant", "content": ""})) for i in range(n)]
    frames += [frame(choice(i, {"content": p})) for p in pieces for i in range(n)]
    if tool:  # the call's name first, then its arguments in two pieces, as OpenAI streams them
        start = {**call, "index": 0, "function": {"name": tool, "arguments": ""}}
        halves = [arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]]
        frames += [frame(choice(i, {"tool_calls": [start]})) for i in range(n)]
        frames += [
            frame(choice(i, {"tool_calls": [{"index": 0, "function": {"arguments": h}}]}))
            for h in halves
            for i in range(n)
        ]
    frames += [frame(choice(i, {}, finish)) for i in range(n)]
    if include_usage:
        frames.append(frame([], usage))
    frames.append("data: [DONE]\n\n")
    await ex.stream(frames, drop_at=3 * n)  # after the role chunks and two content chunks


# Message threads the fake provider keeps: message id -> (the context a `continue` adds: input +
# output, and the create's tools, which a continue leaves out).
STORED_THREADS: dict[str, tuple[int, Any]] = {}


async def _messages(ex: _Exchange) -> None:
    """Messages. Like the provider, a thread's `continue` is billed for the whole conversation it
    kept (an unknown id is a 404 `thread_not_found`), and each search's results join the context."""
    body, knobs = ex.body, ex.knobs
    thread = body.get("thread") if isinstance(body.get("thread"), dict) else None
    earlier = 0
    if thread is not None and thread.get("type") == "continue":
        if thread.get("previous_message_id") not in STORED_THREADS:
            error = _error_body("anthropic", 404, "thread not found")
            error["error"]["details"] = {"error_code": "thread_not_found"}
            await ex.json(404, error)
            return
        earlier, tools = STORED_THREADS[thread["previous_message_id"]]
        body = ex.body = {**body, "tools": tools}
    pieces = _pieces(knobs["chunks"])
    output = _completion_tokens(knobs, body)
    searches = _web_searches(body)
    # Each search is another pass over the context (the thread's kept turns included), which its
    # results then join.
    billed = _searched_input(knobs["prompt_tokens"] + earlier, searches, knobs["search_result_tokens"])
    one_hour = knobs["cache_write_1h_tokens"] if _wants_1h_cache(body) else 0
    usage: dict[str, Any] = {"input_tokens": billed - one_hour, "cache_creation_input_tokens": one_hour}
    usage |= {"cache_read_input_tokens": 0, "output_tokens": output}
    usage["cache_creation"] = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": one_hour}
    usage["server_tool_use"] = {"web_search_requests": searches}
    usage["service_tier"] = _served_tier(knobs, body, "anthropic")
    if body.get("speed") is not None:
        usage["speed"] = knobs["speed"] or body["speed"]
    tool = _tool_name(ex, "anthropic")
    use = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": tool, "input": TOOL_ARGUMENTS}
    message: dict[str, Any] = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-fake"),
        "content": [{"type": "text", "text": "".join(pieces)}, *([use] if tool else [])],
        "stop_reason": "tool_use" if tool else "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    if thread is not None:
        STORED_THREADS[message["id"]] = (usage["input_tokens"] + one_hour + output, body.get("tools"))
    if not body.get("stream"):
        await ex.respond(message)
        return

    start = {**message, "content": [], "stop_reason": None, "usage": usage | {"output_tokens": 1}}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    stop: dict[str, Any] = {"type": "message_delta", "delta": delta}
    stop["usage"] = {"output_tokens": output, "server_tool_use": usage["server_tool_use"]}
    if ex.fail == "no_usage":
        del start["usage"], stop["usage"]
    text_block = {"type": "text", "text": ""}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": text_block},
        {"type": "ping"},  # the real API sends one here; clients must tolerate it
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in pieces),
        {"type": "content_block_stop", "index": 0},
        *(_tool_use_events(use) if tool else []),
        stop,
        {"type": "message_stop"},
    ]
    frames = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]
    await ex.stream(frames, drop_at=5)  # after message_start, block start, ping and two deltas


def _tool_use_events(use: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool_use block streamed as Anthropic does: empty input, then its JSON in pieces."""
    arguments = json.dumps(use["input"])
    halves = [arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]]
    return [
        {"type": "content_block_start", "index": 1, "content_block": {**use, "input": {}}},
        *(
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": h}}
            for h in halves
        ),
        {"type": "content_block_stop", "index": 1},
    ]


# Responses the fake provider stored: id -> the context a continuation adds (input + output).
STORED_RESPONSES: dict[str, int] = {}
# Conversations: id -> the tokens of every item its turns added so far. Like the provider, a turn
# reads the conversation when it runs (after its delay), not when it was sent, and adds its
# input and output items to it.
CONVERSATIONS: dict[str, int] = {}


def _conversation_id(body: dict[str, Any]) -> str | None:
    conversation = body.get("conversation")
    conv_id = conversation.get("id") if isinstance(conversation, dict) else conversation
    return conv_id if isinstance(conv_id, str) else None


async def _responses(ex: _Exchange) -> None:
    """The Responses API: like the provider, a continuation (previous_response_id) is billed
    for the whole earlier context it stored, and web searches use every allowed tool call."""
    body, knobs = ex.body, ex.knobs
    searches = (
        int(body.get("max_tool_calls") or 0)
        if any(isinstance(t, dict) and str(t.get("type", "")).startswith("web_search") for t in body.get("tools") or [])
        else 0
    )
    conversation = _conversation_id(body)
    if conversation is not None:
        earlier = CONVERSATIONS.get(conversation, 0)
    else:
        earlier = STORED_RESPONSES.get(str(body.get("previous_response_id")), 0)
    prompt = knobs["prompt_tokens"]
    if knobs["count_prompt"]:
        from tests.upstream import chatml

        prompt = chatml.responses_prompt_tokens(body, knobs["count_prompt"])
    input_tokens = _searched_input(prompt + earlier, searches, knobs["search_result_tokens"])
    output = _completion_tokens(knobs, body)
    rid = f"resp_{uuid.uuid4().hex[:24]}"
    if body.get("store") is not False:
        STORED_RESPONSES[rid] = input_tokens + output
    if conversation is not None:
        CONVERSATIONS[conversation] = input_tokens + output
    pieces = _pieces(knobs["chunks"])
    items: list[dict[str, Any]] = [
        {"type": "web_search_call", "id": f"ws_{i}", "status": "completed", "action": {"type": "search", "query": "q"}}
        for i in range(searches)
    ]
    items.append(
        {
            "type": "message",
            "id": f"msg_{rid}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "".join(pieces), "annotations": []}],
        }
    )
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model", "fake-model"),
        "output": items,
        "service_tier": _served_tier(knobs, body, "openai"),
        "conversation": {"id": conversation} if conversation is not None else None,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output,
        },
    }
    if ex.fail == "no_usage":
        response.pop("usage")
    if body.get("background") and ex.store is not None:  # a job: tests/upstream/media.py
        await media.create_response(ex.store, ex, response)
        return
    if not body.get("stream"):
        await ex.respond(response)
        return
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**response, "status": "in_progress", "output": [], "usage": None},
        },
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": {
                "type": "message",
                "id": f"msg_{rid}",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            "sequence_number": 2,
            "item_id": f"msg_{rid}",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        *(
            {
                "type": "response.output_text.delta",
                "sequence_number": i + 3,
                "item_id": f"msg_{rid}",
                "output_index": 0,
                "content_index": 0,
                "delta": p,
                "logprobs": [],
            }
            for i, p in enumerate(pieces)
        ),
        # Like the provider, each part and item is closed before the response completes; clients
        # (Codex) build the turn's message from output_item.done, not from the deltas.
        {
            "type": "response.output_text.done",
            "sequence_number": len(pieces) + 3,
            "item_id": f"msg_{rid}",
            "output_index": 0,
            "content_index": 0,
            "text": "".join(pieces),
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "sequence_number": len(pieces) + 4,
            "item_id": f"msg_{rid}",
            "output_index": 0,
            "content_index": 0,
            "part": items[-1]["content"][0],
        },
        {"type": "response.output_item.done", "sequence_number": len(pieces) + 5, "output_index": 0, "item": items[-1]},
        {
            "type": "response.completed",
            "sequence_number": len(pieces) + 6,
            "response": {**response, "output": [items[-1], *items[:-1]]},
        },  # the message first, as streamed
    ]
    frames = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]
    await ex.stream(frames, drop_at=5)  # after created, the item and part, and two deltas


async def _compact(ex: _Exchange) -> None:
    """POST /v1/responses/compact: the input's user messages, then one compaction item; billed like
    a response (a previous_response_id's stored context included), output at the knob's count."""
    body, knobs = ex.body, ex.knobs
    earlier = STORED_RESPONSES.get(str(body.get("previous_response_id")), 0)
    items = body.get("input")
    if not isinstance(items, list):
        items = [{"role": "user", "content": items}]
    users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
    input_tokens, output = knobs["prompt_tokens"] + earlier, knobs["completion_tokens"]
    if not isinstance(output, int):  # "max" echoes a ceiling, and a compaction takes none
        output = DEFAULTS["completion_tokens"]
    compaction = {"type": "compaction", "id": f"cmp_{uuid.uuid4().hex[:24]}", "encrypted_content": "gAAAA-summary"}
    await ex.respond(
        {
            "id": f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*users, compaction],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output,
            },
        }
    )


async def _embeddings(ex: _Exchange) -> None:
    raw = ex.body.get("input")
    is_list = isinstance(raw, list) and len(raw) > 0
    if isinstance(raw, str) or (is_list and all(isinstance(t, int) for t in raw)):
        items: list[Any] = [raw]  # one string, or one pre-tokenised input
    elif is_list:
        items = raw
    else:
        message = "'input' must be a string or a non-empty list"
        await ex.json(400, _error_body("openai", 400, message))
        return
    data = []
    for i, item in enumerate(items):
        digest = hashlib.sha256(json.dumps(item).encode()).digest()
        vector = [round(b / 255, 4) for b in digest[:8]]  # deterministic per input
        embedding: Any = vector
        if ex.body.get("encoding_format") == "base64":  # the openai SDK asks for this by default
            embedding = base64.b64encode(struct.pack("<8f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    prompt = ex.knobs["prompt_tokens"]
    usage = {"prompt_tokens": prompt, "total_tokens": prompt}
    model = ex.body.get("model", "fake-embedding")
    await ex.respond({"object": "list", "data": data, "model": model, "usage": usage})


async def _count_tokens(ex: _Exchange) -> None:
    """Anthropic's token count: the prompt_tokens knob, as if the provider had counted it."""
    if not isinstance(ex.body.get("messages"), list):
        await ex.json(400, _error_body("anthropic", 400, "messages: Field required"))
        return
    await ex.json(200, {"input_tokens": ex.knobs["prompt_tokens"]})


async def _models(ex: _Exchange) -> None:
    ids = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"]
    data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"} for m in ids]
    await ex.respond({"object": "list", "data": data})


async def _generate_content(ex: _Exchange) -> None:
    model, stream = ex.gemini_call
    await gemini_native.generate(ex, model=model, stream=stream, pieces=_pieces(ex.knobs["chunks"]))


ROUTES: dict[tuple[str, str], Callable[[_Exchange], Awaitable[None]]] = {
    ("POST", gemini_native.ROUTE): _generate_content,
    ("POST", "/v1/chat/completions"): _chat,
    ("POST", "/v1/messages"): _messages,
    ("POST", "/v1/messages/count_tokens"): _count_tokens,
    ("POST", "/v1/embeddings"): _embeddings,
    ("POST", "/v1/responses"): _responses,
    ("POST", "/v1/responses/compact"): _compact,
    ("GET", "/v1/models"): _models,
    ("POST", converse.ROUTE): converse.handle,
}


class UpstreamApp:
    """The ASGI application. Each instance has its own settings, counters and last requests."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.settings: dict[str, Any] = dict(DEFAULTS)
        self.requests = self.in_flight = self.completed = self.disconnected = 0
        self.by_path: dict[str, int] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.store = jobs.JobStore(ROUTES)  # files and jobs
        self.tokens = vertex.Tokens()  # Vertex: the access tokens issued by /token

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_path": dict(self.by_path),
            "in_flight": self.in_flight,
            "completed": self.completed,
            "disconnected": self.disconnected,
            "token_grants": self.tokens.grants,
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # only used when served with lifespan on
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        ex = _Exchange(receive, send)
        qs = scope.get("query_string", b"").decode("latin-1")
        ex.query = {k: v[-1] for k, v in parse_qs(qs).items()}
        if path.startswith(azure.PREFIX):
            v1_path, deployment, refusal = azure.to_v1(path, ex.query, headers)
            if refusal is not None:
                self.last[path] = {"method": method, "headers": headers, "query": ex.query}
                await ex.json(*refusal)
                return
            ex.deployment = deployment
            await self._v1(ex, method, v1_path, headers, raw, seen_as=path)
        elif path.startswith(gemini.PREFIX):
            v1_path, refusal = gemini.to_v1(path, headers)
            if refusal is not None:
                self.last[path] = {"method": method, "headers": headers, "query": ex.query}
                await ex.json(*refusal)
                return
            await self._v1(ex, method, v1_path, headers, raw, seen_as=path)
        elif path.startswith(bedrock.PREFIX):
            host = headers.get("host", "")
            raw_path = scope.get("raw_path", path.encode()).decode("latin-1")
            speaks = converse if converse.PATH.fullmatch(raw_path) else bedrock  # Converse or InvokeModel
            body, refusal = speaks.to_v1(method, host, raw_path, qs, headers, raw)
            if refusal is not None:
                self.last[path] = {"method": method, "headers": headers, "query": ex.query}
                await _aws_error(ex, *refusal)
                return
            handler_path = converse.ROUTE if speaks is converse else "/v1/messages"
            if body["stream"]:
                encoder = converse.encode_frame if speaks is converse else bedrock.Encoder()
                ex.stream_type, ex.encode_frame = bedrock.EVENT_STREAM, encoder
            await self._v1(ex, method, handler_path, headers, json.dumps(body).encode(), seen_as=path, raw_seen=raw)
        elif path == vertex.TOKEN_PATH and method == "POST":
            status, answer = self.tokens.grant(raw)
            self.last[path] = {"method": method, "headers": headers, "body": raw.decode("latin-1")}
            await ex.json(status, answer)
        elif path.startswith(vertex.PREFIX):
            try:
                sent: Any = json.loads(raw or b"{}")
            except ValueError:
                sent = None
            v1_path, body, refusal = vertex.to_v1(path, headers, sent, self.tokens)
            if refusal is not None:
                self.last[path] = {"method": method, "headers": headers, "query": ex.query}
                await ex.json(*refusal)
                return
            await self._v1(ex, method, v1_path, headers, json.dumps(body).encode(), seen_as=path, raw_seen=raw)
        elif path.startswith(gemini_native.PREFIX):
            model, streamed, refusal = gemini_native.parse(path, ex.query, headers)
            if refusal is not None:
                self.last[path] = {"method": method, "headers": headers, "query": ex.query}
                await ex.json(*refusal)
                return
            ex.gemini_call = (model, streamed)
            await self._v1(ex, method, gemini_native.ROUTE, headers, raw, seen_as=path)
        elif path.startswith("/v1/"):
            await self._v1(ex, method, path, headers, raw)
        else:
            await self._control(ex, method, path, scope.get("query_string", b""), raw)

    # -- control plane -------------------------------------------------------------------

    async def _control(self, ex: _Exchange, method: str, path: str, qs: bytes, raw: bytes) -> None:
        if (method, path) == ("POST", "/_control"):
            try:
                updates = json.loads(raw or b"{}")
                if not isinstance(updates, dict):
                    raise ValueError("body must be a JSON object")
                coerced = {k: _coerce(k, v) for k, v in updates.items()}
            except ValueError as exc:  # JSONDecodeError is a ValueError
                await ex.json(400, {"error": str(exc)})
                return
            self.settings.update(coerced)
            await ex.json(200, {"settings": self.settings})
        elif (method, path) == ("GET", "/_control"):
            await ex.json(200, {"settings": self.settings})
        elif (method, path) == ("POST", "/_reset"):
            self.reset()
            await ex.json(200, {"settings": self.settings})
        elif path.startswith("/_control/jobs"):
            status, body = jobs.control(self.store, method, path, raw)
            await ex.json(status, body)
        elif (method, path) == ("GET", "/_stats"):
            await ex.json(200, self.stats())
        elif (method, path) == ("GET", "/_last"):
            wanted = parse_qs(qs.decode("latin-1")).get("path", [""])[0]
            if wanted in self.last:
                await ex.json(200, self.last[wanted])
            else:
                await ex.json(404, {"error": f"no request recorded for path {wanted!r}"})
        else:
            await ex.json(404, {"error": f"unknown path {method} {path}"})

    async def _v1(
        self,
        ex: _Exchange,
        method: str,
        path: str,
        hdrs: Headers,
        raw: bytes,
        seen_as: str | None = None,
        raw_seen: bytes | None = None,  # the body as sent, when it was rewritten for the handler
    ) -> None:
        self.requests += 1
        number = self.requests  # fail_every is keyed on this global, 1-based counter
        self.by_path[path] = self.by_path.get(path, 0) + 1
        self.in_flight += 1
        dialect = "anthropic" if path.startswith("/v1/messages") else "openai"
        if path == gemini_native.ROUTE:
            dialect = "gemini"
        ex.watch()
        ex.headers, ex.store = hdrs, self.store
        try:
            try:
                body: Any = json.loads(raw) if raw else {}
            except ValueError:
                body = raw.decode("utf-8", "replace")
            if hdrs.get("content-type", "").startswith("multipart/form-data"):
                try:
                    body, ex.uploads = files.parse_multipart(raw, hdrs["content-type"])
                except ValueError as exc:
                    body = f"malformed multipart body: {exc}"
            self.last[seen_as or path] = {"method": method, "body": body, "headers": hdrs, "query": ex.query}
            if raw_seen is not None:
                self.last[seen_as or path]["body"] = json.loads(raw_seen)
            handler = ROUTES.get((method, path)) or job_routes.route(self.store, method, path)
            try:
                ex.knobs = dict(self.settings)
                for name, value in hdrs.items():
                    if name.startswith(HEADER_PREFIX):
                        knob = name[len(HEADER_PREFIX) :].replace("-", "_")
                        ex.knobs[knob] = _coerce(knob, value)
                if handler is None:
                    raise LookupError(f"unknown endpoint {method} {path}")
                if not isinstance(body, dict):
                    raise ValueError("request body must be a JSON object")
            except (ValueError, LookupError) as exc:
                status = 404 if isinstance(exc, LookupError) else 400
                await ex.json(status, _error_body(dialect, status, str(exc)))
                return
            if ex.deployment:  # Azure: the deployment names the model, whatever the body says
                body = {**body, "model": ex.deployment}
            ex.body = body
            every = ex.knobs["fail_every"]
            ex.fail = ex.knobs["fail"] if every <= 0 or number % every == 0 else ""

            if ex.fail in {"400", "429", "500", "503"} and path == converse.ROUTE:
                await _aws_error(ex, *converse.error(int(ex.fail), f"fake upstream {ex.fail}"))
            elif ex.fail in {"400", "429", "500", "503"}:
                status = int(ex.fail)
                await ex.json(status, _error_body(dialect, status, f"fake upstream {status}"))
            elif ex.fail == "close":
                await ex.abort()
            elif ex.fail == "stall":
                if await ex.wait(STALL_CAP_S):
                    await ex.abort()
            elif await ex.wait(ex.knobs["delay_ms"] / 1000):
                try:
                    await handler(ex)
                except files.ApiError as exc:  # a file or job endpoint refusing the request
                    await ex.json(exc.status, _error_body(dialect, exc.status, str(exc)))
        finally:
            self.in_flight -= 1
            self.completed += ex.completed
            self.disconnected += ex.client_gone
            ex.close()


async def _aws_error(ex: _Exchange, status: int, headers: dict[str, str], body: dict[str, Any]) -> None:
    """An AWS error: its JSON body, the exception named in a header."""
    await ex.start(status, "application/json", *((k.encode(), v.encode()) for k, v in headers.items()))
    await ex.body_chunk(json.dumps(body).encode())


app = UpstreamApp()  # for ``uvicorn tests.upstream.server:app``


@dataclass
class UpstreamHandle:
    """A fake upstream served from a daemon thread. Also usable as a context manager."""

    app: UpstreamApp
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        # force_exit skips uvicorn's wait for open connections (e.g. a stalled request).
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(timeout)

    def control(self, **knobs: Any) -> dict[str, Any]:
        return httpx.post(f"{self.url}/_control", json=knobs).raise_for_status().json()

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset").raise_for_status()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_stats").raise_for_status().json()

    def last(self, path: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_last", params={"path": path}).raise_for_status().json()

    def job(self, job_id: str, state: str, done: int | None = None) -> dict[str, Any]:
        """Move a job (see tests/upstream/jobs.py); returns its provider object."""
        payload: dict[str, Any] = {"state": state} if done is None else {"state": state, "done": done}
        return httpx.post(f"{self.url}/_control/jobs/{job_id}", json=payload).raise_for_status().json()

    def jobs(self) -> list[dict[str, Any]]:
        """Every job with its state and what it billed."""
        return httpx.get(f"{self.url}/_control/jobs").raise_for_status().json()["jobs"]

    def __enter__(self) -> UpstreamHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_in_thread(port: int = 0, host: str = "127.0.0.1", timeout: float = 10.0) -> UpstreamHandle:
    """Serve a fresh ``UpstreamApp`` in a daemon thread; port 0 picks a free port."""
    upstream = UpstreamApp()
    server = uvicorn.Server(uvicorn.Config(upstream, host=host, port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"fake-upstream-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:  # set once the sockets are listening
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"fake upstream failed to start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return UpstreamHandle(app=upstream, server=server, thread=thread, host=host, port=bound)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18001)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, lifespan="off", log_level=args.log_level)


if __name__ == "__main__":
    main()
