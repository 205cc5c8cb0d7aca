"""Reads of jobs for the dashboard and the API: each job with what it holds right now."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from jobs.models import Job, JobFile
from ledger.models import Reservation

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


def files_page(
    *, organization_id: int, after: str | None, limit: int, order: str, purpose: str | None
) -> tuple[list[JobFile], bool]:
    """One page of the organization's files as OpenAI pages them: ordered by creation (`order`
    asc or desc), starting after the file named `after` (unknown: from the start), at most
    `limit`; and whether more follow."""
    rows = JobFile.objects.filter(organization_id=organization_id)
    if purpose:
        rows = rows.filter(purpose=purpose)
    rows = rows.order_by("id" if order == "asc" else "-id")
    if after:
        anchor = rows.filter(file_id=after).first()
        if anchor is not None:
            rows = rows.filter(id__gt=anchor.id) if order == "asc" else rows.filter(id__lt=anchor.id)
    found = list(rows[: limit + 1])
    return found[:limit], len(found) > limit
