"""core/money.py: the one place nano-USD is converted and formatted."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.money import (
    MAX_AMOUNT_NANO,
    MAX_AMOUNT_USD,
    NANO_PER_USD,
    MoneyError,
    format_usd,
    format_usd_brief,
    nano_to_usd,
    usd_input,
    usd_str,
    usd_to_nano,
)


def test_zero_and_one_nano_round_trip_exactly():
    assert usd_to_nano("0") == 0 and nano_to_usd(0) == 0
    assert usd_to_nano("0.000000001") == 1
    assert nano_to_usd(1) == Decimal("0.000000001")
    assert usd_str(0) == "0.000000000" and usd_str(1) == "0.000000001"
    assert format_usd(0) == "$0.00" and format_usd(1) == "$0.000000001"


@pytest.mark.parametrize("amount", ["0.1", "0.2", "0.3", "1.23456789", "4611686018", "0.000000007"])
def test_decimal_strings_convert_exactly_both_ways(amount):
    # 0.1 + 0.2 is the classic float failure; through Decimal every digit survives
    nano = usd_to_nano(amount)
    assert nano_to_usd(nano) == Decimal(amount)
    assert Decimal(usd_str(nano)) == Decimal(amount)


def test_sub_nano_digits_round_half_up_and_worst_cases_round_up():
    assert usd_to_nano("0.0000000004") == 0
    assert usd_to_nano("0.0000000005") == 1  # half-up (an actual cost, a person's amount)
    assert usd_to_nano("0.0000000015") == 2  # half-up, not half-even
    assert usd_to_nano("0.0000000025") == 3
    assert usd_to_nano("0.0000000001", round_up=True) == 1  # a worst case never rounds down
    assert usd_to_nano("0.000000001", round_up=True) == 1  # exact values stay exact
    assert usd_to_nano(Decimal("1.0000000001"), round_up=True) == NANO_PER_USD + 1


def test_the_maximum_is_one_number():
    assert MAX_AMOUNT_NANO == 2**62
    assert MAX_AMOUNT_USD == Decimal("4611686018")
    # every accepted USD value fits in the nano maximum; the next cent does not pass
    assert usd_to_nano(MAX_AMOUNT_USD) <= MAX_AMOUNT_NANO
    assert usd_to_nano(MAX_AMOUNT_USD, round_up=True) <= MAX_AMOUNT_NANO
    with pytest.raises(MoneyError, match="at most 4611686018 USD"):
        usd_to_nano(MAX_AMOUNT_USD + Decimal("0.01"))
    assert usd_to_nano("5", maximum=Decimal(5)) == 5 * NANO_PER_USD
    with pytest.raises(MoneyError, match="at most 5 USD"):
        usd_to_nano("5.000000001", maximum=Decimal(5))


@pytest.mark.parametrize("amount", ["-1", "-0.000000001", Decimal("-5"), -3])
def test_negative_amounts_are_refused(amount):
    with pytest.raises(MoneyError, match="must not be negative"):
        usd_to_nano(amount)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "decimal USD amount such as"),
        ("", "decimal USD amount such as"),
        ("1,000", "decimal USD amount such as"),
        ("$5", "decimal USD amount such as"),
        ("NaN", "decimal USD amount such as"),  # text is ASCII digits and one point, nothing else
        ("Infinity", "decimal USD amount such as"),
        ("-inf", "decimal USD amount such as"),
        ("1_000", "decimal USD amount such as"),
        (Decimal("NaN"), "finite decimal USD amount"),
        (Decimal("-Infinity"), "finite decimal USD amount"),
        (0.1, "not float"),  # a float has already lost the amount
        (True, "not bool"),
        (None, "not NoneType"),
        ([1], "not list"),
    ],
)
def test_bad_values_are_refused_with_a_clear_error(value, message):
    with pytest.raises(MoneyError, match=message) as caught:
        usd_to_nano(value)
    assert isinstance(caught.value, ValueError) and caught.value.message == str(caught.value)


def test_nano_must_be_an_int():
    for bad in (1.5, True, Decimal(1), "1"):
        with pytest.raises(TypeError, match="nano-USD must be an int"):
            nano_to_usd(bad)  # type: ignore[arg-type]


def test_strings_around_the_amount_are_trimmed():
    assert usd_to_nano(" 2.50 ") == 2_500_000_000


@pytest.mark.parametrize(
    ("nano", "shown"),
    [
        (5_000_000_000, "$5.00"),
        (1_200_000, "$0.0012"),
        (37_005_000, "$0.037005"),  # not "$0.04": small amounts keep their digits
        (12_340_000_000, "$12.34"),
        (99_999_999_999, "$99.999999999"),
        (100_004_000_000, "$100.00"),  # from $100 the cent is enough, rounded half-up
        (100_005_000_000, "$100.01"),
        (1_234_567 * NANO_PER_USD, "$1,234,567.00"),
        (-500_000_000, "-$0.50"),
        (-1, "-$0.000000001"),
        (MAX_AMOUNT_NANO, "$4,611,686,018.43"),
    ],
)
def test_format_usd(nano, shown):
    assert format_usd(nano) == shown


def test_format_usd_exact_and_without_symbol():
    assert format_usd(1_234 * NANO_PER_USD + 1, exact=True) == "$1,234.000000001"
    assert format_usd(-2, exact=True) == "-$0.000000002"
    assert format_usd(5 * NANO_PER_USD, symbol=False) == "5.00"
    assert usd_str(-1_500_000_000) == "-1.500000000"


@pytest.mark.parametrize(
    ("nano", "value"),
    [(5 * NANO_PER_USD, "5"), (10 * NANO_PER_USD, "10"), (1_200_000, "0.0012"), (0, "0")],
)
def test_usd_input_is_the_shortest_exact_decimal(nano, value):
    shown = usd_input(nano)
    assert str(shown) == value and shown == nano_to_usd(nano)


@pytest.mark.parametrize(
    ("nano", "up", "text"),
    [
        (89_631_000, False, "$0.0896"),  # a refusal's remaining: rounded down
        (600_369_000, True, "$0.601"),  # its worst case: rounded up
        (690_000_000, False, "$0.69"),
        (0, False, "$0.00"),
        (123, False, "$0.000000123"),
        (999_600_000, True, "$1.00"),
        (12_345_678_900_000, False, "$12,345.67"),
        (-1_500_000_000, False, "-$1.50"),
    ],
)
def test_format_usd_brief_reads_in_dollars_rounded_the_safe_way(nano, up, text):
    assert format_usd_brief(nano, up=up) == text
