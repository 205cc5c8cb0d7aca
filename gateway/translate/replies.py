"""A target's non-streamed answer and its errors, in the format of the endpoint that was
called. Usage is billed from the target's own body before this runs (gateway/upstream/proxy.py); these
only reshape what the client reads."""

from __future__ import annotations

import json
from typing import Any

FINISH_TO_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
STOP_TO_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}


def _int(d: Any, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_to_chat(u: Any) -> dict:
    """Anthropic usage as OpenAI's: the prompt counts every input token, cached or not."""
    read, written = _int(u, "cache_read_input_tokens"), _int(u, "cache_creation_input_tokens")
    prompt = _int(u, "input_tokens") + read + written
    output = _int(u, "output_tokens")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": read},
    }


def usage_to_messages(u: Any) -> dict:
    """OpenAI usage as Anthropic's: cached prompt tokens are cache reads; output is what the
    total counts beyond the prompt when more (thinking tokens some targets count only there)."""
    prompt = _int(u, "prompt_tokens")
    cached = _int(u.get("prompt_tokens_details") if isinstance(u, dict) else None, "cached_tokens")
    output = max(_int(u, "completion_tokens"), _int(u, "total_tokens") - prompt)
    return {
        "input_tokens": max(prompt - cached, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }


def tool_input(arguments: Any) -> dict:
    """A tool call's JSON arguments as the object Anthropic's tool_use input is."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def message_to_chat(msg: dict, model: str) -> dict:
    text = "".join(b.get("text", "") for b in msg.get("content") or [] if b.get("type") == "text")
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)},
        }
        for b in msg.get("content") or []
        if b.get("type") == "tool_use"
    ]
    message: dict = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{msg.get('id', '')}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": STOP_TO_FINISH.get(str(msg.get("stop_reason")), "stop"),
            }
        ],
        "usage": usage_to_chat(msg.get("usage")),
    }


def completion_to_message(completion: dict, model: str) -> dict:
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict] = []
    text = message.get("content") or message.get("refusal")
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": tool_input(function.get("arguments")),
            }
        )
    return {
        "id": f"msg_{completion.get('id', '')}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": FINISH_TO_STOP.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": usage_to_messages(completion.get("usage")),
    }


def reply(data: bytes, *, upstream: str, client: str, model: str) -> bytes:
    """A 200 body from a target speaking `upstream`, as the `client` endpoint answers."""
    parsed = json.loads(data)
    out = message_to_chat(parsed, model) if client == "chat" else completion_to_message(parsed, model)
    return json.dumps(out).encode()


# Anthropic error types by status, for an OpenAI error relayed to /v1/messages.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error(data: bytes, *, status: int, client: str) -> bytes:
    """A target's error body in the endpoint's own shape, its message kept."""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    message = str(inner.get("message") if isinstance(inner, dict) else data.decode("utf-8", "replace"))[:2000]
    kind = str(inner.get("type")) if isinstance(inner, dict) and inner.get("type") else None
    if client == "messages":
        body: dict = {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    else:
        code = inner.get("code") if isinstance(inner, dict) else None
        body = {"error": {"message": message, "type": kind or "api_error", "code": code, "param": None}}
    return json.dumps(body).encode()
