"""Charts: spend, tokens, requests and refusals over a range, stacked by project, key, model or
customer. Spend and tokens come from usage records, requests and refusals from the request log:
two grouped queries in all, whatever the range."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from alerts.selectors import usage_series
from core.money import format_usd
from dashboard.access import org_view, render_org
from dashboard.charts import stacked_series, top_groups
from dashboard.forms import ChartForm
from requestlog.selectors import request_series
from tenants.selectors import Access

# The same paths on UsageRecord and RequestLogEntry. Keys group by name, as the overview does.
GROUP_FIELDS = {
    "project": "project__slug",
    "key": "api_key__name",
    "model": "model",
    "customer": "end_customer__external_id",
}


def _count(n: int) -> str:
    return f"{n:,}"


@org_view()
def charts(request: HttpRequest, access: Access) -> HttpResponse:
    form = ChartForm(request.GET)
    if not form.is_valid():
        response = render_org(request, access, "dashboard/charts.html", "charts", form=form, charts=[])
        response.status_code = 400  # a form error, and nothing drawn from a range we do not understand
        return response
    since, bucket, buckets = form.window(timezone.now())
    until = buckets[-1] + (timedelta(hours=1) if bucket == "hour" else timedelta(days=1))
    org, group_field = access.organization, GROUP_FIELDS[form.cleaned_data["by"]]
    usage = usage_series(organization=org, since=since, until=until, bucket=bucket, group_field=group_field)
    requests = request_series(organization=org, since=since, until=until, bucket=bucket, group_field=group_field)
    # One colour per group on every chart: rank groups by spend, then by requests.
    spend: dict[str | None, int] = {}
    counted: dict[str | None, int] = {}
    for _, group, cost, _tokens in usage:
        spend[group] = spend.get(group, 0) + cost
    for _, group, n, _refused in requests:
        counted[group] = counted.get(group, 0) + n
    top = top_groups({g: (spend.get(g, 0), counted.get(g, 0)) for g in spend.keys() | counted.keys()})
    hourly = bucket == "hour"
    series: list[tuple[str, list[tuple[datetime, str | None, int]], Callable[[int], str]]] = [
        ("Spend", [(at, g, cost) for at, g, cost, _ in usage], format_usd),
        ("Tokens", [(at, g, tokens) for at, g, _, tokens in usage], _count),
        ("Requests", [(at, g, n) for at, g, n, _ in requests], _count),
        ("Refusals", [(at, g, refused) for at, g, _, refused in requests], _count),
    ]
    drawn = [
        (label, fmt, stacked_series(rows=rows, buckets=buckets, top=top, label=label, fmt=fmt, hourly=hourly))
        for label, rows, fmt in series
    ]
    return render_org(
        request,
        access,
        "dashboard/charts.html",
        "charts",
        form=form.drawn(buckets),
        since=since,
        until=until,
        charts=[(label, fmt(chart.total_nano), chart) for label, fmt, chart in drawn],
        by=form.cleaned_data["by"],
    )
