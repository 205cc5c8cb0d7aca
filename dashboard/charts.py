"""Spend, requests, tokens and refusals over time as inline SVG (stacked bars): no JavaScript,
no CDN."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from core.money import format_usd

PALETTE = ["#2754c5", "#e07b39", "#2f855a", "#9b59b6", "#c0392b", "#7f8c8d"]
TOP = 5


@dataclass
class Chart:
    svg: SafeString
    legend: list[tuple[str, str]]  # (colour, label)
    total_nano: int


def stacked_daily(*, rows: list[tuple[date, str | None, int]], start: date, days: int) -> Chart:
    """rows: (day, group, cost_nano). The top groups by cost get a colour each; the rest is "other"."""
    totals: dict[str, int] = {}
    for _, group, cost in rows:
        key = group or "(none)"
        totals[key] = totals.get(key, 0) + cost
    top = [g for g, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]]
    colour = {g: PALETTE[i] for i, g in enumerate(top)}
    other = PALETTE[-1]
    per_day: dict[date, dict[str, int]] = {}
    for day, group, cost in rows:
        key = group or "(none)"
        key = key if key in colour else "other"
        per_day.setdefault(day, {}).setdefault(key, 0)
        per_day[day][key] += cost
    max_day = max((sum(v.values()) for v in per_day.values()), default=0)
    width, height, pad_left, pad_bottom = 720, 200, 70, 22
    plot_w, plot_h = width - pad_left - 10, height - pad_bottom - 10
    bar_w = plot_w / days
    parts = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="Daily spend">']
    # y axis: 0 and max, as USD
    parts.append(f'<line x1="{pad_left}" y1="10" x2="{pad_left}" y2="{10 + plot_h}" stroke="#ccd"/>')
    parts.append(f'<text x="{pad_left - 6}" y="{10 + plot_h}" text-anchor="end" font-size="11" fill="#667">$0</text>')
    if max_day:
        parts.append(
            f'<text x="{pad_left - 6}" y="18" text-anchor="end" font-size="11" fill="#667">'
            f"{escape(format_usd(max_day))}</text>"
        )
    for i in range(days):
        day = start + timedelta(days=i)
        x = pad_left + i * bar_w + 1
        y: float = 10 + plot_h
        stack = per_day.get(day, {})
        for key in [*top, "other"]:
            cost = stack.get(key, 0)
            if not cost or not max_day:
                continue
            h = float(Decimal(cost) / Decimal(max_day) * Decimal(plot_h))
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{colour.get(key, other)}"><title>{day.isoformat()} {escape(key)}: '
                f"{escape(format_usd(cost))}</title></rect>"
            )
        if (days - 1 - i) % 7 == 0:  # weekly labels, ending on today
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="10" '
                f'fill="#667">{day.strftime("%b %d")}</text>'
            )
    parts.append("</svg>")
    legend = [(colour[g], g) for g in top]
    if len(totals) > TOP:
        legend.append((other, "other"))
    return Chart(svg=mark_safe("".join(parts)), legend=legend, total_nano=sum(totals.values()))  # noqa: S308 — every label is escaped above


def top_groups(ranking: dict[str | None, tuple[int, ...]]) -> list[str]:
    """The TOP groups, highest ranking first (ties by name), so every chart of one page colours
    a group alike."""
    by_name = sorted(ranking.items(), key=lambda kv: kv[0] or "")
    return [g or "(none)" for g, _ in sorted(by_name, key=lambda kv: kv[1], reverse=True)[:TOP]]


def stacked_series(
    *,
    rows: list[tuple[datetime, str | None, int]],
    buckets: list[datetime],
    top: list[str],
    label: str,
    fmt: Callable[[int], str],
    hourly: bool,
) -> Chart:
    """rows: (bucket start, group, value). One bar per bucket, stacked by group; groups outside
    `top` add up as "other". `fmt` renders a value for the axis and the hover titles."""
    colour = {g: PALETTE[i] for i, g in enumerate(top)}
    other = PALETTE[-1]
    stacks: dict[datetime, dict[str, int]] = {}
    has_other = False
    for at, group, value in rows:
        key = group or "(none)"
        if key not in colour:
            key, has_other = "other", has_other or bool(value)
        stacks.setdefault(at, {}).setdefault(key, 0)
        stacks[at][key] += value
    peak = max((sum(v.values()) for v in stacks.values()), default=0)
    width, height, pad_left, pad_bottom = 720, 200, 70, 22
    plot_w, plot_h = width - pad_left - 10, height - pad_bottom - 10
    bar_w = plot_w / max(len(buckets), 1)
    every = 6 if hourly else max(1, len(buckets) // 8)
    parts = [
        f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">',
        f'<line x1="{pad_left}" y1="10" x2="{pad_left}" y2="{10 + plot_h}" stroke="#ccd"/>',
        f'<text x="{pad_left - 6}" y="{10 + plot_h}" text-anchor="end" font-size="11" fill="#667">'
        f"{escape(fmt(0))}</text>",
    ]
    if peak:
        parts.append(
            f'<text x="{pad_left - 6}" y="18" text-anchor="end" font-size="11" fill="#667">{escape(fmt(peak))}</text>'
        )
    for i, at in enumerate(buckets):
        x = pad_left + i * bar_w + 1
        y: float = 10 + plot_h
        name = at.strftime("%Y-%m-%d %H:00") if hourly else at.date().isoformat()
        for key in [*top, "other"]:
            value = stacks.get(at, {}).get(key, 0)
            if not value or not peak:
                continue
            h = float(Decimal(value) / Decimal(peak) * Decimal(plot_h))
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{colour.get(key, other)}"><title>{name} {escape(key)}: {escape(fmt(value))}</title></rect>'
            )
        if (len(buckets) - 1 - i) % every == 0:  # labels counted back from the latest bar
            text = at.strftime("%H:00") if hourly else at.strftime("%b %d")
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="10" '
                f'fill="#667">{text}</text>'
            )
    parts.append("</svg>")
    legend = [(colour[g], g) for g in top]
    if has_other:
        legend.append((other, "other"))
    total = sum(sum(v.values()) for v in stacks.values())
    return Chart(svg=mark_safe("".join(parts)), legend=legend, total_nano=total)  # noqa: S308 — labels escaped above
