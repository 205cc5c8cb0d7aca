"""Reads on usage: the filtered log, totals grouped by day / project / key / model / end
customer, and the daily series the dashboard charts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from django.db.models import Count, F, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import TruncDay, TruncHour

from alerts.models import AlertEvent
from ledger.models import UsageRecord
from tenants.models import ApiKey, Organization

GROUPS = {
    "day": TruncDay("admitted_at"),
    "project": F("project__slug"),
    "key": F("api_key__name"),
    "model": F("model"),
    "end_customer": F("end_customer__external_id"),
    "status": F("status"),
}


@dataclass(frozen=True)
class UsageFilters:
    since: datetime | None = None
    until: datetime | None = None
    project_id: int | None = None
    api_key_id: int | None = None
    end_customer_id: int | None = None
    model: str | None = None
    status: str | None = None


def usage_records(*, organization: Organization, filters: UsageFilters) -> QuerySet[UsageRecord]:
    qs = UsageRecord.objects.filter(organization=organization)
    if filters.since:
        qs = qs.filter(admitted_at__gte=filters.since)
    if filters.until:
        qs = qs.filter(admitted_at__lt=filters.until)
    for field in ("project_id", "api_key_id", "end_customer_id", "model", "status"):
        value = getattr(filters, field)
        if value not in (None, ""):
            qs = qs.filter(**{field: value})
    return qs


def usage_summary(*, organization: Organization, filters: UsageFilters, group_by: str) -> list[dict]:
    """[{"group", "requests", "cost_nano", "excess_nano", "input_tokens", "output_tokens"}], by cost."""
    qs = usage_records(organization=organization, filters=filters).annotate(group=GROUPS[group_by])
    rows = qs.values("group").annotate(
        requests=Count("id"),
        cost_nano=Sum("cost_nano"),
        excess_nano=Sum("excess_nano"),
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
    )
    order = ["group"] if group_by == "day" else ["-cost_nano", "group"]
    # cast: .values() rows are plain dicts at runtime; the stubs type them as a TypedDict.
    return cast("list[dict]", list(rows.order_by(*order)))


def totals(*, organization: Organization, filters: UsageFilters) -> dict:
    return usage_records(organization=organization, filters=filters).aggregate(
        requests=Count("id"),
        cost_nano=Sum("cost_nano"),
        excess_nano=Sum("excess_nano"),
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
    )


def keys_with_activity(*, organization: Organization, since: datetime) -> QuerySet[ApiKey]:
    """The organization's keys, each with `spent_nano` (usage admitted since `since`) and
    `last_used_at` (its latest usage record). Correlated subqueries, one per key, so each reads
    its own slice of the (api_key, admitted_at) index instead of the organization's whole log."""
    mine = UsageRecord.objects.filter(api_key=OuterRef("pk"))
    return organization.api_keys.annotate(
        spent_nano=Subquery(
            mine.filter(admitted_at__gte=since).values("api_key").annotate(s=Sum("cost_nano")).values("s")
        ),
        last_used_at=Subquery(mine.order_by("-admitted_at").values("admitted_at")[:1]),
    )


def alert_events(*, organization: Organization) -> QuerySet[AlertEvent]:
    return AlertEvent.objects.filter(organization=organization).select_related("budget").order_by("-created_at", "-id")


def daily_spend(*, organization: Organization, since: datetime, group_by: str) -> list[tuple]:
    """[(day, group, cost_nano)] from `since`, for the stacked spend chart."""
    rows = (
        UsageRecord.objects.filter(organization=organization, admitted_at__gte=since)
        .annotate(day=TruncDay("admitted_at"), group=GROUPS[group_by])
        .values("day", "group")
        .annotate(cost=Sum("cost_nano"))
        .order_by("day")
    )
    return [(r["day"].date(), None if r["group"] is None else str(r["group"]), r["cost"] or 0) for r in rows]


SERIES_BUCKETS = {"hour": TruncHour, "day": TruncDay}


def usage_series(
    *, organization: Organization, since: datetime, until: datetime, bucket: str, group_field: str
) -> list[tuple[datetime, str | None, int, int]]:
    """[(bucket start, group, cost_nano, tokens)] of usage admitted in [since, until), in UTC
    hours or days, grouped by `group_field` (e.g. "project__slug"): one grouped query."""
    rows = (
        UsageRecord.objects.filter(organization=organization, admitted_at__gte=since, admitted_at__lt=until)
        .annotate(bucket=SERIES_BUCKETS[bucket]("admitted_at", tzinfo=UTC), group=F(group_field))
        .values("bucket", "group")
        .annotate(cost=Sum("cost_nano"), tokens=Sum(F("input_tokens") + F("output_tokens")))
        .order_by("bucket")
    )
    return [
        (r["bucket"], None if r["group"] is None else str(r["group"]), r["cost"] or 0, r["tokens"] or 0) for r in rows
    ]
