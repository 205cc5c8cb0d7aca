"""Bounds: the most a request body can be billed for, never an estimate of it. Each endpoint's
shaper validates the body and returns its `Shape` (input bound, images, output ceiling, choices)
for admission to reserve the worst case of.

The input bound is the whole billed body in UTF-8 bytes plus framing overhead: a byte-level BPE
token covers at least one byte, so bytes bound tokens for any such tokenizer — unlike an
estimate (chars / 3), which CJK, code and digits beat. Image parts are bounded by the model's
own per-image maximum, not by their base64 size; parts nothing can bound are reported so the
caller can refuse them under a blocking cap.

One shaper per endpoint here; the fields and headers they share (validation, tools, betas, the
byte bound) are in gateway/admission/request_fields.py, the walk of content parts wherever they
sit (messages, tool outputs, screenshots) in gateway/admission/parts.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core import jsonlimits
from gateway.admission import request_fields as fields
from gateway.admission.parts import PartCounter
from gateway.admission.tokens import Prompt
from gateway.http.errors import bad_request

MAX_CHOICES = 8


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
    prompt: Prompt | None = None  # for an exact count (gateway/admission/tokens.py); None: bytes only
    # Paid features (docs/billing.md):
    refused: tuple[str, ...] = ()  # fields refused under a blocking cap, by name
    web_searches: int = 0  # server-side web searches allowed (sum of max_uses)
    server_tool_uses: int = 0  # every server-side tool use (each is another sampling pass)
    fetch_tokens: int = 0  # input a web_fetch can add: max_uses x max_content_tokens
    extra_output: int = 0  # output beyond the ceiling: rejected prediction, interleaved thinking
    cache_1h: bool = False  # 1-hour cache writes requested
    service_tier: str | None = None  # as requested ("auto" when absent)
    speed: str | None = None  # Messages: "fast" is Anthropic's fast mode, priced by its multiplier
    patch: dict = field(default_factory=dict)  # fields rewritten upstream (tools with max_uses)
    forward_headers: dict = field(default_factory=dict)  # classified headers sent upstream
    unclassified: tuple = ()  # what the inventory does not list (request_fields.Unclassified)
    # Earlier context the provider adds from its stored state, as ("response", previous_response_id)
    # or ("conversation", id) (Responses API) or ("message", previous_message_id) (a message thread's
    # continue); bounded from what capgate relayed.
    context_ref: tuple[str, str] | None = None
    # The provider keeps this response for a later continuation: Responses unless store is false,
    # Messages only in a thread.
    stored: bool = True


def _require_dict(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def parse_json(raw: bytes) -> dict:
    # The one limited loader (config/jsonlimits.py): a deeply nested body is a 400, not a
    # RecursionError. The body's size is already bounded by MAX_BODY_BYTES (413) when read.

    try:
        return _require_dict(jsonlimits.loads(raw))
    except jsonlimits.JSONLimitError as exc:
        raise bad_request(exc.message, code=exc.code, param=exc.param or None) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from None


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


def shape_chat(body: dict, headers: dict[str, str] | None = None) -> Shape:
    fields.check_params(body, "chat")
    fields.check_headers(headers or {}, "chat")
    model = fields.model(body)
    messages = fields.messages(body)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be an integer between 1 and {MAX_CHOICES}.", param="n")
    max_completion = fields.positive_int(body, "max_completion_tokens")
    max_tokens = fields.positive_int(body, "max_tokens")
    param: str | None
    max_output, param = (max_completion, "max_completion_tokens") if max_completion else (max_tokens, "max_tokens")
    if max_output is None:
        param = None
    refused = _refused_chat_params(body)
    if any(isinstance(m, dict) and m.get("audio") is not None for m in messages):
        # An assistant turn's earlier audio output, named by id: billed again as input audio tokens.
        refused.append("audio_reference")
    tools = fields.classify_tools(body, "chat")
    if body.get("functions") is not None:
        tools.overhead = max(tools.overhead, settings.CAPGATE["TOOL_USE_OVERHEAD_TOKENS"])
    prediction = body.get("prediction")
    # Rejected prediction tokens are billed as output: bound them by the prediction's bytes.
    extra_output = len(json.dumps(prediction, ensure_ascii=False).encode()) if prediction is not None else 0
    parts = PartCounter()
    billed = {**body, "messages": parts.strip(messages, where="messages")}
    return Shape(
        kind="chat",
        model=model,
        text_tokens=fields.text_tokens(billed, messages) + tools.overhead,
        images=parts.images,
        unbounded_parts=parts.unbounded,
        max_output=max_output,
        output_param=param,
        choices=n,
        stream=fields.stream(body),
        refused=tuple(refused + tools.refused),
        extra_output=extra_output,
        service_tier=fields.service_tier(body, {"auto", "default", "flex", "scale", "priority", "fast"}),
        prompt=Prompt(kind="chat", billed=billed, overhead=tools.overhead),
    )


def _message_thread(body: dict) -> tuple[bool, tuple[str, str] | None]:
    """A message thread: whether the provider keeps this message (any `thread`), and the earlier
    context a `continue` adds, as ("message", previous_message_id), bounded from what capgate relayed."""
    thread = body.get("thread")
    if thread is None:
        return False, None
    if thread.get("type") == "create":
        return True, None
    previous = thread.get("previous_message_id")
    if thread.get("type") != "continue" or not isinstance(previous, str) or not 1 <= len(previous) <= 200:
        raise bad_request(
            '\'thread\' must be {"type": "create"} or {"type": "continue", "previous_message_id": <id>}.',
            param="thread",
        )
    return True, ("message", previous)


def shape_messages(body: dict, headers: dict[str, str] | None = None) -> Shape:
    fields.check_params(body, "messages")
    model = fields.model(body)
    threaded, context_ref = _message_thread(body)
    # A continue sends only the new turn, which may be none (the server resumes a paused turn).
    messages = fields.messages(body) if context_ref is None or body.get("messages") != [] else []
    max_tokens = fields.positive_int(body, "max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise bad_request("'system' must be a string or an array of content blocks.", param="system")
    forward, refused, betas = fields.anthropic_headers(headers or {})
    refused += [f for f in ("container", "mcp_servers") if body.get(f) is not None]
    geo = body.get("inference_geo")
    if geo is not None and geo != "global":
        refused.append("inference_geo")
    refused += fields.messages_context_edits(body)
    tools = fields.classify_tools(body, "messages")
    extra_output = 0
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and "interleaved-thinking" in betas:
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            extra_output = budget  # interleaved thinking may spend its budget beyond max_tokens
    parts = PartCounter()
    billed = {
        **body,
        "system": parts.strip(system, where="system"),
        "messages": parts.strip(messages, where="messages"),
    }
    return Shape(
        kind="messages",
        model=model,
        text_tokens=fields.text_tokens(billed, messages) + tools.overhead,
        images=parts.images,
        unbounded_parts=parts.unbounded,
        max_output=max_tokens,
        output_param="max_tokens" if max_tokens else None,
        choices=1,
        stream=fields.stream(body),
        refused=tuple(refused + tools.refused),
        web_searches=tools.web_searches,
        server_tool_uses=tools.server_tool_uses,
        fetch_tokens=tools.fetch_tokens,
        extra_output=extra_output,
        cache_1h=fields.has_1h_cache(body),
        service_tier=fields.service_tier(body, {"auto", "standard_only"}),
        speed=fields.messages_speed(body),
        patch={"tools": tools.patched} if tools.patched is not None else {},
        forward_headers=forward,
        context_ref=context_ref,
        stored=threaded,
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
    fields.check_params(body, "responses")
    fields.check_headers(headers or {}, "responses")
    model = fields.model(body)
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
    refused = [
        f for f in ("background", "prompt", "context_management", "moderation") if body.get(f) not in (None, False)
    ]
    parts = PartCounter()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"input[{i}] must be an object.", param=f"input[{i}]")
        if item.get("type") == "item_reference":
            refused.append("item_reference")  # a stored item the body does not show
    # Every item's parts: a message's content and every tool output (gateway/admission/parts.py).
    billed_items = parts.strip(items, where="input")
    tools = fields.classify_tools(body, "responses")
    patch: dict = {}
    searches = 0
    if tools.hosted_search:
        searches = fields.max_tool_calls(body)
        if "max_tool_calls" not in body:
            patch["max_tool_calls"] = searches
    max_output = fields.positive_int(body, "max_output_tokens")
    billed = {**body, "input": billed_items}
    return Shape(
        kind="responses",
        model=model,
        text_tokens=fields.text_tokens(billed, billed_items) + tools.overhead,
        images=parts.images,
        unbounded_parts=parts.unbounded,
        max_output=max_output,
        output_param="max_output_tokens" if max_output else None,
        choices=1,
        stream=fields.stream(body),
        refused=tuple(refused + tools.refused),
        web_searches=searches,
        server_tool_uses=searches,
        service_tier=fields.service_tier(body, {"auto", "default", "flex", "scale", "priority", "fast"}),
        patch=patch,
        context_ref=context_ref,
        stored=body.get("store") is not False,
        prompt=Prompt(kind="responses", billed=billed, overhead=tools.overhead),
    )


def shape_embeddings(body: dict, headers: dict[str, str] | None = None) -> Shape:
    fields.check_params(body, "embeddings")
    fields.check_headers(headers or {}, "embeddings")
    model = fields.model(body)
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
        kind="embeddings",
        model=model,
        text_tokens=tokens + settings.CAPGATE["PER_REQUEST_OVERHEAD_TOKENS"],
        images=0,
        unbounded_parts=0,
        max_output=None,
        output_param=None,
        choices=1,
        stream=False,
        prompt=Prompt(kind="embeddings", billed={"input": items}),
    )


def shape_compact(body: dict, headers: dict[str, str] | None = None) -> Shape:
    """POST /v1/responses/compact: the history is bounded as /v1/responses bounds its input (its
    fields are a subset of those), but the compaction pass runs no tool (so no search is counted
    or max_tool_calls sent) and the endpoint takes no output ceiling: sizing bounds its output at
    the model's maximum and sends none."""
    fields.check_params(body, "compact")
    fields.check_headers(headers or {}, "compact")
    # Its own unlisted fields are collected once, above (the body goes upstream as sent).
    shape = shape_responses({k: v for k, v in body.items() if k in fields.ALLOWED["compact"]}, headers)
    return dataclasses.replace(shape, kind="compact", web_searches=0, server_tool_uses=0, patch={}, stored=False)


SHAPERS = {
    "chat": shape_chat,
    "messages": shape_messages,
    "embeddings": shape_embeddings,
    "responses": shape_responses,
    "compact": shape_compact,
}
