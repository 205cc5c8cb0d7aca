"""core/fastjson.py reads and writes JSON as the standard library does: the same value or the
same error from `loads`, the same JSON value from `dumps`."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import fastjson

EDGES = [
    # what orjson refuses and json accepts: json's answer stands
    b"NaN",
    b"[Infinity, -Infinity]",
    b'{"temperature": NaN}',
    b"1e400",
    b'{"a": -1e1000}',
    b'"\\ud800"',
    b'"\\udc00x"',
    b'"\xed\xa0\x80"',
    b"\xef\xbb\xbf{}",
    '{"\u00e9": 1}'.encode("utf-16"),
    '{"\u00e9": 1}'.encode("utf-32"),
    # integers past 64 bits: orjson reads them as floats without complaint
    b"18446744073709551616",
    b'{"max_tokens": 123456789012345678901234567890}',
    b"-9223372036854775809",
    b'{"usage": {"prompt_tokens": 99999999999999999999}}',
    # at and inside the edges of 64 bits
    b"18446744073709551615",
    b"-9223372036854775808",
    b"9223372036854775807",
    b'"1234567890123456789012345"',
    b"0.1234567890123456789012",
    # what both accept
    b'{"a": 1, "a": 2, "b": [true, false, null]}',
    b"-0",
    b"-0.0",
    b"1E5",
    b"2.5e-324",
    b"1e-400",
    b'"\\u0000\\/\\ud83d\\ude00"',
    b' \n\r\t{"x": "\x7f"} ',
    b"[" * 600 + b"]" * 600,
    # what both refuse (json's error and message)
    b"",
    b" ",
    b'"\x01"',
    b"1.",
    b".5",
    b"01",
    b"{}\x00",
    b'{"a": 1,}',
    b"[1,]",
    b'"\\a"',
    b"tru",
    b'"\xc0\x80"',
    b"\xff",
    b"[" * 1100 + b"]" * 1100,
]


def _outcome(load, raw: Any) -> tuple:
    try:
        return ("value", repr(load(raw)))  # repr: tells 0 from 0.0 and -0.0, int from float, nan
    except RecursionError:
        return ("error", "RecursionError")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize("raw", EDGES, ids=lambda r: repr(r[:24]))
def test_loads_gives_what_json_gives(raw):
    assert _outcome(fastjson.loads, raw) == _outcome(json.loads, raw)
    text = raw.decode("utf-8", "surrogatepass") if raw.isascii() else None
    if text is not None:
        assert _outcome(fastjson.loads, text) == _outcome(json.loads, text)


def test_without_the_long_digits_rule_a_count_past_64_bits_stops_being_an_int(monkeypatch):
    # Guard removal: orjson alone reads 2**64 as a float, which usage parsing would not count.
    raw = b'{"usage": {"completion_tokens": 18446744073709551616}}'
    assert fastjson.loads(raw)["usage"]["completion_tokens"] == 2**64
    monkeypatch.setattr(fastjson.GUARDS, "long_digits_by_json", False)
    assert isinstance(fastjson.loads(raw)["usage"]["completion_tokens"], float)


# Any text, lone surrogates included (json escapes them, or writes them raw without ensure_ascii).
any_text = st.text(st.characters(exclude_categories=()))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(any_text, children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from([{}, {"ensure_ascii": False}, {"separators": (",", ":")}, {"indent": 2}]))
def test_loads_of_any_json_text_equals_json(value, style):
    raw = json.dumps(value, **style).encode("utf-8", "surrogatepass")
    assert _outcome(fastjson.loads, raw) == _outcome(json.loads, raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40) | st.from_regex(rb"\A[\[\]{}:,\"\\ 0-9eE.+\-a-z\x00-\x1f\x80-\xff]{0,30}\Z"))
def test_loads_of_any_bytes_accepts_and_refuses_what_json_does(raw):
    assert _outcome(fastjson.loads, raw) == _outcome(json.loads, raw)


def _same_json(a: bytes, b: bytes) -> bool:
    return repr(json.loads(a)) == repr(json.loads(b))


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**80), max_value=2**80)
        | st.floats(allow_nan=False, allow_infinity=False)
        | any_text,
        lambda children: (
            st.lists(children, max_size=5)
            | st.tuples(children, children)
            | st.dictionaries(any_text | st.integers(-5, 5) | st.booleans() | st.none(), children, max_size=5)
        ),
        max_leaves=20,
    )
)
def test_dumps_writes_the_json_value_json_writes(value):
    assert _same_json(fastjson.dumps(value), json.dumps(value).encode())


def test_dumps_refuses_what_json_refuses_and_writes_enum_members_as_json_does():
    import dataclasses
    import datetime
    import decimal
    import enum

    from django.utils.translation import gettext_lazy

    class Tier(enum.StrEnum):
        FLEX = "flex"

    class Count(enum.IntEnum):
        ONE = 1

    @dataclasses.dataclass
    class Row:
        x: int = 1

    for value in (datetime.datetime.now(datetime.UTC), Row(), decimal.Decimal("1.5"), b"bytes", gettext_lazy("x")):
        with pytest.raises(TypeError):
            json.dumps(value)
        with pytest.raises(TypeError):
            fastjson.dumps({"v": value})
    members = {"tier": Tier.FLEX, "n": Count.ONE}
    assert _same_json(fastjson.dumps(members), json.dumps(members).encode())
    assert fastjson.dumps({"k": 2**64}) == json.dumps({"k": 2**64}).encode()


def test_dumps_writes_compact_utf8_and_nan_as_null():
    assert fastjson.dumps({"a": [1, "\u00e9"]}) == '{"a":[1,"\u00e9"]}'.encode()
    # The accepted difference (core/fastjson.py): json wrote the invalid token NaN.
    assert fastjson.dumps([math.nan, math.inf]) == b"[null,null]"
