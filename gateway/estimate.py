"""Validate gateway request bodies and bound what they can be billed for (DESIGN §5).

The input bound is the whole billed body in UTF-8 bytes plus framing overhead: a byte-level BPE
token covers at least one byte, so bytes bound tokens for any such tokenizer — unlike an
estimate (chars / 3), which CJK, code and digits beat. Image parts are bounded by the model's
own per-image maximum, not by their base64 size; parts nothing can bound are reported so the
caller can refuse them under a blocking cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from gateway import billing
from gateway.errors import GatewayError, bad_request
from gateway.tokens import Prompt

MAX_CHOICES = 8
MAX_OUTPUT_TOKENS_ACCEPTED = 1_000_000
MAX_SERVER_TOOL_USES = 100
# Parameters each endpoint accepts: the billing inventory's fields (gateway/billing.py).
ALLOWED = {kind: set(fields) for kind, fields in billing.FIELDS.items()}
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
    prompt: Prompt | None = None  # for an exact count (gateway/tokens.py); None: bytes only
    # Paid features (docs/billing.md):
    refused: tuple[str, ...] = ()  # fields refused under a blocking cap, by name
    web_searches: int = 0  # server-side web searches allowed (sum of max_uses)
    server_tool_uses: int = 0  # every server-side tool use (each is another sampling pass)
    fetch_tokens: int = 0  # input a web_fetch can add: max_uses x max_content_tokens
    extra_output: int = 0  # output beyond the ceiling: rejected prediction, interleaved thinking
    cache_1h: bool = False  # 1-hour cache writes requested
    service_tier: str | None = None  # as requested ("auto" when absent)
    patch: dict = field(default_factory=dict)  # fields rewritten upstream (tools with max_uses)
    forward_headers: dict = field(default_factory=dict)  # classified headers sent upstream
    # Responses API: earlier context the provider adds from its stored state, as
    # ("response", previous_response_id) or ("conversation", id); bounded from what capgate relayed.
    context_ref: tuple[str, str] | None = None
    stored: bool = True  # Responses API: the provider keeps this response (store is not false)


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


def _check_params(body: dict, kind: str) -> None:
    unknown = sorted(set(body) - ALLOWED[kind])
    if unknown:
        raise bad_request(f"Unsupported parameter: '{unknown[0]}'.", param=unknown[0], code="unsupported_parameter")


def _unsupported(message: str, *, code: str, param: str | None = None) -> GatewayError:
    return bad_request(message, code=code, param=param)


def _refused_chat_params(body: dict) -> list[str]:
    """Fields present in a chat body that are refused under a blocking cap."""
    refused = [f for f in ("audio", "web_search_options", "moderation") if body.get(f) is not None]
    modalities = body.get("modalities")
    if modalities is not None:
        if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
            raise bad_request("'modalities' must be an array of strings.", param="modalities")
        if any(m != "text" for m in modalities):
            refused.append("modalities")
    return refused


def _service_tier(body: dict, allowed: set[str]) -> str | None:
    tier = body.get("service_tier")
    if tier is None:
        return None
    if not isinstance(tier, str) or tier not in allowed:
        raise bad_request(f"'service_tier' must be one of {', '.join(sorted(allowed))}.", param="service_tier")
    return tier


def _has_1h_cache(node: Any) -> bool:
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
        raise bad_request(f"tools[{i}].max_uses must be an integer between 1 and {MAX_SERVER_TOOL_USES}.",
                          param=f"tools[{i}].max_uses")
    return uses


@dataclass
class _Tools:
    refused: list[str]
    web_searches: int = 0
    server_tool_uses: int = 0
    fetch_tokens: int = 0
    overhead: int = 0
    patched: list | None = None  # the tools list as sent upstream, when max_uses was injected
    hosted_search: bool = False  # Responses: a web_search tool, its uses bounded by max_tool_calls


def _tools(body: dict, kind: str) -> _Tools:
    """Classify each tool by type (gateway/billing.py TOOL_TYPES). Server tools get a bounded
    use count: the caller's max_uses, or the configured default injected into the upstream body."""
    out = _Tools(refused=[])
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
            raise _unsupported(f"Unsupported tool type: '{raw_type}'.", code="unsupported_tool", param=f"tools[{i}].type")
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
            if isinstance(content, bool) or not isinstance(content, int) or not 1 <= content <= MAX_OUTPUT_TOKENS_ACCEPTED:
                raise bad_request(f"tools[{i}].max_content_tokens must be a positive integer.",
                                  param=f"tools[{i}].max_content_tokens")
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


def _check_headers(headers: dict[str, str], kind: str) -> None:
    """Provider headers are classified like fields: forwarded and listed, ignored and listed, or
    refused — a new paid header never passes unseen."""
    for name in headers:
        if (name.startswith(billing.PROVIDER_HEADER_PREFIXES) and name not in billing.HEADERS[kind]
                and name not in billing.NOT_FORWARDED):
            raise _unsupported(f"Unsupported header: '{name}'.", code="unsupported_header", param=name)


def _anthropic_headers(headers: dict[str, str]) -> tuple[dict[str, str], list[str], set[str]]:
    """The classified headers to forward, the betas refused under a blocking cap, and every beta."""
    _check_headers(headers, "messages")
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
                raise _unsupported(f"Unsupported anthropic-beta value: '{value}'.", code="unsupported_beta",
                                   param="anthropic-beta")
            betas.add(name)
            if entry.cls == billing.REFUSED:
                refused.append("anthropic_beta")
    return forward, refused, betas


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


def shape_chat(body: dict, headers: dict[str, str] | None = None) -> Shape:
    _check_params(body, "chat")
    _check_headers(headers or {}, "chat")
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
    refused = _refused_chat_params(body)
    tools = _tools(body, "chat")
    if body.get("functions") is not None:
        tools.overhead = max(tools.overhead, settings.CAPGATE["TOOL_USE_OVERHEAD_TOKENS"])
    prediction = body.get("prediction")
    # Rejected prediction tokens are billed as output: bound them by the prediction's bytes.
    extra_output = len(json.dumps(prediction, ensure_ascii=False).encode()) if prediction is not None else 0
    parts = _PartCounter()
    billed = {**body, "messages": [{**m, "content": parts.strip(m.get("content"))} for m in messages]}
    return Shape(
        kind="chat", model=model, text_tokens=_text_tokens(billed, messages) + tools.overhead, images=parts.images,
        unbounded_parts=parts.unbounded, max_output=max_output, output_param=param, choices=n, stream=_stream(body),
        refused=tuple(refused + tools.refused), extra_output=extra_output,
        service_tier=_service_tier(body, {"auto", "default", "flex", "scale", "priority", "fast"}),
        prompt=Prompt(kind="chat", billed=billed, overhead=tools.overhead),
    )


def shape_messages(body: dict, headers: dict[str, str] | None = None) -> Shape:
    _check_params(body, "messages")
    model = _model(body)
    messages = _messages(body)
    max_tokens = _positive_int(body, "max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise bad_request("'system' must be a string or an array of content blocks.", param="system")
    forward, refused, betas = _anthropic_headers(headers or {})
    refused += [f for f in ("container", "mcp_servers") if body.get(f) is not None]
    geo = body.get("inference_geo")
    if geo is not None and geo != "global":
        refused.append("inference_geo")
    tools = _tools(body, "messages")
    extra_output = 0
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and "interleaved-thinking" in betas:
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            extra_output = budget  # interleaved thinking may spend its budget beyond max_tokens
    parts = _PartCounter()
    billed = {
        **body,
        "system": parts.strip(system),
        "messages": [{**m, "content": parts.strip(m.get("content"))} for m in messages],
    }
    return Shape(
        kind="messages", model=model, text_tokens=_text_tokens(billed, messages) + tools.overhead,
        images=parts.images, unbounded_parts=parts.unbounded, max_output=max_tokens,
        output_param="max_tokens" if max_tokens else None, choices=1, stream=_stream(body),
        refused=tuple(refused + tools.refused), web_searches=tools.web_searches,
        server_tool_uses=tools.server_tool_uses, fetch_tokens=tools.fetch_tokens, extra_output=extra_output,
        cache_1h=_has_1h_cache(body), service_tier=_service_tier(body, {"auto", "standard_only"}),
        patch={"tools": tools.patched} if tools.patched is not None else {}, forward_headers=forward,
    )


def _context_ref(body: dict) -> tuple[str, str] | None:
    previous, conversation = body.get("previous_response_id"), body.get("conversation")
    if previous is not None and conversation is not None:
        raise bad_request("Give 'previous_response_id' or 'conversation', not both.", param="conversation")
    if previous is not None:
        if not isinstance(previous, str) or not 1 <= len(previous) <= 200:
            raise bad_request("'previous_response_id' must be a response id.", param="previous_response_id")
        return ("response", previous)
    if conversation is not None:
        conv_id = conversation.get("id") if isinstance(conversation, dict) else conversation
        if not isinstance(conv_id, str) or not 1 <= len(conv_id) <= 200:
            raise bad_request("'conversation' must be a conversation id or {\"id\": ...}.", param="conversation")
        return ("conversation", conv_id)
    return None


def shape_responses(body: dict, headers: dict[str, str] | None = None) -> Shape:
    """The Responses API. Input is a string or a list of items; earlier context named by
    previous_response_id or conversation is added by the service from what capgate relayed."""
    _check_params(body, "responses")
    _check_headers(headers or {}, "responses")
    model = _model(body)
    context_ref = _context_ref(body)
    raw = body.get("input")
    if isinstance(raw, str):
        items: list = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and (raw or context_ref):
        items = raw
    elif raw is None and context_ref:
        items = []
    else:
        raise bad_request("'input' is required: a string or an array of input items.", param="input")
    refused = [f for f in ("background", "prompt", "context_management", "moderation")
               if body.get(f) not in (None, False)]
    parts = _PartCounter()
    billed_items = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"input[{i}] must be an object.", param=f"input[{i}]")
        if item.get("type") == "item_reference":
            refused.append("item_reference")  # a stored item the body does not show
        billed_items.append({**item, "content": parts.strip(item["content"])} if "content" in item else item)
    tools = _tools(body, "responses")
    patch: dict = {}
    searches = 0
    if tools.hosted_search:
        searches = _max_tool_calls(body)
        if "max_tool_calls" not in body:
            patch["max_tool_calls"] = searches
    max_output = _positive_int(body, "max_output_tokens")
    billed = {**body, "input": billed_items}
    return Shape(
        kind="responses", model=model,
        text_tokens=_text_tokens(billed, billed_items) + tools.overhead, images=parts.images,
        unbounded_parts=parts.unbounded, max_output=max_output,
        output_param="max_output_tokens" if max_output else None, choices=1, stream=_stream(body),
        refused=tuple(refused + tools.refused), web_searches=searches, server_tool_uses=searches,
        service_tier=_service_tier(body, {"auto", "default", "flex", "scale", "priority", "fast"}),
        patch=patch, context_ref=context_ref, stored=body.get("store") is not False,
    )


def _max_tool_calls(body: dict) -> int:
    calls = body.get("max_tool_calls", settings.CAPGATE["DEFAULT_SERVER_TOOL_MAX_USES"])
    if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= MAX_SERVER_TOOL_USES:
        raise bad_request(f"'max_tool_calls' must be an integer between 1 and {MAX_SERVER_TOOL_USES}.",
                          param="max_tool_calls")
    return calls


def shape_embeddings(body: dict, headers: dict[str, str] | None = None) -> Shape:
    _check_params(body, "embeddings")
    _check_headers(headers or {}, "embeddings")
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
        prompt=Prompt(kind="embeddings", billed={"input": items}),
    )


SHAPERS = {"chat": shape_chat, "messages": shape_messages, "embeddings": shape_embeddings,
           "responses": shape_responses}
