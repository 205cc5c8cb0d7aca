"""Reads on the request log (the `requestlog_entry` view)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, QuerySet

from requestlog.models import RequestLogEntry
from tenants.models import Organization

REFUSED = ("refused", "rate_limited", "rejected")


def request_log(*, organization: Organization) -> QuerySet[RequestLogEntry]:
    return RequestLogEntry.objects.filter(organization=organization).order_by("-at", "-request_id")


def request_entry(*, organization: Organization, request_id: str) -> RequestLogEntry | None:
    return (RequestLogEntry.objects.filter(organization=organization, request_id=request_id)
            .select_related("project", "api_key", "member__user", "end_customer", "connection", "budget").first())


def refusals_by_code(*, organization: Organization, since: datetime) -> list[dict]:
    """Refused requests (402, 429 and other errors) since `since`, counted by the code the
    client read: [{"code", "status", "requests"}], most first."""
    rows = (RequestLogEntry.objects.filter(organization=organization, status__in=REFUSED, at__gte=since)
            .values("code", "status").annotate(requests=Count("request_id")).order_by("-requests", "code"))
    return [dict(r) for r in rows]
