"""JSON read and written through orjson, with exactly the results the standard library gives.

The gateway parses JSON several times per request (the client's body, the provider's answer,
every usage event of a stream) and writes its own answers; orjson does both several times faster
than `json`. It is used only where its answer is the one `json` would give:

- `loads`: what orjson refuses is handed to `json.loads`, which accepts or refuses it as it always
  did, with its own error and message (the one a client reads in its 400). That covers everything
  `json` accepts beyond RFC 8259: NaN and Infinity, numbers beyond a double's range (read as
  inf), lone surrogates (refused later by core/jsonlimits.py, in their own words), UTF-16 or
  UTF-32 bytes and a UTF-8 byte order mark. One difference orjson does not refuse: it reads an
  integer beyond 64 bits as a float (a token count of 2**64 would stop being an int). So a text
  with 19 digits in a row, the shortest that can leave 64 bits, is read by `json` too.
- `dumps` (bytes): orjson writes compact UTF-8 where `json` wrote `", "` and `\\u` escapes: the
  same JSON value. Keys that are not strings are written as `json` writes them (OPT_NON_STR_KEYS).
  What orjson would write differently or not at all is written by `json`: integers beyond 64 bits,
  lone surrogates, and subclasses of builtins (an enum member, a lazy string); datetimes and
  dataclasses, which orjson would write and `json` refuses, are refused as before. One accepted
  difference: a NaN or infinite float is written `null` (valid JSON), where `json` wrote its
  invalid `NaN` token; nothing the gateway writes with `dumps` holds one.

Tests: tests/core/test_fastjson.py compares both loaders on edge cases and generated texts.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from core.guards import Guards

# Removal test: tests/core/test_fastjson.py.
GUARDS = Guards(
    long_digits_by_json="a text with an integer that may exceed 64 bits is read by json, which keeps it an int",
)
# 19 digits can exceed a signed 64-bit integer (9223372036854775807 has 19); fewer never do.
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_STR = re.compile(r"[0-9]{19}")
_DUMPS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_DUMPS |= orjson.OPT_PASSTHROUGH_SUBCLASS


def loads(raw: bytes | bytearray | str) -> Any:
    """`json.loads(raw)`, faster: the same value, or the same error."""
    long_digits = _LONG_DIGITS_STR.search(raw) if isinstance(raw, str) else _LONG_DIGITS_BYTES.search(raw)
    if long_digits is None or not GUARDS.long_digits_by_json:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # json decides, and words its own error
    return json.loads(raw)


def _refuse(value: Any) -> Any:
    raise TypeError  # orjson hands over what it would not write as json does: json writes it


def dumps(value: Any) -> bytes:
    """`json.dumps(value).encode()` as compact UTF-8: the same JSON value (see the module's note)."""
    try:
        return orjson.dumps(value, default=_refuse, option=_DUMPS)
    except TypeError:
        return json.dumps(value).encode()
