from django import template

from dashboard.money import format_usd

register = template.Library()


@register.filter
def usd(nano: int | None) -> str:
    """nano-USD int -> "$5.00" (Decimal, never float)."""
    return "—" if nano is None else f"${format_usd(nano)}"


@register.filter
def pct(value) -> str:
    return f"{value:.1f}%"


@register.filter
def clamp100(value) -> str:
    """A percent for a CSS width, kept inside the bar."""
    return f"{max(0, min(100, float(value))):.2f}"
