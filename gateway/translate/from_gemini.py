"""A Gemini generateContent answer, its stream and its errors, in the format of the endpoint that
was called (a messages client reads them through the chat shape: one mapping of Gemini's answer).
Usage is billed from Gemini's own body or events first (gateway/providers/gemini_native.py); these
only reshape what the client reads.

- `completion_from`: a GenerateContentResponse as a chat completion;
- `ChatFromGemini`: a `streamGenerateContent?alt=sse` stream as chat.completion.chunk events,
  `MessagesFromGemini` as Anthropic's event sequence;
- `error`: Google's `{"error": {"code", "message", "status"}}` in the endpoint's error shape.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.translate import replies
from gateway.translate.streaming import MessagesFromChat

FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "MODEL_ARMOR": "content_filter",
}


def _count(d: Any, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_to_chat(u: Any) -> dict:
    """Gemini's usageMetadata as OpenAI's usage: the prompt counts cached and tool-use prompt
    tokens, the completion counts thinking tokens (billed as output)."""
    prompt = _count(u, "promptTokenCount") + _count(u, "toolUsePromptTokenCount")
    thoughts = _count(u, "thoughtsTokenCount")
    completion = _count(u, "candidatesTokenCount") + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": _count(u, "cachedContentTokenCount")},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


def _call_id(call: dict) -> str:
    given = call.get("id")
    return given if isinstance(given, str) and given else f"call_{uuid.uuid4().hex[:24]}"


def _finish(reason: Any, calls: bool) -> str:
    if calls and reason in (None, "STOP"):
        return "tool_calls"
    return FINISH.get(str(reason), "stop")


def _candidate(candidate: dict) -> tuple[str, list[dict]]:
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict) and not p.get("thought"))
    calls = [
        {
            "id": _call_id(p["functionCall"]),
            "type": "function",
            "function": {
                "name": p["functionCall"].get("name"),
                "arguments": json.dumps(p["functionCall"].get("args") or {}, ensure_ascii=False),
            },
        }
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
    ]
    return text, calls


def completion_from(answer: dict, model: str) -> dict:
    """A generateContent answer as a chat completion (a blocked prompt: one empty choice
    finished by content_filter)."""
    choices = []
    candidates = answer.get("candidates") or [{"finishReason": "SAFETY"}]
    for i, candidate in enumerate(candidates):
        text, calls = _candidate(candidate)
        message: dict = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
        if calls:
            message["tool_calls"] = calls
        choices.append(
            {
                "index": candidate.get("index", i),
                "message": message,
                "logprobs": None,
                "finish_reason": _finish(candidate.get("finishReason"), bool(calls)),
            }
        )
    return {
        "id": f"chatcmpl-{answer.get('responseId') or uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": 0,
        "model": str(answer.get("modelVersion") or model),
        "choices": choices,
        "usage": usage_to_chat(answer.get("usageMetadata")),
    }


def _sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode()


class ChatFromGemini:
    """A streamGenerateContent stream (each event a partial GenerateContentResponse, usage
    cumulative) read by a chat completions client. The stream has no end marker of its own:
    the usage chunk and [DONE] follow only once a candidate finished, so a stream the target
    ends early ends early here too."""

    def __init__(self, *, wants_usage: bool):
        self.wants_usage = wants_usage
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.model = ""
        self.usage: Any = None
        self.started: set[int] = set()
        self.calls: dict[int, int] = {}  # candidate index -> tool calls streamed so far
        self.finished = False

    def _chunk(self, index: int, delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse(
            {"id": self.id, "object": "chat.completion.chunk", "created": 0, "model": self.model, "choices": [choice]}
        )

    def feed(self, data: bytes) -> list[bytes]:
        try:
            event = json.loads(data)
        except ValueError:
            return []
        if not isinstance(event, dict):
            return []
        if isinstance(event.get("error"), dict):
            error = event["error"]
            return [_sse({"error": {"message": error.get("message"), "type": error.get("status"), "code": None}})]
        self.model = str(event.get("modelVersion") or self.model)
        if event.get("usageMetadata") is not None:
            self.usage = event["usageMetadata"]
        out: list[bytes] = []
        candidates = event.get("candidates") or []
        if not candidates and (event.get("promptFeedback") or {}).get("blockReason"):
            candidates = [{"index": 0, "finishReason": "SAFETY"}]
        for position, candidate in enumerate(candidates):
            index = candidate.get("index", position)
            if index not in self.started:
                self.started.add(index)
                out.append(self._chunk(index, {"role": "assistant", "content": ""}))
            text, calls = _candidate(candidate)
            if text:
                out.append(self._chunk(index, {"content": text}))
            for call in calls:  # Gemini sends each call whole: its name and arguments at once
                k = self.calls.get(index, 0)
                self.calls[index] = k + 1
                out.append(self._chunk(index, {"tool_calls": [{"index": k, **call}]}))
            reason = candidate.get("finishReason")
            if reason:
                self.finished = True
                out.append(self._chunk(index, {}, _finish(reason, bool(self.calls.get(index)))))
        return out

    def end(self) -> list[bytes]:
        if not self.finished:
            return []
        out = []
        if self.wants_usage:
            out.append(
                _sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": self.model,
                        "choices": [],
                        "usage": usage_to_chat(self.usage),
                    }
                )
            )
        return [*out, b"data: [DONE]"]


class MessagesFromGemini:
    """A Gemini stream read by a messages client: through the chat chunks it reads as, into
    Anthropic's event sequence (its usage from Gemini's last usageMetadata)."""

    def __init__(self) -> None:
        self.chat = ChatFromGemini(wants_usage=True)
        self.messages = MessagesFromChat()

    def _relay(self, chunks: list[bytes]) -> list[bytes]:
        return [event for chunk in chunks for event in self.messages.feed(chunk.removeprefix(b"data: "))]

    def feed(self, data: bytes) -> list[bytes]:
        return self._relay(self.chat.feed(data))

    def end(self) -> list[bytes]:
        return self._relay(self.chat.end()) + self.messages.end()


def reply(data: bytes, *, client: str, model: str) -> bytes:
    """A generateContent 200 body as the `client` endpoint answers."""
    completion = completion_from(json.loads(data), model)
    out = completion if client == "chat" else replies.completion_to_message(completion, model)
    return json.dumps(out).encode()


# OpenAI error types by status, for a Google error relayed to /v1/chat/completions.
_OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}


def error(data: bytes, *, status: int, client: str) -> bytes:
    """Google's error body in the endpoint's own shape, its message kept (its status, such as
    INVALID_ARGUMENT, as OpenAI's code)."""
    if client == "messages":
        return replies.error(data, status=status, client=client)
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    message = str(inner.get("message") if isinstance(inner, dict) else data.decode("utf-8", "replace"))[:2000]
    grpc = inner.get("status") if isinstance(inner, dict) else None
    code = grpc.lower() if isinstance(grpc, str) else None
    body = {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "api_error"), "code": code, "param": None}}
    return json.dumps(body).encode()
