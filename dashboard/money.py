"""USD for people: nano-USD ints shown with Decimal, never float."""

from decimal import Decimal

from catalog.pricing import nano_to_usd


def format_usd(nano: int | None) -> str:
    """5_000_000_000 -> "5.00"; 1_234 -> "0.000001234" (cents always, more digits only if nonzero)."""
    if nano is None:
        return "—"
    usd = nano_to_usd(nano)
    cents = usd.quantize(Decimal("0.01"))
    if cents == usd:
        return f"{cents:,f}"
    return f"{usd.normalize():,f}"
