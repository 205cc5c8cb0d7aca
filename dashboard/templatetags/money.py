from django import template

from core.money import format_usd

register = template.Library()


@register.filter
def usd(nano: int | None) -> str:
    """nano-USD int -> "$5.00" (core/money.py: Decimal, never float)."""
    return "—" if nano is None else format_usd(nano)


@register.filter
def pct(value) -> str:
    return f"{value:.1f}%"


@register.filter
def clamp100(value) -> str:
    """A percent for a CSS width, kept inside the bar."""
    return f"{max(0, min(100, float(value))):.2f}"
