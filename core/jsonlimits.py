"""The one JSON loader for request bodies, with a size and a nesting-depth limit.

Python's `json` recurses once per level: a body nested a few thousand levels deep raises
RecursionError (a 500) instead of a parse error. Both the gateway (`gateway/admission/bounds.py`
`parse_json`) and the management API (`core/parsers.py`) load bodies through `loads` here, so
each refuses such a body with a 400 in its own shape. Nothing in a real request comes near the
default depth (an OpenAI request with a JSON schema nests about 20 levels).

JSON can carry a lone UTF-16 surrogate (`"\\ud800"`, or its raw bytes, which `json` decodes
with surrogatepass). Such a string is not text: encoding it as UTF-8 fails wherever it is used
(the gateway's byte bound, the database), so `loads` refuses it here, once for every door.
A NUL character (`"\\u0000"`) is refused the same way: PostgreSQL text and jsonb cannot hold
it, so a string carrying one fails at the first query that names it (a model, a request id, a
stored input) — a 400 here instead of a database error there.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from core import fastjson

DEFAULT_MAX_DEPTH = 64
_CONTAINERS = (dict, list)
# Where a lone surrogate can come from: a \uD800-\uDFFF escape, or its UTF-8-like raw bytes
# (ED A0-BF ..). Valid pairs match too; the walk below then finds them whole (json joins a pair
# into one character), so only a body that may hold one pays for the walk.
_MAYBE_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_MAYBE_SURROGATE_STR = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# JSON writes NUL only as an escape (a raw control character is a parse error); `\\u0000` matches
# an escaped backslash before "u0000" too, and the walk then finds no NUL.
_MAYBE_NUL_BYTES = re.compile(rb"\\u0000")
_MAYBE_NUL_STR = re.compile(r"\\u0000|\x00")
_NUL = re.compile("\x00")


class JSONLimitError(ValueError):
    """A body over a limit. `code` and `status` are what the endpoint reports; `param`, where
    known, the field that holds the refused string ("messages[0].content", "" for the top)."""

    def __init__(self, message: str, *, code: str, status: int, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.param = param


def max_depth() -> int:
    return int(settings.CAPGATE.get("MAX_JSON_DEPTH", DEFAULT_MAX_DEPTH))


def loads(raw: bytes | str, *, max_bytes: int | None = None, depth: int | None = None) -> Any:
    """Parse `raw` as JSON, refusing a body over `max_bytes` (413) or nested deeper than `depth`
    levels (400; default CAPGATE["MAX_JSON_DEPTH"]). Other malformed input raises ValueError
    (json.JSONDecodeError or UnicodeDecodeError) as json.loads does."""
    limit = max_depth() if depth is None else depth
    if max_bytes is not None and len(raw) > max_bytes:
        raise JSONLimitError(
            f"The request body is larger than {max_bytes} bytes.", code="request_too_large", status=413
        )
    too_deep = JSONLimitError(f"The request body nests deeper than {limit} levels.", code="json_too_deep", status=400)
    # Cheap and exact when it applies: a body with no more brackets than the limit cannot
    # nest deeper (counted in C, before any parsing).
    opens = raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes) else raw.count("[") + raw.count("{")
    try:
        value = fastjson.loads(raw)  # json.loads's value and errors, faster (core/fastjson.py)
    except RecursionError:
        raise too_deep from None
    if opens > limit and _deeper_than(value, limit):
        raise too_deep
    maybe = _MAYBE_SURROGATE_BYTES.search(raw) if isinstance(raw, bytes) else _MAYBE_SURROGATE_STR.search(raw)
    if maybe and (where := _found_in(value, _SURROGATE)) is not None:
        raise JSONLimitError(
            f"{_named(where)} holds a lone UTF-16 surrogate (\\ud800-\\udfff) in a string; it is not text.",
            code="invalid_unicode",
            status=400,
            param=where,
        )
    maybe = _MAYBE_NUL_BYTES.search(raw) if isinstance(raw, bytes) else _MAYBE_NUL_STR.search(raw)
    if maybe and (where := _found_in(value, _NUL)) is not None:
        raise JSONLimitError(
            f"{_named(where)} holds a NUL character (\\u0000); capgate cannot store one.",
            code="nul_character",
            status=400,
            param=where,
        )
    return value


def _named(where: str) -> str:
    return f"'{where}'" if where else "The request body"


def _found_in(value: Any, pattern: re.Pattern[str]) -> str | None:
    """Where a string or key in parsed JSON matches `pattern` (a surrogate code point: json
    decodes a valid pair into one character, so any left is lone; a NUL), as a path such as
    "messages[0].content" ("" for the top value, an object for its own key); None if nowhere.
    Without recursion; a path is built only for a container or a match (a long list of numbers
    or strings costs no string per item)."""
    if isinstance(value, str):
        return "" if pattern.search(value) else None
    stack: list[tuple[Any, str]] = [(value, "")] if isinstance(value, _CONTAINERS) else []
    while stack:
        node, path = stack.pop()
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in pairs:
            if isinstance(key, str) and pattern.search(key):
                return path
            if isinstance(child, str):
                if pattern.search(child):
                    return _child(path, key)
            elif isinstance(child, _CONTAINERS):
                stack.append((child, _child(path, key)))
    return None


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests more than `limit` levels (`[]` is one), without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, _CONTAINERS) else []
    while stack:
        node, level = stack.pop()
        if level > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        # A long flat list (embedding token ids) is skipped in C: only its types are looked at.
        if isinstance(node, list) and dict not in (kinds := set(map(type, node))) and list not in kinds:
            continue
        stack.extend((child, level + 1) for child in children if isinstance(child, _CONTAINERS))
    return False
