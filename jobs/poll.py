"""Beat's poll of live jobs: claim the due ones, ask each provider, apply the answers.

Claiming moves each job's next poll forward (backing off from JOB_POLL_FIRST to JOB_POLL_LAST)
under FOR UPDATE SKIP LOCKED, so two beats at once never poll the same job; a run takes at most
JOB_POLL_PER_RUN. Jobs charged at worst case (gone, or lapsed) keep being asked until a day past
their deadline, so a late final report still corrects them once."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.guards import Guards
from core.strict import ascii_int
from gateway.providers import usage_anthropic, usage_openai, usage_responses
from jobs.models import Job
from jobs.settle import Report, apply_report
from jobs.upstream import loads, new_client, send

log = logging.getLogger("capgate.jobs")
LATE_REPORT_GRACE = timedelta(days=1)
_ALIVE = {
    Job.Kind.BATCH: {"validating", "in_progress", "finalizing", "cancelling"},
    Job.Kind.MESSAGE_BATCH: {"in_progress", "canceling"},
    Job.Kind.RESPONSE: {"queued", "in_progress"},
    Job.Kind.VIDEO: {"queued", "in_progress"},
}
_PATHS = {
    Job.Kind.BATCH: "/v1/batches/",
    Job.Kind.MESSAGE_BATCH: "/v1/messages/batches/",
    Job.Kind.RESPONSE: "/v1/responses/",
    Job.Kind.VIDEO: "/v1/videos/",
}


def backoff(polls: int) -> timedelta:
    c = settings.CAPGATE
    first, last = c["JOB_POLL_FIRST"], c["JOB_POLL_LAST"]
    return min(first * (2 ** min(max(polls - 1, 0), 20)), last)


# Removal test: tests/jobs/test_poll.py.
GUARDS = Guards(
    claim_exclusive="a claim skips jobs another beat holds and moves each one's next poll forward: "
    "two beats never poll one job at once",
)


def claim(*, now: datetime | None = None, limit: int | None = None) -> list[Job]:
    now = now or timezone.now()
    limit = limit or settings.CAPGATE["JOB_POLL_PER_RUN"]
    due = Q(state__in=[Job.State.LIVE, Job.State.CANCELLING]) | Q(
        state=Job.State.ESTIMATED, deadline_at__gt=now - LATE_REPORT_GRACE
    )
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update(skip_locked=GUARDS.claim_exclusive, of=("self",))
            .select_related("connection")
            .filter(due, next_poll_at__lte=now)
            .order_by("next_poll_at")[:limit]
        )
        for job in jobs:
            job.polls += 1
            job.last_polled_at = now
            job.next_poll_at = now + backoff(job.polls) if GUARDS.claim_exclusive else job.next_poll_at
        Job.objects.bulk_update(jobs, ["polls", "last_polled_at", "next_poll_at"])
    return jobs


async def _lines(client: httpx.AsyncClient, job: Job, path: str, read, report: Report) -> None:
    """Each billed line's usage into `report`, with the custom_id it answers (what prices it at
    its own model, jobs/settle.py)."""
    resp = await send(client, job.connection, "GET", path)
    if resp.status_code != 200:
        raise httpx.HTTPStatusError(f"results: {resp.status_code}", request=resp.request, response=resp)
    for line in resp.content.splitlines():
        item = loads(line) if line.strip() else None
        usage = read(item)
        if usage is not None:
            assert isinstance(item, dict)  # read() answers only for a line object
            report.usages.append(usage)
            custom_id = item.get("custom_id")
            report.line_ids.append(custom_id if isinstance(custom_id, str) else "")


def _batch_line(item: object):
    response = item.get("response") if isinstance(item, dict) else None
    if (
        not isinstance(response, dict)
        or response.get("status_code") != 200
        or not isinstance(response.get("body"), dict)
    ):
        return None
    body = response["body"]
    if body.get("object") == "response":
        return usage_responses(body)
    return usage_openai(body.get("usage"), body.get("service_tier"))


def _message_line(item: object):
    result = item.get("result") if isinstance(item, dict) else None
    if not isinstance(result, dict) or result.get("type") != "succeeded" or not isinstance(result.get("message"), dict):
        return None
    return usage_anthropic(result["message"].get("usage"))


async def fetch(client: httpx.AsyncClient, job: Job) -> Report:
    """Ask the provider about one job."""
    if job.connection is None:
        return Report(kind="gone", error="connection deleted")
    try:
        resp = await send(client, job.connection, "GET", _PATHS[Job.Kind(job.kind)] + job.provider_job_id)
        if resp.status_code == 404:
            return Report(kind="gone")
        data = loads(resp.content)
        if resp.status_code != 200 or not isinstance(data, dict):
            return Report(kind="error", error=f"status {resp.status_code}")
        status = str(data.get("processing_status" if job.kind == Job.Kind.MESSAGE_BATCH else "status") or "")
        if status in _ALIVE[Job.Kind(job.kind)]:
            return Report(kind="alive", provider_status=status)
        report = Report(kind="final", provider_status=status, provider_model=str(data.get("model") or ""))
        if job.kind == Job.Kind.BATCH:
            report.result_files = {k: data.get(k) for k in ("output_file_id", "error_file_id") if data.get(k)}
            if data.get("output_file_id"):
                await _lines(client, job, f"/v1/files/{data['output_file_id']}/content", _batch_line, report)
        elif job.kind == Job.Kind.MESSAGE_BATCH:
            await _lines(client, job, f"/v1/messages/batches/{job.provider_job_id}/results", _message_line, report)
        elif job.kind == Job.Kind.RESPONSE:
            usage = usage_responses(data)
            report.usages = [usage] if usage is not None else []
        elif status == "completed":  # a video: billed by the seconds it has
            report.seconds = ascii_int(str(data.get("seconds") or "0")) or 0
        return report
    except httpx.HTTPError as exc:
        return Report(kind="error", error=f"{type(exc).__name__}: {exc}")


async def _fetch_all(jobs: list[Job]) -> list[Report]:
    client = new_client()
    try:
        return list(await asyncio.gather(*(fetch(client, j) for j in jobs)))
    finally:
        await client.aclose()


def poll_jobs(*, now: datetime | None = None, limit: int | None = None) -> dict[str, int]:
    """One beat run: claim, ask, apply. Returns how many jobs ended in each state."""
    now = now or timezone.now()
    jobs = claim(now=now, limit=limit)
    if not jobs:
        return {}
    reports = asyncio.run(_fetch_all(jobs))
    counts: dict[str, int] = {}
    for job, report in zip(jobs, reports, strict=True):
        try:
            state = apply_report(job_id=job.id, report=report, now=now)
        except Exception:
            log.exception("jobs: applying the report of %s failed; it is polled again", job)
            continue
        counts[state] = counts.get(state, 0) + 1
    return counts
