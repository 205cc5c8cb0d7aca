"""A Bedrock Converse answer, its stream and its errors, in the format of the endpoint that was
called. Usage is billed from Converse's own `usage` before this runs; these only reshape what the
client reads.

Converse's message is Anthropic's in other words (content blocks, toolUse, stop reasons), so it
is read as an Anthropic message first, and a chat client gets that message as the existing
messages -> chat mapping makes it (gateway/translate/replies.py, streaming.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.translate.replies import message_to_chat
from gateway.translate.streaming import ChatFromMessages, _sse

# Converse stop reasons as Anthropic's (chat's finish_reason follows from those).
STOP_REASONS = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "model_context_window_exceeded": "model_context_window_exceeded",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
    "malformed_model_output": "end_turn",
    "malformed_tool_use": "end_turn",
}


def _int(d: Any, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_to_messages(u: Any) -> dict:
    """Converse usage as Anthropic's: inputTokens leave the cache reads and writes out, as
    Anthropic's input_tokens do."""
    return {
        "input_tokens": _int(u, "inputTokens"),
        "cache_creation_input_tokens": _int(u, "cacheWriteInputTokens"),
        "cache_read_input_tokens": _int(u, "cacheReadInputTokens"),
        "output_tokens": _int(u, "outputTokens"),
    }


def _block(block: Any) -> dict | None:
    if not isinstance(block, dict):
        return None
    if isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    use = block.get("toolUse")
    if isinstance(use, dict):
        return {
            "type": "tool_use",
            "id": use.get("toolUseId"),
            "name": use.get("name"),
            "input": use.get("input") or {},
        }
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict):
        text = reasoning.get("reasoningText")
        if isinstance(text, dict):
            return {
                "type": "thinking",
                "thinking": str(text.get("text") or ""),
                "signature": text.get("signature") or "",
            }
        if reasoning.get("redactedContent") is not None:
            return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    return None  # citations, images: nothing a message client of this translation reads


def converse_to_message(resp: dict, model: str) -> dict:
    message = (resp.get("output") or {}).get("message") or {}
    content = [b for b in (_block(b) for b in message.get("content") or []) if b is not None]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(str(resp.get("stopReason")), "end_turn"),
        "stop_sequence": None,
        "usage": usage_to_messages(resp.get("usage")),
    }


def reply(data: bytes, *, client: str, model: str) -> bytes:
    """A 200 Converse body as the `client` endpoint answers."""
    message = converse_to_message(json.loads(data), model)
    return json.dumps(message if client == "messages" else message_to_chat(message, model)).encode()


# Converse's errors by status, as each endpoint names them.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    424: "api_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout",
    424: "server_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def error(data: bytes, *, status: int, client: str) -> bytes:
    """A Converse error (`{"message": ...}`, the exception named in x-amzn-ErrorType) in the
    endpoint's own shape, its message kept."""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    message = parsed.get("message") or parsed.get("Message") if isinstance(parsed, dict) else None
    text = str(message if message is not None else data.decode("utf-8", "replace"))[:2000]
    if client == "messages":
        return json.dumps(
            {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": text}}
        ).encode()
    kind = _OPENAI_TYPES.get(status, "server_error")
    return json.dumps({"error": {"message": text, "type": kind, "code": None, "param": None}}).encode()


class MessagesFromConverse:
    """A Converse stream (one JSON object per event, named by its one key, as boto3 shows it),
    read by a messages client. Text and reasoning blocks have no contentBlockStart in Converse:
    their first delta opens them. The usage arrives in `metadata`, after `messageStop`, so
    message_delta and message_stop are sent then."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.started = False
        self.finished = False
        self.open: dict[int, int] = {}  # Converse block index -> Anthropic block index
        self.blocks = 0  # Anthropic blocks opened so far (their indices are 0, 1, ...)
        self.stop: str | None = None

    def _start(self) -> list[dict]:
        self.started = True
        message: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _open(self, index: int, block: dict) -> list[dict]:
        self.open[index] = self.blocks
        self.blocks += 1
        return [{"type": "content_block_start", "index": self.open[index], "content_block": block}]

    def _finish(self, usage: Any) -> list[dict]:
        self.finished = True
        out = [{"type": "content_block_stop", "index": self.open.pop(i)} for i in sorted(self.open)]
        delta = {"stop_reason": STOP_REASONS.get(str(self.stop), "end_turn"), "stop_sequence": None}
        out.append({"type": "message_delta", "delta": delta, "usage": usage_to_messages(usage)})
        out.append({"type": "message_stop"})
        return out

    def events(self, data: bytes) -> list[dict]:
        """The Anthropic events one Converse event becomes."""
        if self.finished:
            return []
        try:
            event = json.loads(data)
        except ValueError:
            return []
        if not isinstance(event, dict) or len(event) != 1:
            return []
        ((name, body),) = event.items()
        body = body if isinstance(body, dict) else {}
        out = [] if self.started or name.endswith("Exception") else self._start()
        index = body.get("contentBlockIndex", 0)
        if name == "contentBlockStart":
            use = (body.get("start") or {}).get("toolUse")
            if isinstance(use, dict) and index not in self.open:
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": use.get("toolUseId"),
                    "name": use.get("name"),
                    "input": {},
                }
                out += self._open(index, block)
        elif name == "contentBlockDelta":
            out += self._delta(index, body.get("delta") or {})
        elif name == "contentBlockStop":
            if index in self.open:
                out.append({"type": "content_block_stop", "index": self.open.pop(index)})
        elif name == "messageStop":
            self.stop = str(body.get("stopReason"))
        elif name == "metadata":
            out += self._finish(body.get("usage"))
        elif name.endswith("Exception"):
            kind = _ANTHROPIC_TYPES.get(429 if name == "throttlingException" else 500, "api_error")
            if name == "serviceUnavailableException":
                kind = "overloaded_error"
            out.append({"type": "error", "error": {"type": kind, "message": str(body.get("message") or name)}})
            self.finished = True
        return out

    def _delta(self, index: int, delta: dict) -> list[dict]:
        out: list[dict] = []
        if isinstance(delta.get("text"), str):
            if index not in self.open:
                out += self._open(index, {"type": "text", "text": ""})
            out.append(
                {
                    "type": "content_block_delta",
                    "index": self.open[index],
                    "delta": {"type": "text_delta", "text": delta["text"]},
                }
            )
        elif isinstance(delta.get("toolUse"), dict) and index in self.open:
            partial = str(delta["toolUse"].get("input") or "")
            out.append(
                {
                    "type": "content_block_delta",
                    "index": self.open[index],
                    "delta": {"type": "input_json_delta", "partial_json": partial},
                }
            )
        elif isinstance(delta.get("reasoningContent"), dict):
            reasoning = delta["reasoningContent"]
            if index not in self.open:
                out += self._open(index, {"type": "thinking", "thinking": ""})
            if isinstance(reasoning.get("text"), str):
                piece = {"type": "thinking_delta", "thinking": reasoning["text"]}
            elif isinstance(reasoning.get("signature"), str):
                piece = {"type": "signature_delta", "signature": reasoning["signature"]}
            else:
                return out
            out.append({"type": "content_block_delta", "index": self.open[index], "delta": piece})
        return out

    def feed(self, data: bytes) -> list[bytes]:
        return [_sse(e, e["type"]) for e in self.events(data)]

    def end(self) -> list[bytes]:
        """The stream ended without its metadata event: closed only if Converse said it stopped."""
        if self.started and not self.finished and self.stop is not None:
            return [_sse(e, e["type"]) for e in self._finish(None)]
        return []


class ChatFromConverse:
    """A Converse stream read by a chat completions client: Converse's events as Anthropic's,
    then those as chat.completion.chunk events."""

    def __init__(self, *, wants_usage: bool) -> None:
        self.messages = MessagesFromConverse()
        self.chat = ChatFromMessages(wants_usage=wants_usage)

    def _chat(self, events: list[dict]) -> list[bytes]:
        return [raw for e in events for raw in self.chat.feed(json.dumps(e).encode())]

    def feed(self, data: bytes) -> list[bytes]:
        return self._chat(self.messages.events(data))

    def end(self) -> list[bytes]:
        if self.messages.started and not self.messages.finished and self.messages.stop is not None:
            return self._chat(self.messages._finish(None))
        return []
