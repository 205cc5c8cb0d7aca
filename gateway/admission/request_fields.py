"""Request-body fields and headers the gateway's endpoints share (gateway/admission/bounds.py shapes
each endpoint from these): validation with an error in the endpoint's own shape, and the
classification the worst case needs: tools (server tools get a bounded use count), provider
headers and Anthropic betas, and the byte bound on text. Content parts (images, files, audio)
are walked by gateway/admission/parts.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from gateway import billing
from gateway.admission.field_types import ARTICLES, FIELD_TYPES, json_type_ok
from gateway.http.errors import GatewayError, bad_request

MAX_OUTPUT_TOKENS_ACCEPTED = 1_000_000
MAX_SERVER_TOOL_USES = 100
# Parameters each endpoint accepts: the billing inventory's fields (gateway/billing/live.py).
ALLOWED = {kind: set(fields) for kind, fields in billing.FIELDS.items()}


@dataclass(frozen=True)
class Unclassified:
    """A field, tool type, beta or provider header the billing inventory does not list."""

    what: str  # field | tool | beta | header
    name: str
    code: str  # the 400's code when it is refused: unsupported_parameter | _tool | _beta | _header
    message: str
    param: str | None


# Set while the proxy shapes a live request: what the inventory does not know is collected here
# instead of refused, because whether it may pass depends on the request's budgets, known only
# once its key is (gateway/admission/unclassified.py decides). Unset, it is a 400 at once.
_collected: ContextVar[list[Unclassified] | None] = ContextVar("capgate_unclassified", default=None)


@contextmanager
def collecting_unclassified() -> Iterator[list[Unclassified]]:
    found: list[Unclassified] = []
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


def _unknown(what: str, name: str, message: str, *, code: str, param: str | None) -> None:
    found = _collected.get()
    if found is None:
        raise bad_request(message, code=code, param=param)
    found.append(Unclassified(what=what, name=name, code=code, message=message, param=param))


def check_params(body: dict, kind: str) -> None:
    """Every field is one the inventory lists for this endpoint (an unknown one is collected or
    refused, `_unknown`), of the type the SDKs give it (a wrong type is a 400 at once)."""
    for name in sorted(set(body) - ALLOWED[kind]):
        _unknown("field", name, f"Unsupported parameter: '{name}'.", code="unsupported_parameter", param=name)
    types = FIELD_TYPES[kind]
    for name, value in body.items():
        expected = types.get(name)  # None: a field the inventory does not list (above)
        if expected is not None and not json_type_ok(value, expected):
            raise bad_request(
                f"'{name}' must be {' or '.join(ARTICLES[t] for t in expected)}.",
                param=name,
            )


CONTEXT_EDITS_THAT_ONLY_CLEAR = ("clear_thinking", "clear_tool_uses")


def messages_speed(body: dict) -> str | None:
    """The Messages speed: "fast" is fast mode, priced by the catalog's fast-mode multiplier
    (refused under a blocking cap on a model without one, catalog/pricing.py)."""
    speed = body.get("speed")
    if speed not in (None, "standard", "fast"):
        raise bad_request("'speed' must be 'standard' or 'fast'.", param="speed")
    return speed


def messages_context_edits(body: dict) -> list[str]:
    """Messages fields refused under a blocking cap by value: a context_management edit other
    than clearing (compaction runs a model call of its own; clearing only drops context the body
    already bounds)."""
    refused = []
    cm = body.get("context_management")
    if cm is not None:
        edits = cm.get("edits") if isinstance(cm, dict) else None
        if not isinstance(edits, list) or not all(
            isinstance(e, dict) and isinstance(e.get("type"), str) for e in edits
        ):
            raise bad_request(
                "'context_management.edits' must be an array of objects with a string 'type'.",
                param="context_management",
            )
        if any(billing.undated(e["type"]) not in CONTEXT_EDITS_THAT_ONLY_CLEAR for e in edits):
            refused.append("context_management")
    return refused


def service_tier(body: dict, allowed: set[str]) -> str | None:
    tier = body.get("service_tier")
    if tier is None:
        return None
    if not isinstance(tier, str) or tier not in allowed:
        raise bad_request(f"'service_tier' must be one of {', '.join(sorted(allowed))}.", param="service_tier")
    return tier


def has_1h_cache(node: Any) -> bool:
    """Whether any cache_control in the body asks for a 1-hour TTL (walked without recursion)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            cc = item.get("cache_control")
            if isinstance(cc, dict) and cc.get("ttl") not in (None, "5m"):
                if cc.get("ttl") != "1h":
                    raise bad_request("cache_control.ttl must be '5m' or '1h'.", param="cache_control")
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _max_uses(tool: dict, i: int, default: int) -> int:
    uses = tool.get("max_uses", default)
    if isinstance(uses, bool) or not isinstance(uses, int) or not 1 <= uses <= MAX_SERVER_TOOL_USES:
        raise bad_request(
            f"tools[{i}].max_uses must be an integer between 1 and {MAX_SERVER_TOOL_USES}.",
            param=f"tools[{i}].max_uses",
        )
    return uses


@dataclass
class Tools:
    refused: list[str]
    web_searches: int = 0
    server_tool_uses: int = 0
    fetch_tokens: int = 0
    overhead: int = 0
    patched: list | None = None  # the tools list as sent upstream, when max_uses was injected
    hosted_search: bool = False  # Responses: a web_search tool, its uses bounded by max_tool_calls


def classify_tools(body: dict, kind: str) -> Tools:
    """Classify each tool by type (gateway/billing/live.py TOOL_TYPES). Server tools get a bounded
    use count: the caller's max_uses, or the configured default injected into the upstream body."""
    out = Tools(refused=[])
    tools = body.get("tools")
    if tools is None:
        return out
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array.", param="tools")
    cfg = settings.CAPGATE
    known = billing.TOOL_TYPES[kind]
    patched: list = []
    injected = False
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{i}] must be an object.", param=f"tools[{i}]")
        raw_type = tool.get("type", "custom")
        if not isinstance(raw_type, str):
            raise bad_request(f"tools[{i}].type must be a string.", param=f"tools[{i}].type")
        name = billing.undated(raw_type)
        if name not in known:
            _unknown(
                "tool",
                raw_type,
                f"Unsupported tool type: '{raw_type}'.",
                code="unsupported_tool",
                param=f"tools[{i}].type",
            )
            out.overhead += cfg["BUILTIN_TOOL_OVERHEAD_TOKENS"]  # passed on: its definition is body bytes
            patched.append(tool)
            continue
        entry = known[name]
        if entry.cls == billing.REFUSED:
            out.refused.append(name)
        elif kind == "responses" and name in ("web_search", "web_search_preview"):
            out.hosted_search = True
        elif name == "web_search":
            uses = _max_uses(tool, i, cfg["DEFAULT_SERVER_TOOL_MAX_USES"])
            out.web_searches += uses
            out.server_tool_uses += uses
            if "max_uses" not in tool:
                tool, injected = {**tool, "max_uses": uses}, True
        elif name == "web_fetch":
            uses = _max_uses(tool, i, cfg["DEFAULT_SERVER_TOOL_MAX_USES"])
            content = tool.get("max_content_tokens", cfg["DEFAULT_WEB_FETCH_MAX_CONTENT_TOKENS"])
            if (
                isinstance(content, bool)
                or not isinstance(content, int)
                or not 1 <= content <= MAX_OUTPUT_TOKENS_ACCEPTED
            ):
                raise bad_request(
                    f"tools[{i}].max_content_tokens must be a positive integer.", param=f"tools[{i}].max_content_tokens"
                )
            out.server_tool_uses += uses
            out.fetch_tokens += uses * content
            if "max_uses" not in tool or "max_content_tokens" not in tool:
                tool, injected = {**tool, "max_uses": uses, "max_content_tokens": content}, True
        elif kind in ("messages", "responses") and name not in ("custom", "function", "namespace"):
            out.overhead += cfg["BUILTIN_TOOL_OVERHEAD_TOKENS"]  # a client tool's hidden definition
        patched.append(tool)
    if tools:
        out.overhead += cfg["TOOL_USE_OVERHEAD_TOKENS"]  # the provider's tool-use system prompt
    out.patched = patched if injected else None
    return out


def check_headers(headers: dict[str, str], kind: str) -> None:
    """Provider headers are classified like fields: forwarded and listed, ignored and listed, or
    refused — a new paid header never passes unseen."""
    for name in headers:
        if (
            name.startswith(billing.PROVIDER_HEADER_PREFIXES)
            and name not in billing.HEADERS[kind]
            and name not in billing.NOT_FORWARDED
        ):
            # Passed on where no cap is at stake means counted, never forwarded: only listed
            # headers reach a provider.
            _unknown("header", name, f"Unsupported header: '{name}'.", code="unsupported_header", param=name)


def anthropic_headers(headers: dict[str, str]) -> tuple[dict[str, str], list[str], set[str]]:
    """The classified headers to forward, the betas refused under a blocking cap, and every beta."""
    check_headers(headers, "messages")
    forward: dict[str, str] = {}
    for name in billing.HEADERS["messages"]:
        if name in headers:
            forward[name] = headers[name]
    refused: list[str] = []
    betas: set[str] = set()
    raw = headers.get("anthropic-beta")
    if raw is not None:
        for value in (v.strip() for v in raw.split(",")):
            if not value:
                continue
            name = billing.undated(value)
            entry = billing.ANTHROPIC_BETAS.get(name)
            if entry is None:
                _unknown(
                    "beta",
                    value,
                    f"Unsupported anthropic-beta value: '{value}'.",
                    code="unsupported_beta",
                    param="anthropic-beta",
                )
                continue
            betas.add(name)
            if entry.cls == billing.REFUSED:
                refused.append("anthropic_beta")
    return forward, refused, betas


def refused_under_budget(field: str, forward_headers: dict[str, str], *, param: str | None = None) -> GatewayError:
    """The 402 for a field (or beta) the inventory refuses under a blocking cap, naming what was
    refused, down to the beta value, and what to do instead. `param`: where the field sits in the
    body when it is not a top-level field (an assistant message's audio reference)."""
    param = param or field
    what = f"'{param}'"
    if field == "anthropic_beta":
        raw = forward_headers.get("anthropic-beta", "")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        named = [
            v
            for v in values
            if getattr(billing.ANTHROPIC_BETAS.get(billing.undated(v)), "cls", None) == billing.REFUSED
        ]
        what = "anthropic-beta " + ", ".join(f"'{v}'" for v in named)
    return GatewayError(
        f"{what} buys something whose cost the catalog cannot bound (docs/billing.md), so a blocking budget "
        "cannot admit it. Send the request without it, or under a key no blocking budget governs.",
        code=f"{field}_under_budget",
        status=402,
        param=param,
    )


def model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    return model


def positive_int(body: dict, field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{field}' must be an integer.", param=field)
    if not 1 <= value <= MAX_OUTPUT_TOKENS_ACCEPTED:
        raise bad_request(f"'{field}' must be between 1 and {MAX_OUTPUT_TOKENS_ACCEPTED}.", param=field)
    return value


def stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    return stream


def text_tokens(billed: dict, messages: list) -> int:
    raw = json.dumps(billed, ensure_ascii=False, separators=(",", ":")).encode()
    cfg = settings.CAPGATE
    return len(raw) + cfg["PER_MESSAGE_OVERHEAD_TOKENS"] * len(messages) + cfg["PER_REQUEST_OVERHEAD_TOKENS"]


def messages(body: dict, *, allow_system_role: bool = True) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param=f"messages[{i}]")
        if "content" in message and not isinstance(message["content"], str | list | type(None)):
            raise bad_request(f"messages[{i}].content must be a string or an array.", param=f"messages[{i}].content")
    return messages


def max_tool_calls(body: dict) -> int:
    calls = body.get("max_tool_calls", settings.CAPGATE["DEFAULT_SERVER_TOOL_MAX_USES"])
    if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= MAX_SERVER_TOOL_USES:
        raise bad_request(
            f"'max_tool_calls' must be an integer between 1 and {MAX_SERVER_TOOL_USES}.", param="max_tool_calls"
        )
    return calls
