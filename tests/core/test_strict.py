"""Numbers and money a client writes as text: ASCII digits (money: and at most one decimal point),
nothing that only Python reads as a number ("1_000", "1e3", "+5", "NaN", other scripts' digits)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.money import MoneyError, is_decimal_text, usd_to_nano
from core.strict import ascii_int
from tests.security.test_strict_input import NOT_MONEY


@pytest.mark.parametrize("text", NOT_MONEY + ["-1", "\u00b2", "1 .5"])
def test_usd_text_is_only_ascii_digits_and_one_point(text):
    assert not is_decimal_text(text)
    with pytest.raises(MoneyError):
        usd_to_nano(text)


def test_usd_text_in_plain_digits_converts():
    assert usd_to_nano("1000") == 1000 * 10**9
    assert usd_to_nano("0.25") == usd_to_nano(".25") == 250_000_000
    assert usd_to_nano("5.") == 5 * 10**9
    assert usd_to_nano(Decimal("1E+3")) == 1000 * 10**9  # a Decimal is a number, not text


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("42", 42), ("²", None), ("١", None), ("1_0", None)])
def test_ascii_int_takes_ascii_digits_only(text, value):
    assert ascii_int(text) == value
    assert ascii_int("") is None and ascii_int("-1") is None and ascii_int(" 1") is None
