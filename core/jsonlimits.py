"""The one JSON loader for request bodies, with a size and a nesting-depth limit.

Python's `json` recurses once per level: a body nested a few thousand levels deep raises
RecursionError (a 500) instead of a parse error. Both the gateway (`gateway/admission/bounds.py`
`parse_json`) and the management API (`core/parsers.py`) load bodies through `loads` here, so
each refuses such a body with a 400 in its own shape. Nothing in a real request comes near the
default depth (an OpenAI request with a JSON schema nests about 20 levels).

JSON can carry a lone UTF-16 surrogate (`"\\ud800"`, or its raw bytes, which `json` decodes
with surrogatepass). Such a string is not text: encoding it as UTF-8 fails wherever it is used
(the gateway's byte bound, the database), so `loads` refuses it here, once for every door.
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


class JSONLimitError(ValueError):
    """A body over a limit. `code` and `status` are what the endpoint reports."""

    def __init__(self, message: str, *, code: str, status: int):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


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
    if maybe and _has_lone_surrogate(value):
        raise JSONLimitError(
            "The request body holds a lone UTF-16 surrogate (\\ud800-\\udfff) in a string; it is not text.",
            code="invalid_unicode",
            status=400,
        )
    return value


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string or key in parsed JSON holds a surrogate code point (json decodes a valid
    pair into one character, so any left is lone), without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


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
