"""Reads on the request log (the `requestlog_entry` view)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import TruncDay, TruncHour

from requestlog.models import RequestLogEntry
from tenants.models import Organization

REFUSED = ("refused", "rate_limited", "rejected")


def request_log(*, organization: Organization) -> QuerySet[RequestLogEntry]:
    return RequestLogEntry.objects.filter(organization=organization).order_by("-at", "-request_id")


def request_entry(*, organization: Organization, request_id: str) -> RequestLogEntry | None:
    return (
        RequestLogEntry.objects.filter(organization=organization, request_id=request_id)
        .select_related("project", "api_key", "member__user", "end_customer", "connection", "budget")
        .first()
    )


def refusals_by_code(*, organization: Organization, since: datetime) -> list[dict]:
    """Refused requests (402, 429 and other errors) since `since`, counted by the code the
    client read: [{"code", "status", "requests"}], most first."""
    rows = (
        RequestLogEntry.objects.filter(organization=organization, status__in=REFUSED, at__gte=since)
        .values("code", "status")
        .annotate(requests=Count("request_id"))
        .order_by("-requests", "code")
    )
    return [dict(r) for r in rows]


SERIES_BUCKETS = {"hour": TruncHour, "day": TruncDay}


def request_series(
    *, organization: Organization, since: datetime, until: datetime, bucket: str, group_field: str
) -> list[tuple[datetime, str | None, int, int]]:
    """[(bucket start, group, requests, refused)] answered in [since, until), in UTC hours or
    days, grouped by `group_field` (e.g. "api_key__name"): one grouped query on the log."""
    rows = (
        RequestLogEntry.objects.filter(organization=organization, at__gte=since, at__lt=until)
        .annotate(bucket=SERIES_BUCKETS[bucket]("at", tzinfo=UTC), group=F(group_field))
        .values("bucket", "group")
        .annotate(requests=Count("request_id"), refused=Count("request_id", filter=Q(status__in=REFUSED)))
        .order_by("bucket")
    )
    return [(r["bucket"], None if r["group"] is None else str(r["group"]), r["requests"], r["refused"]) for r in rows]
