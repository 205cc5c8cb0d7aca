"""A target's stream as the endpoint's own event sequence.

chat clients get `chat.completion.chunk` events ending in `data: [DONE]` (with the usage chunk
when they asked for it); messages clients get message_start, content_block_start/delta/stop,
message_delta (with the usage) and message_stop. Usage is billed from the target's own events
(gateway/upstream/streams.py feeds them to StreamUsage first); a translator only reshapes what the client
reads. A stream the target ends early ends early here too, without the closing events, so the
client sees it broken, as it would without translation.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.translate.replies import FINISH_TO_STOP, STOP_TO_FINISH, tool_input, usage_to_chat, usage_to_messages

__all__ = ["ChatFromMessages", "MessagesFromChat", "tool_input"]


def _sse(data: dict, event: str | None = None) -> bytes:
    body = json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\ndata: {body}" if event else f"data: {body}").encode()


class ChatFromMessages:
    """An Anthropic messages stream, read by a chat completions client."""

    def __init__(self, *, wants_usage: bool):
        self.wants_usage = wants_usage
        self.id = ""
        self.model = ""
        self.usage: dict = {}
        self.tools: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse(
            {"id": self.id, "object": "chat.completion.chunk", "created": 0, "model": self.model, "choices": [choice]}
        )

    def feed(self, data: bytes) -> list[bytes]:
        try:
            event = json.loads(data)
        except ValueError:
            return []
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            message = event.get("message") or {}
            self.id = f"chatcmpl-{message.get('id', '')}"
            self.model = str(message.get("model") or "")
            self.usage = dict(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                k = self.tools[event.get("index", 0)] = len(self.tools)
                call = {
                    "index": k,
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": ""},
                }
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta" and event.get("index", 0) in self.tools:
                call = {
                    "index": self.tools[event.get("index", 0)],
                    "function": {"arguments": delta.get("partial_json", "")},
                }
                return [self._chunk({"tool_calls": [call]})]
            return []  # thinking and signature deltas: chat completions has no place for them
        if kind == "message_delta":
            self.usage.update(event.get("usage") or {})
            stop = (event.get("delta") or {}).get("stop_reason")
            return [self._chunk({}, STOP_TO_FINISH.get(str(stop), "stop"))]
        if kind == "message_stop":
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
        if kind == "error":
            error = event.get("error") or {}
            return [
                _sse(
                    {"error": {"message": error.get("message"), "type": error.get("type"), "code": None, "param": None}}
                )
            ]
        return []  # ping

    def end(self) -> list[bytes]:
        return []


class MessagesFromChat:
    """An OpenAI chat completions stream, read by a messages client."""

    def __init__(self, *, model: str = ""):
        self.model = model
        self.started = False
        self.finished = False
        self.open: int | None = None  # the content block being streamed
        self.open_kind = ""
        self.blocks = 0
        self.tools: dict[int, int] = {}  # OpenAI tool_calls index -> Anthropic block index
        self.stop: str | None = None
        self.usage: Any = None

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        return [_sse({"type": "content_block_stop", "index": index}, "content_block_stop")]

    def _open(self, block: dict, kind: str) -> list[bytes]:
        out = self._close()
        self.open, self.open_kind = self.blocks, kind
        self.blocks += 1
        start = {"type": "content_block_start", "index": self.open, "content_block": block}
        return [*out, _sse(start, "content_block_start")]

    def _start(self, chunk: dict) -> list[bytes]:
        self.started = True
        self.model = str(chunk.get("model") or self.model)
        message: dict[str, Any] = {
            "id": f"msg_{chunk.get('id', '')}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [_sse({"type": "message_start", "message": message}, "message_start")]

    def _finish(self) -> list[bytes]:
        self.finished = True
        delta = {"stop_reason": FINISH_TO_STOP.get(str(self.stop), "end_turn"), "stop_sequence": None}
        out = self._close()
        out.append(
            _sse(
                {"type": "message_delta", "delta": delta, "usage": usage_to_messages(self.usage or {})}, "message_delta"
            )
        )
        out.append(_sse({"type": "message_stop"}, "message_stop"))
        return out

    def feed(self, data: bytes) -> list[bytes]:
        if self.finished:
            return []
        if data.strip() == b"[DONE]":
            return self._finish() if self.started else []
        try:
            chunk = json.loads(data)
        except ValueError:
            return []
        if not isinstance(chunk, dict):
            return []
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            return [
                _sse({"type": "error", "error": {"type": "api_error", "message": str(error.get("message"))}}, "error")
            ]
        out = [] if self.started else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("refusal")
            if text:
                if self.open_kind != "text" or self.open is None:
                    out += self._open({"type": "text", "text": ""}, "text")
                out.append(
                    _sse(
                        {
                            "type": "content_block_delta",
                            "index": self.open,
                            "delta": {"type": "text_delta", "text": text},
                        },
                        "content_block_delta",
                    )
                )
            for call in delta.get("tool_calls") or []:
                k = call.get("index", 0)
                function = call.get("function") or {}
                if k not in self.tools:
                    block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": {}}
                    out += self._open(block, "tool")
                    self.tools[k] = self.blocks - 1
                if function.get("arguments"):
                    out.append(
                        _sse(
                            {
                                "type": "content_block_delta",
                                "index": self.tools[k],
                                "delta": {"type": "input_json_delta", "partial_json": function["arguments"]},
                            },
                            "content_block_delta",
                        )
                    )
            if choice.get("finish_reason"):
                self.stop = choice["finish_reason"]
        return out

    def end(self) -> list[bytes]:
        """The stream ended without [DONE]: close it only if the target said it finished."""
        return self._finish() if self.started and not self.finished and self.stop is not None else []
