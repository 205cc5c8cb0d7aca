"""Validate gateway request bodies and bound what they can be billed for (DESIGN §5).

The input bound is the whole billed body in UTF-8 bytes plus framing overhead: a byte-level BPE
token covers at least one byte, so bytes bound tokens for any such tokenizer — unlike an
estimate (chars / 3), which CJK, code and digits beat. Image parts are bounded by the model's
own per-image maximum, not by their base64 size; parts nothing can bound are reported so the
caller can refuse them under a blocking cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from gateway.errors import bad_request

MAX_CHOICES = 8
MAX_OUTPUT_TOKENS_ACCEPTED = 1_000_000
# Parameters each endpoint accepts. An unknown one could change what the provider bills in a
# way the bound cannot see, so it is refused rather than passed through.
ALLOWED = {
    "chat": {
        "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
        "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "service_tier", "stop",
        "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user",
        "function_call", "functions", "metadata", "store", "reasoning_effort", "prediction", "modalities", "audio",
        "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
    },
    "messages": {
        "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature", "top_p",
        "top_k", "tools", "tool_choice", "thinking", "service_tier",
    },
    "embeddings": {"model", "input", "encoding_format", "dimensions", "user"},
}
# Parameters that buy output the token bound does not cover (audio out, paid tool calls).
_UNBOUNDED_PARAMS = {"audio", "web_search_options"}
_IMAGE_PARTS = {"image_url", "image", "input_image"}
_UNBOUNDED_PARTS = {"input_audio", "audio", "file", "document", "input_file", "video"}


@dataclass(frozen=True)
class Shape:
    """What the gateway needs to know about a request body to admit it."""

    kind: str  # chat | messages | embeddings
    model: str
    text_tokens: int  # bound on input tokens from text (bytes + overhead)
    images: int  # image parts, each bounded by the model's max image tokens
    unbounded_parts: int  # parts (audio, files) the catalog cannot bound
    max_output: int | None  # what the caller asked for
    output_param: str | None  # which field carried it
    choices: int
    stream: bool


def _require_dict(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def parse_json(raw: bytes) -> dict:
    # The one limited loader (config/jsonlimits.py): a deeply nested body is a 400, not a
    # RecursionError. The body's size is already bounded by MAX_BODY_BYTES (413) when read.
    from config import jsonlimits

    try:
        return _require_dict(jsonlimits.loads(raw))
    except jsonlimits.JSONLimitError as exc:
        raise bad_request(exc.message, code=exc.code) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from None


def _check_params(body: dict, kind: str) -> int:
    unknown = sorted(set(body) - ALLOWED[kind])
    if unknown:
        raise bad_request(f"Unsupported parameter: '{unknown[0]}'.", param=unknown[0], code="unsupported_parameter")
    return sum(1 for p in _UNBOUNDED_PARAMS if body.get(p) is not None)


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    return model


def _positive_int(body: dict, field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{field}' must be an integer.", param=field)
    if not 1 <= value <= MAX_OUTPUT_TOKENS_ACCEPTED:
        raise bad_request(f"'{field}' must be between 1 and {MAX_OUTPUT_TOKENS_ACCEPTED}.", param=field)
    return value


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    return stream


class _PartCounter:
    """Walks content parts, counting images and unboundable parts and blanking their payload
    so their base64 bytes do not inflate the text bound."""

    def __init__(self) -> None:
        self.images = 0
        self.unbounded = 0

    def strip(self, content: Any) -> Any:
        if isinstance(content, list):
            out = []
            for part in content:
                if isinstance(part, dict) and part.get("type") in _IMAGE_PARTS:
                    self.images += 1
                    out.append({"type": part["type"]})
                elif isinstance(part, dict) and part.get("type") in _UNBOUNDED_PARTS:
                    self.unbounded += 1
                    out.append({"type": part["type"]})
                elif isinstance(part, dict) and part.get("type") == "tool_result":
                    out.append({**part, "content": self.strip(part.get("content"))})
                else:
                    out.append(part)
            return out
        return content


def _text_tokens(billed: dict, messages: list) -> int:
    raw = json.dumps(billed, ensure_ascii=False, separators=(",", ":")).encode()
    cfg = settings.CAPGATE
    return len(raw) + cfg["PER_MESSAGE_OVERHEAD_TOKENS"] * len(messages) + cfg["PER_REQUEST_OVERHEAD_TOKENS"]


def _messages(body: dict, *, allow_system_role: bool = True) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
        if "content" in message and not isinstance(message["content"], str | list | type(None)):
            raise bad_request(f"messages[{i}].content must be a string or an array.", param=f"messages[{i}].content")
    return messages


def shape_chat(body: dict) -> Shape:
    unbounded_params = _check_params(body, "chat")
    model = _model(body)
    messages = _messages(body)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be an integer between 1 and {MAX_CHOICES}.", param="n")
    max_completion = _positive_int(body, "max_completion_tokens")
    max_tokens = _positive_int(body, "max_tokens")
    param: str | None
    max_output, param = (max_completion, "max_completion_tokens") if max_completion else (max_tokens, "max_tokens")
    if max_output is None:
        param = None
    parts = _PartCounter()
    billed = {**body, "messages": [{**m, "content": parts.strip(m.get("content"))} for m in messages]}
    return Shape(
        kind="chat", model=model, text_tokens=_text_tokens(billed, messages), images=parts.images,
        unbounded_parts=parts.unbounded + unbounded_params, max_output=max_output, output_param=param, choices=n, stream=_stream(body),
    )


def shape_messages(body: dict) -> Shape:
    _check_params(body, "messages")
    model = _model(body)
    messages = _messages(body)
    max_tokens = _positive_int(body, "max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise bad_request("'system' must be a string or an array of content blocks.", param="system")
    parts = _PartCounter()
    billed = {
        **body,
        "system": parts.strip(system),
        "messages": [{**m, "content": parts.strip(m.get("content"))} for m in messages],
    }
    return Shape(
        kind="messages", model=model, text_tokens=_text_tokens(billed, messages), images=parts.images,
        unbounded_parts=parts.unbounded, max_output=max_tokens, output_param="max_tokens" if max_tokens else None,
        choices=1, stream=_stream(body),
    )


def shape_embeddings(body: dict) -> Shape:
    _check_params(body, "embeddings")
    model = _model(body)
    data = body.get("input")
    if isinstance(data, str):
        items: list = [data]
    elif isinstance(data, list) and data:
        items = data
    else:
        raise bad_request("'input' is required: a string, an array of strings or of token arrays.", param="input")
    tokens = 0
    for item in items:
        if isinstance(item, str):
            tokens += len(item.encode()) + 1
        elif isinstance(item, int) and not isinstance(item, bool):
            tokens += 1
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            tokens += len(item)
        else:
            raise bad_request("'input' items must be strings or arrays of integers.", param="input")
    return Shape(
        kind="embeddings", model=model, text_tokens=tokens + settings.CAPGATE["PER_REQUEST_OVERHEAD_TOKENS"],
        images=0, unbounded_parts=0, max_output=None, output_param=None, choices=1, stream=False,
    )


SHAPERS = {"chat": shape_chat, "messages": shape_messages, "embeddings": shape_embeddings}
