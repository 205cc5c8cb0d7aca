"""What a poll learned, applied to the books (sync; beat's worker thread).

- alive: the job's hold is renewed (`renew_jobs`, never past the job's deadline);
- final: settled from the provider's report — for batches each line's usage at the batch price
  of that line's own model, the response's usage, a video's billed seconds — through the same
  usage record and drain as a request; if expiry already charged the worst case, that
  `estimated` record is corrected once;
- gone (the provider answers 404): charged at the worst case as `estimated` now, and corrected
  once if a report arrives later.
A cancel request changes none of this: the hold stays until the final report says what was
billed."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from catalog.models import Model
from catalog.pricing import (
    UnpricedFeature,
    UnpricedModel,
    Usage,
    batch_rates,
    cost_nano,
    rates_for,
    video_nano,
)
from core.guards import Guards
from jobs.models import Job
from jobs.service import keep_result_files
from ledger.admission import renew_jobs
from ledger.drain import drain
from ledger.models import Reservation, UsageRecord
from ledger.recording import Outcome, RecordRejected, correct_estimate, record

log = logging.getLogger("capgate.jobs")
Status = UsageRecord.Status

# Removal tests: tests/jobs/test_batches.py, tests/capcheck/test_mixed_batch_scenario.py.
GUARDS = Guards(
    renew_leases="a live job's hold is renewed on every poll, so it never lapses while the job runs",
    price_each_line="each batch line is priced at its own model, not every line at the job's first",
)


@dataclass
class Report:
    """One poll's answer. kind: alive | final | gone | error."""

    kind: str
    provider_status: str = ""
    usages: list[Usage] = field(default_factory=list)  # per billed line (batch) or the one response
    line_ids: list[str] = field(default_factory=list)  # a batch: each usage's custom_id ("" unknown)
    seconds: int = 0  # a video's billed seconds
    provider_model: str = ""
    result_files: dict = field(default_factory=dict)  # a batch's output/error file ids
    error: str = ""


def _total(usages: list[Usage]) -> Usage:
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cache_read_tokens=sum(u.cache_read_tokens for u in usages),
        cache_write_tokens=sum(u.cache_write_tokens for u in usages),
        cache_write_1h_tokens=sum(u.cache_write_1h_tokens for u in usages),
        web_search_requests=sum(u.web_search_requests for u in usages),
    )


def _batch_cost(job: Job, report: Report) -> tuple[int, str]:
    """A batch's cost: each line's usage at the batch price of the model that line ran on
    (`Job.line_models`, else the job's one model). A line whose custom_id the batch did not
    submit is priced at the batch's priciest model, the safe direction."""
    assert job.model is not None  # price() charges the worst case when it is gone
    ids = set(job.line_models.values())
    models = {m.id: m for m in Model.objects.filter(id__in=ids)} if ids else {}
    if len(models) < len(ids):
        raise LookupError("a line's model is no longer in the catalog")
    models[job.model.id] = job.model
    rates = {
        mid: batch_rates(rates=rates_for(model=m, connection=job.connection), model=m) for mid, m in models.items()
    }
    priciest = max(models, key=lambda mid: (rates[mid].max_input, rates[mid].output))
    unknown = 0
    total = 0
    for i, usage in enumerate(report.usages):
        custom_id = report.line_ids[i] if i < len(report.line_ids) else ""
        mid = job.line_models.get(custom_id) if job.line_models and GUARDS.price_each_line else job.model.id
        if mid is None:
            unknown += 1
            mid = priciest
        total += cost_nano(usage=usage, rates=rates[mid])
    note = f"{unknown} lines the batch did not submit: priced at its priciest model" if unknown else ""
    return total, note


def price(job: Job, report: Report) -> tuple[int, str]:
    """(cost in nano-USD, note). A job whose model left the catalog is charged its worst case."""
    model, connection = job.model, job.connection
    if model is None:
        return job.worst_nano, "model no longer in the catalog: charged at worst case"
    try:
        if job.kind == Job.Kind.VIDEO:
            return video_nano(model=model, seconds=report.seconds, worst=False), ""
        if job.kind in (Job.Kind.BATCH, Job.Kind.MESSAGE_BATCH):
            return _batch_cost(job, report)
        return sum(
            cost_nano(usage=u, rates=rates_for(model=model, connection=connection, tier=u.service_tier))
            for u in report.usages
        ), ""
    except (UnpricedModel, UnpricedFeature, LookupError) as exc:
        return job.worst_nano, f"unpriced ({exc}): charged at worst case"


def _provider_model(job: Job, report: Report) -> str:
    """The model that served it, as the provider names it; a batch of several models names each
    model it was priced at."""
    if job.line_models:
        names = Model.objects.filter(id__in=set(job.line_models.values())).values_list("name", flat=True)
        return ", ".join(sorted(names))[:200]
    return report.provider_model or (job.model.name if job.model else "")


def _apply(request_id: str, outcome: Outcome) -> None:
    """Record the job's outcome once: through its reservation while it has one, else (expiry
    charged it already) as the one correction of the `estimated` record."""

    reservation = Reservation.objects.filter(request_id=request_id).first()
    if reservation is not None:
        try:
            record(reservation=reservation, outcome=outcome)
        except RecordRejected:
            return
        drain(request_ids=[request_id])
        return
    existing = UsageRecord.objects.filter(request_id=request_id).first()
    if existing is not None:
        correct_estimate(record_id=existing.pk, outcome=outcome)


def apply_report(*, job_id: int, report: Report, now: datetime | None = None) -> str:
    """Apply one poll's report to a job. Returns the job's state after."""

    now = now or timezone.now()
    job = Job.objects.select_related("model", "connection").get(pk=job_id)
    if report.result_files:
        keep_result_files(job=job, data=report.result_files)
    if report.kind == "error":
        return job.state
    if report.kind == "alive":
        held = Reservation.objects.filter(request_id=job.request_id).exists()
        if held and GUARDS.renew_leases and job.state in (Job.State.LIVE, Job.State.CANCELLING):
            renew_jobs(request_ids=[job.request_id], now=now)
        elif not held and job.state != Job.State.ESTIMATED:
            job.state = Job.State.ESTIMATED  # lapsed (deadline) and charged at worst case by expiry
        job.provider_status = report.provider_status[:50]
        job.save(update_fields=["state", "provider_status"])
        return job.state
    if report.kind == "gone":
        if job.state in (Job.State.LIVE, Job.State.CANCELLING):
            _apply(
                job.request_id,
                Outcome(
                    status=Status.ESTIMATED,
                    cost_nano=job.worst_nano,
                    connection_id=job.connection_id,
                    error="job gone: the provider no longer reports it; charged at worst case",
                ),
            )
            job.state = Job.State.ESTIMATED
            job.save(update_fields=["state"])
        return job.state
    if job.state == Job.State.SETTLED:
        return job.state
    cost, note = price(job, report)
    billed = bool(report.usages) or report.seconds > 0
    outcome = Outcome(
        status=Status.SERVED if billed or note else Status.FAILED_UPSTREAM,
        cost_nano=cost,
        usage=_total(report.usages),
        connection_id=job.connection_id,
        provider_model=_provider_model(job, report),
        error="; ".join(e for e in (f"job {report.provider_status}", note, report.error) if e),
    )
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state == Job.State.SETTLED:
            return locked.state
        _apply(job.request_id, outcome)
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.SETTLED, cost_nano=cost, settled_at=now, provider_status=report.provider_status[:50]
        )
    return Job.State.SETTLED
