"""nano-USD, the one place it is converted and formatted.

Money is an `int` of nano-USD (10^-9 USD) everywhere; a USD amount a person typed or reads is a
`Decimal` or a string. Nothing here goes through float. Price math (USD per 1M tokens to a cost)
is `catalog/pricing.py`'s; it uses NANO_PER_USD from here.

Rounding, where a USD amount has digits below one nano-USD:
- a worst case (an amount to reserve) rounds *up*, so the bound is never below what it bounds;
- everything else (an actual cost, a budget amount a person set) rounds half-up.
Display rounds half-up to the cent at $100 and more (`format_usd`).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_HALF_UP, ROUND_UP, Decimal

NANO_PER_USD = 1_000_000_000
_NANO_PER_USD = Decimal(NANO_PER_USD)

# The largest amount of money capgate stores as one number (a budget, a default cap): 2**62
# nano-USD, about $4.6 billion. Counters are signed 64-bit (BigIntegerField): two amounts at the
# maximum still add up without overflowing. MAX_AMOUNT_USD is its whole-dollar part, the
# largest value a USD field accepts, so every accepted value converts to <= MAX_AMOUNT_NANO.
MAX_AMOUNT_NANO = 2**62
MAX_AMOUNT_USD = Decimal(MAX_AMOUNT_NANO // NANO_PER_USD)

# A USD amount written as text: ASCII digits with at most one decimal point, nothing else.
# Decimal() alone also reads "1_000" (a thousand), "1e3", "+5", "NaN", " 1 " and other scripts'
# digits; a money header or field is never any of those.
_DECIMAL_TEXT = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")

_CENT = Decimal("0.01")
_NANO = Decimal("0.000000001")


class MoneyError(ValueError):
    """A USD amount that cannot be money. `message` completes a sentence about the field:
    "'amount_usd' " + message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def is_decimal_text(text: str) -> bool:
    """Whether `text` (already trimmed) is ASCII digits with at most one decimal point."""
    return _DECIMAL_TEXT.fullmatch(text) is not None


def usd_to_nano(usd: Decimal | str | int, *, round_up: bool = False, maximum: Decimal = MAX_AMOUNT_USD) -> int:
    """A USD amount (a Decimal, a decimal string such as "0.0012", or an int; never a float) ->
    nano-USD. Digits below a nano-USD round half-up, or up with `round_up` (worst cases).
    Refuses (MoneyError) a float, a bool, a string that is not ASCII digits with at most one
    decimal point (around it, whitespace is trimmed), a number that is not finite, a negative
    amount and one above `maximum` (default MAX_AMOUNT_USD)."""
    if isinstance(usd, bool) or not isinstance(usd, Decimal | str | int):
        # A float has already lost the amount (0.1 is not 0.1): refuse it rather than guess.
        raise MoneyError(f"must be a decimal USD amount as a string, not {type(usd).__name__}")
    if isinstance(usd, str):
        text = usd.strip()
        if text.startswith("-") and is_decimal_text(text[1:]):
            raise MoneyError(f"must not be negative (got {text[:40]})")
        if not is_decimal_text(text):
            raise MoneyError(
                f'must be a decimal USD amount such as "0.25" (ASCII digits and at most one decimal point), '
                f"not {usd[:40]!r}"
            )
        usd = text
    amount = Decimal(usd)
    if not amount.is_finite():
        raise MoneyError(f"must be a finite decimal USD amount, not {str(usd)[:40]!r}")
    if amount < 0:
        raise MoneyError(f"must not be negative (got {amount})")
    if amount > maximum:
        raise MoneyError(f"must be at most {maximum} USD (got {amount})")
    rounding = ROUND_CEILING if round_up else ROUND_HALF_UP
    return int((amount * _NANO_PER_USD).to_integral_value(rounding=rounding))


def nano_to_usd(nano: int) -> Decimal:
    """nano-USD -> the exact USD Decimal (1_234 -> Decimal("0.000001234"))."""
    if isinstance(nano, bool) or not isinstance(nano, int):
        raise TypeError(f"nano-USD must be an int, not {type(nano).__name__}")
    return Decimal(nano) / _NANO_PER_USD


def usd_input(nano: int) -> Decimal:
    """nano-USD -> the shortest exact Decimal, for a form field's initial value: 5_000_000_000 ->
    Decimal("5"), 10 * 10**9 -> Decimal("10") (not "1E+1"), 1_200_000 -> Decimal("0.0012")."""
    usd = nano_to_usd(nano).normalize()
    exponent = usd.as_tuple().exponent
    return usd.quantize(Decimal(1)) if isinstance(exponent, int) and exponent > 0 else usd


def usd_str(nano: int) -> str:
    """Exact USD with nine decimals and no symbol, for headers, API fields and CSV
    ("0.000123000", "-1.500000000")."""
    return f"{nano_to_usd(nano).quantize(_NANO):f}"


def format_usd(nano: int, *, exact: bool = False, symbol: bool = True) -> str:
    """USD for people: 1_000_000_000 -> "$1.00", 1_200_000 -> "$0.0012", 12_345 * 10**9 ->
    "$12,345.00". Cents always; more digits only when they are not zero and the amount is under
    $100 (an alert about a $0.037 request should not say $0.04; at $100 and more the cent is
    enough). `exact` keeps all nine decimals at any size (the counter audit); `symbol=False`
    leaves out the "$" (a value shown under a field already named *_usd). Negative amounts read
    "-$0.50"."""
    usd = nano_to_usd(nano)
    sign, usd = ("-", -usd) if usd < 0 else ("", usd)
    if exact:
        text = f"{usd.quantize(_NANO):,f}"
    else:
        cents = usd.quantize(_CENT, rounding=ROUND_HALF_UP)
        if cents == usd or usd >= 100:
            text = f"{cents:,f}"
        else:
            text = f"{usd.normalize():,f}"
    return f"{sign}{'$' if symbol else ''}{text}"


def format_usd_brief(nano: int, *, up: bool = False) -> str:
    """USD for a sentence read at a glance: cents from $1 up, three significant digits below
    (89_631_000 -> "$0.0896", 600_369_000 -> "$0.60", 123 -> "$0.000000123"), rounded toward zero,
    or away from it with `up`: a refusal states its remaining rounded down and its worst case
    rounded up, so the figures it shows compare as the exact ones did (those go in headers)."""
    usd = nano_to_usd(nano)
    sign, usd = ("-", -usd) if usd < 0 else ("", usd)
    step = _CENT if usd >= 1 or usd == 0 else min(_CENT, Decimal(1).scaleb(usd.adjusted() - 2))
    text = f"{usd.quantize(step, rounding=ROUND_UP if up else ROUND_DOWN):,f}"
    whole, _, decimals = text.partition(".")
    return f"{sign}${whole}.{decimals.rstrip('0').ljust(2, '0')}"
