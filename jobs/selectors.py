"""Reads of jobs for the dashboard and the API: each job with what it holds right now."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from budgets.models import Reservation
from jobs.models import Job

LIVE_STATES = (Job.State.LIVE, Job.State.CANCELLING)


def jobs_of(
    *, organization_id: int, state: str | None = None, live: bool | None = None, kind: str | None = None
) -> QuerySet[Job]:
    """An organization's jobs, newest first, annotated with the hold their reservation has now
    (`held_nano`, None once settled) and its lease (`lease_expires_at`)."""
    held = Reservation.objects.filter(request_id=OuterRef("request_id"))
    rows = (
        Job.objects.filter(organization_id=organization_id)
        .select_related("api_key")
        .annotate(
            held_nano=Subquery(held.values("amount_nano")[:1]), lease_expires_at=Subquery(held.values("expires_at")[:1])
        )
        .order_by("-id")
    )
    if state:
        rows = rows.filter(state=state)
    if live:
        rows = rows.filter(state__in=LIVE_STATES)
    if kind:
        rows = rows.filter(kind=kind)
    return rows
