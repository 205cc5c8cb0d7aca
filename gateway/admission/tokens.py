"""Exact prompt token counts for models whose tokenizer is public and local.

The byte bound (gateway/admission/bounds.py) stays the rule; this count replaces it only for a model the
catalog maps to an encoding (`Model.tokenizer`), and only when the byte bound would refuse or
take a large share of the tightest ceiling's room (gateway/admission/sizing.py). It stays an upper bound:

- Message text (role, name, string content, text parts) is tokenized with the model's encoding,
  plus the chat format's framing as OpenAI documents it (its cookbook "How to count tokens with
  tiktoken", checked there against the API's usage): 3 tokens per message, 1 per name, 3 priming
  the reply. Each text part of a list content gets a margin (PART_MARGIN_TOKENS): how parts are
  joined is not documented, and joining can add a token at the seam.
- The Responses API renders its input into the same format: `instructions` as a system (or
  developer) message, a string `input` as one user message, message items as messages, and a
  tool's output (function_call_output, custom_tool_call_output) as a message whose text is the
  output. The same framing reproduces what OpenAI's own count (POST /v1/responses/input_tokens)
  answers: 13 for the input "Hello, how are you?". A call the model made (function_call,
  custom_tool_call), a reasoning item (its encrypted_content cannot be read locally) and any
  other item keep their byte bound, with a message's framing each.
- Everything else the provider may render into the prompt (tools, functions, response_format,
  text.format, tool calls, an item's ids and status, any field an operator classed as tokens)
  keeps its byte bound: its compact JSON's UTF-8 bytes. Only the fields NOT_PROMPT names (the
  billing inventory's free fields, output ceilings, prices, earlier context bounded on its own)
  are left out.
- Images keep the model's image bound and tool-use overheads their fixed amounts (the caller
  adds those, as for the byte bound).

The encoding files are built into TOKENIZER_DIR by scripts/tiktoken_data.py at install time and
checked against tiktoken's pinned sha256 before use. Nothing is fetched: with the files missing
or altered, `encoding()` returns None and the gateway keeps the byte bound.

An encoding is loaded only when a model needs it: at startup for those named by the catalog's
routed models (`warm`), else at its first count. A loaded encoding holds 40-110 MiB per process,
so a deployment that routes to no such model (Anthropic, Gemini, the echo demo) loads none. With
CAPGATE_TOKEN_COUNTER set, a worker loads none at all: one token counter process per host holds
them and counts for every worker (gateway/admission/token_counter.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection

from catalog.models import Model
from gateway import billing
from gateway.admission import encodings, token_counter

log = logging.getLogger(__name__)

ENCODINGS = encodings.ENCODINGS
SHA256 = encodings.SHA256
cache_name = encodings.cache_name

# The chat format's documented framing (OpenAI cookbook, gpt-3.5-turbo-0613 and later).
TOKENS_PER_MESSAGE = 3  # <|start|>, the separator after the role, <|end|>
TOKENS_PER_NAME = 1
TOKENS_PER_REPLY = 3  # every reply is primed with <|start|>assistant<|message|>
# Undocumented: how a list content's text parts are joined. Per part, for a joiner and a seam.
PART_MARGIN_TOKENS = 2
# Body fields that are not prompt text, beside those the billing inventory classes as free
# (gateway/billing/live.py): the counted text itself, output ceilings, prices, and earlier context
# the sizing bounds on its own. Every other field present keeps its byte bound, so a field added
# later, or one an operator classes as tokens, is never left out of the count.
NOT_PROMPT = {
    "chat": frozenset(
        {
            "model",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "prediction",  # bounded as output (bounds.shape_chat)
            "reasoning_effort",
            "verbosity",
            "service_tier",
            "audio",
            "modalities",
            "web_search_options",
            "moderation",
        }
    ),
    "responses": frozenset(
        {
            "model",
            "input",
            "instructions",
            "max_output_tokens",
            "reasoning",
            "previous_response_id",  # the earlier context, added by the sizing
            "conversation",
            "truncation",
            "background",
            "background_options",
            "service_tier",
            "prompt",
            "context_management",
            "moderation",
        }
    ),
}
_TEXT_KEYS = ("role", "name", "content")
_CHAT_PARTS = ("text",)
_RESPONSES_PARTS = ("input_text", "output_text")
# Responses items rendered as a message whose text is one field, by type, with that field. A
# message item names its role; a tool's output is framed as a message from the tool.
_TEXT_ITEMS = {"message": "content", "function_call_output": "output", "custom_tool_call_output": "output"}

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def encoding(name: str | None) -> Any | None:
    """What counts for `name`: the tiktoken Encoding, loaded once per process (~0.5 s for
    o200k_base), or, with CAPGATE_TOKEN_COUNTER set, the token counter's (token_counter.Remote,
    nothing loaded here). None (use bytes) when the name is unknown or its file is missing or
    fails its checksum."""
    if name not in SHA256:
        return None
    counter = settings.CAPGATE["TOKEN_COUNTER"]
    if counter:
        return token_counter.Remote(counter, name)
    enc = _loaded.get(name)
    if enc is not None:
        return enc or None  # False: known missing
    with _lock:
        if name not in _loaded:
            _loaded[name] = encodings.load(name, Path(settings.CAPGATE["TOKENIZER_DIR"])) or False
        return _loaded[name] or None


def used() -> list[str]:
    """The encodings named by the catalog's models that some route sends traffic to. The price
    catalog lists every provider's models (`load_prices`), so a model only counts once a route
    targets it; a model without a tokenizer is bounded by bytes."""
    names = Model.objects.filter(tokenizer__in=ENCODINGS, route_targets__isnull=False).values_list(
        "tokenizer", flat=True
    )
    return sorted({name for name in names if name})


def warm() -> None:
    """Load the encodings routed models use (`used`), and only those: the gateway calls this at
    startup on a worker thread, so the first exact count does not pay the load (0.3-0.5 s each)
    on the admission path. Missing data is logged here, once, instead of at the first request
    that would count. An encoding a model takes up later loads at its first count."""
    try:
        names = used()
    except DatabaseError:
        log.warning("catalog unreadable at startup: encodings load at their first count instead")
        return
    finally:
        connection.close()  # this thread's own connection (an executor's), not kept open
    for name in names:
        enc = encoding(name)
        if isinstance(enc, token_counter.Remote):
            try:
                enc.lengths([])  # the counter loads it now
            except token_counter.Unavailable:
                pass  # logged: counts keep the byte bound until the counter answers


def reset() -> None:
    """Forget loaded encodings (tests)."""
    with _lock:
        _loaded.clear()


@dataclass(frozen=True)
class Prompt:
    """What an exact count needs from a request body, kept by reference: the work is done
    only when a count is asked for (most requests never need one)."""

    kind: str  # chat | responses | embeddings
    # chat, responses: the body with image payloads stripped (responses: `input` as a list of
    # items); embeddings: {"input": [...]}
    billed: dict
    overhead: int = 0  # fixed tokens beside the text (tool-use overheads, earlier context)


def _bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _side(kind: str, body: dict) -> dict:
    """The body's fields beside its counted text that keep their byte bound."""
    fields = billing.FIELDS[kind]
    return {
        k: v
        for k, v in body.items()
        if v is not None and k not in NOT_PROMPT[kind] and not (k in fields and fields[k].cls == billing.FREE)
    }


def _content(content: Any, n: Callable[[str], int], parts: tuple[str, ...]) -> int:
    """A message's content: a string as its tokens; text parts as theirs plus a margin each; any
    other part (an image's stripped stub, a refusal) and any other key of a part as bytes."""
    if isinstance(content, str):
        return n(content)
    if not isinstance(content, list):
        return _bytes(content) if content is not None else 0
    total = 0
    for part in content:
        text = part.get("text") if isinstance(part, dict) and part.get("type") in parts else None
        if isinstance(text, str):
            rest = {k: v for k, v in part.items() if k not in ("type", "text")}
            total += n(text) + PART_MARGIN_TOKENS + (_bytes(rest) if rest else 0)
        else:
            total += _bytes(part) + PART_MARGIN_TOKENS  # an image's payload is stripped
    return total


def _role(role: Any, n: Callable[[str], int]) -> int:
    return n(role) if isinstance(role, str) else _bytes(role)


def _chat(body: dict, n: Callable[[str], int]) -> int:
    total = TOKENS_PER_REPLY
    extra = _side("chat", body)
    if extra:
        total += _bytes(extra)
    for message in body["messages"]:
        total += TOKENS_PER_MESSAGE + _role(message["role"], n)
        name = message.get("name")
        if name is not None:
            total += TOKENS_PER_NAME + (n(name) if isinstance(name, str) else _bytes(name))
        total += _content(message.get("content"), n, _CHAT_PARTS)
        rest = {k: v for k, v in message.items() if k not in _TEXT_KEYS}
        if rest:
            total += _bytes(rest)
    return total


def _responses(body: dict, n: Callable[[str], int]) -> int:
    total = TOKENS_PER_REPLY
    extra = _side("responses", body)
    if extra:
        total += _bytes(extra)
    instructions = body.get("instructions")
    if instructions is not None:
        # A system message, or a developer message for a reasoning model: the longer role.
        total += TOKENS_PER_MESSAGE + max(n("system"), n("developer"))
        total += n(instructions) if isinstance(instructions, str) else _bytes(instructions)
    for item in body["input"]:
        kind = item.get("type", "message")
        field = _TEXT_ITEMS.get(kind) if isinstance(kind, str) else None
        total += TOKENS_PER_MESSAGE
        if kind == "message":
            total += _role(item.get("role"), n)
        else:
            total += max(n("assistant"), n("tool"))  # the header of a call or its output
        if field is not None:
            total += _content(item.get(field), n, _RESPONSES_PARTS)
        # The type of an item counted here only picks the framing counted above; every other
        # key (ids, status, a call's id) and every other item (a call's name and arguments, a
        # reasoning item) keeps its bytes.
        rest = {k: v for k, v in item.items() if k not in ("role", field) and (field is None or k != "type")}
        if rest:
            total += _bytes(rest)
    return total


def count(prompt: Prompt, enc: Any) -> int:
    """An upper bound on the prompt tokens the provider bills for `prompt` under `enc` (what
    `encoding` gave). With the token counter's, the prompt's texts go to it in one request; raises
    token_counter.Unavailable when it does not answer (the caller keeps the byte bound)."""
    if isinstance(enc, token_counter.Remote):
        texts: dict[str, None] = {}

        def collect(text: str) -> int:
            texts[text] = None
            return 0

        _count(prompt, collect)  # which texts, first: then one round trip counts them all
        unique = list(texts)
        return _count(prompt, dict(zip(unique, enc.lengths(unique), strict=True)).__getitem__)
    encode = enc.encode_ordinary  # text as text: a "<|endoftext|>" in a message is not a special token
    return _count(prompt, lambda text: len(encode(text)))


def _count(prompt: Prompt, n: Callable[[str], int]) -> int:
    """The bound, with `n` giving a text's tokens."""
    if prompt.kind == "embeddings":
        total = 0
        for item in prompt.billed["input"]:
            total += n(item) if isinstance(item, str) else (len(item) if isinstance(item, list) else 1)
        return total + prompt.overhead
    if prompt.kind == "responses":
        return _responses(prompt.billed, n) + prompt.overhead
    return _chat(prompt.billed, n) + prompt.overhead
