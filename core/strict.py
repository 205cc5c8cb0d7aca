"""Strict parsing of numbers a client sends as text (query parameters, headers).

`str.isdigit()` is true of superscripts and other scripts' digits ("²", "١"), some of which
`int()` then refuses (a ValueError where a check said yes) and some it reads as a number the
client never wrote in ASCII; `int()` alone also takes "1_000", " 7" and "+7". A number on the
wire is ASCII digits, nothing else.
"""

from __future__ import annotations


def ascii_int(text: str) -> int | None:
    """`text` as a non-negative int when it is ASCII digits only ("0" to "9", at least one);
    otherwise None."""
    return int(text) if text.isascii() and text.isdigit() else None
