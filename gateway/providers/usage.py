"""Usage read back from a provider's answer, by wire format (not by connection kind): OpenAI's
chat completions and embeddings, Anthropic's messages, OpenAI's responses. Each adapter says
which format its provider answers in (gateway/providers/base.py)."""

from __future__ import annotations

from catalog.pricing import Usage
from core import fastjson


def _count(d: object, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _unpriced_counts(d: object, known: set[str], prefix: str) -> list[str]:
    """Positive counters in a usage sub-object that capgate does not price."""
    if not isinstance(d, dict):
        return []
    return [f"{prefix}.{k}={v}" for k, v in d.items() if k not in known and _count(d, k)]


def usage_openai(u: dict | None, service_tier: object = None) -> Usage | None:
    if not isinstance(u, dict):
        return None
    prompt = _count(u, "prompt_tokens")
    details = u.get("prompt_tokens_details") or {}
    out_details = u.get("completion_tokens_details") or {}
    cached = _count(details, "cached_tokens")
    unpriced = [f"prompt_tokens_details.{k}={_count(details, k)}" for k in ("audio_tokens",) if _count(details, k)]
    unpriced += [
        f"completion_tokens_details.{k}={_count(out_details, k)}" for k in ("audio_tokens",) if _count(out_details, k)
    ]
    # Output is what the total counts beyond the prompt when that is more than completion_tokens:
    # Gemini's OpenAI-compatible endpoint leaves its thinking tokens (billed as output) out of
    # completion_tokens and counts them only in total_tokens. For OpenAI the two agree.
    output = max(_count(u, "completion_tokens"), _count(u, "total_tokens") - prompt)
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=output,
        cache_read_tokens=cached,
        service_tier=service_tier if isinstance(service_tier, str) else None,
        unpriced=tuple(unpriced),
    )


# server_tool_use counters: priced per use, free (their tokens are in the input), or unknown.
_PRICED_SERVER_TOOLS = {"web_search_requests"}
_FREE_SERVER_TOOLS = {"web_fetch_requests"}


def usage_anthropic(u: dict | None) -> Usage | None:
    if not isinstance(u, dict):
        return None
    writes = _count(u, "cache_creation_input_tokens")
    split = u.get("cache_creation")
    one_hour = _count(split, "ephemeral_1h_input_tokens")
    tools = u.get("server_tool_use")
    tier = u.get("service_tier")
    speed = u.get("speed")
    return Usage(
        input_tokens=_count(u, "input_tokens"),
        output_tokens=_count(u, "output_tokens"),
        cache_read_tokens=_count(u, "cache_read_input_tokens"),
        cache_write_tokens=max(writes - one_hour, 0),
        cache_write_1h_tokens=one_hour,
        web_search_requests=_count(tools, "web_search_requests"),
        service_tier=tier if isinstance(tier, str) else None,
        speed=speed if speed in ("fast", "standard") else None,
        unpriced=tuple(_unpriced_counts(tools, _PRICED_SERVER_TOOLS | _FREE_SERVER_TOOLS, "server_tool_use")),
    )


# Responses API output items that are hosted tool calls: web searches are priced per use; the
# rest are refused under a blocking cap, so if one appears its cost is flagged, never dropped.
_PRICED_CALLS = {"web_search_call"}
_HOSTED_CALLS = {"file_search_call", "code_interpreter_call", "image_generation_call", "mcp_call", "tool_search_call"}


def usage_responses(response: object) -> Usage | None:
    """A Response object's usage, with its hosted tool calls counted from the output items."""
    if not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
        return None
    u = response["usage"]
    cached = _count(u.get("input_tokens_details"), "cached_tokens")
    items = [i for i in response.get("output") or [] if isinstance(i, dict)]
    searches = sum(1 for i in items if i.get("type") in _PRICED_CALLS)
    hosted = sorted({str(i.get("type")) for i in items if i.get("type") in _HOSTED_CALLS})
    tier = response.get("service_tier")
    return Usage(
        input_tokens=max(_count(u, "input_tokens") - cached, 0),
        output_tokens=_count(u, "output_tokens"),
        cache_read_tokens=cached,
        web_search_requests=searches,
        service_tier=tier if isinstance(tier, str) else None,
        unpriced=tuple(f"output.{t}" for t in hosted),
    )


def response_state(response: object) -> tuple[str, str | None, int] | None:
    """(id, conversation id, context a continuation adds) of a completed Response object."""
    if not isinstance(response, dict) or not isinstance(response.get("id"), str):
        return None
    u = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    conversation = response.get("conversation")
    conv_id = conversation.get("id") if isinstance(conversation, dict) else conversation
    return (
        response["id"],
        conv_id if isinstance(conv_id, str) else None,
        _count(u, "input_tokens") + _count(u, "output_tokens"),
    )


def usage_from_body(kind: str, body: bytes) -> tuple[Usage | None, str]:
    try:
        data = fastjson.loads(body)
    except ValueError:
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    if kind == "messages":
        usage = usage_anthropic(data.get("usage"))
    elif kind in ("responses", "compact"):  # a compaction reports a Response's usage
        usage = usage_responses(data)
    else:
        usage = usage_openai(data.get("usage"), data.get("service_tier"))
    return usage, str(data.get("model") or "")


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
        self.response: dict | None = None  # Responses API: the final Response object
        self.message_id: str | None = None  # Messages: the id message_start names

    def feed(self, data: bytes) -> bool:
        """Read one event's data; return True if it was OpenAI's usage-only chunk."""
        if self.kind == "responses":
            # response.completed / .incomplete / .failed carry the whole Response with its usage.
            if b'"usage"' in data and (
                b'"response.completed"' in data or b'"response.incomplete"' in data or b'"response.failed"' in data
            ):
                response = fastjson.loads(data).get("response")
                usage = usage_responses(response)
                if usage is not None:
                    self.usage, self.response = usage, response
                    self.model = str(response.get("model") or "")
            return False
        if self.kind == "messages":
            if b'"message_start"' in data:
                msg = fastjson.loads(data).get("message") or {}
                self._start = msg.get("usage") or {}
                self.model = str(msg.get("model") or "")
                self.message_id = msg.get("id") if isinstance(msg.get("id"), str) else None
            elif b'"message_delta"' in data:
                delta_usage = fastjson.loads(data).get("usage")
                if isinstance(delta_usage, dict):
                    self.usage = usage_anthropic({**self._start, **delta_usage})
            return False
        if b'"usage":{' in data or b'"usage": {' in data:
            chunk = fastjson.loads(data)
            self.usage = usage_openai(chunk.get("usage"), chunk.get("service_tier"))
            self.model = str(chunk.get("model") or self.model)
            return not chunk.get("choices")
        return False
