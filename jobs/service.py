"""The jobs' database steps, run on the gateway's database threads: admit a job's worst case at
submission, hand its reservation to the job, keep files and jobs per organization."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.guards import Guards
from gateway.admission.subjects import founding, payer
from gateway.http.errors import GatewayError
from jobs import quotas
from jobs.models import Job, JobFile
from ledger.admission import (
    AdmissionRequest,
    Admitted,
    admit,
    hand_to_job,
    matching_budgets,
)
from ledger.drain import drain
from ledger.models import Budget, Reservation
from ledger.recording import Outcome, RecordRejected, record, release
from tenants.models import ApiKey

# Removal tests: tests/jobs/test_batches.py, tests/capcheck/test_jobs_scenario.py.
GUARDS = Guards(
    admit_at_submission="a job's whole worst case is admitted at submission, before the provider sees it",
    hand_to_job="once the provider accepts a job, its reservation moves to the job and outlives the request",
    keep_hold_on_cancel="a cancel never releases the job's hold: the provider may already have billed",
)


def not_found(what: str, ident: str, param: str) -> GatewayError:
    return GatewayError(f"No {what} with id '{ident}'.", code="not_found", status=404, param=param)


def admit_job(
    *,
    key: ApiKey,
    request_id: str,
    worst_nano: int,
    model: str,
    refused_code: str,
    customer_id: str | None,
    run_id: str | None,
    run_budget_usd: str | None,
    owner_id: int | None,
) -> Admitted:
    """One admission for a job's whole worst case, through the same `admit` as a live request,
    for the same subjects (key, project, member, end customer, run). Under a blocking cap a job
    with something a live request would be refused for (refused_code) is refused with that code.
    An organization at its bound of live jobs is refused first, with nothing reserved; else the
    submission holds one of its slots (jobs/quotas.py) until it becomes a job or ends."""
    quotas.take_slot(organization_id=key.organization_id, request_id=request_id)
    # A first call creates its end customer and budgets with this admission (subjects.founding).
    with founding(payer(key=key, customer_id=customer_id, run_id=run_id, run_budget_usd=run_budget_usd)) as who:
        subject = who.subject
        budgets = matching_budgets(subject)
        if refused_code and any(b.mode == Budget.Mode.BLOCK for b in budgets):
            raise GatewayError(
                f"This job has a request a blocking budget cannot admit ({refused_code}); "
                "the same request would be refused live.",
                code=refused_code,
                status=402,
            )
        worst = worst_nano if GUARDS.admit_at_submission else 0
        return admit(
            request=AdmissionRequest(
                subject=subject,
                request_id=request_id,
                worst_nano=worst,
                model=model,
                owner_id=owner_id,
                budgets=budgets,
            )
        )


def deadline_for(kind: str) -> timedelta:
    c = settings.CAPGATE
    return c["JOB_BATCH_DEADLINE"] if kind in (Job.Kind.BATCH, Job.Kind.MESSAGE_BATCH) else c["JOB_MAX_SECONDS"]


def start_job(
    *,
    reservation: Reservation,
    kind: str,
    provider_job_id: str,
    connection_id: int,
    model_id: int | None,
    route: str,
    api_key_id: int,
    input_file_id: str = "",
    provider_status: str = "",
    detail: dict | None = None,
    line_models: dict[str, int] | None = None,
) -> Job:
    """The provider accepted the job: record it and move the reservation to it, in one
    transaction. From here the hold is the job's, renewed by beat while the job lives."""
    now = timezone.now()
    deadline = reservation.created_at + deadline_for(kind)
    with transaction.atomic():
        job = Job.objects.create(
            organization_id=reservation.organization_id,
            kind=kind,
            provider_job_id=provider_job_id[:200],
            connection_id=connection_id,
            model_id=model_id,
            route=route[:200],
            api_key_id=api_key_id,
            request_id=reservation.request_id,
            worst_nano=reservation.amount_nano,
            input_file_id=input_file_id,
            provider_status=provider_status[:50],
            detail=detail or {},
            line_models=line_models or {},
            deadline_at=deadline,
            next_poll_at=now + settings.CAPGATE["JOB_POLL_FIRST"],
        )
        quotas.give_back(request_id=reservation.request_id)  # the job's row counts from here
        if GUARDS.hand_to_job:
            hand_to_job(request_id=reservation.request_id, job_id=job.provider_job_id, deadline_at=deadline, now=now)
    return job


def settle_submission(*, reservation: Reservation, outcome: Outcome) -> None:
    """A submission that did not become a job: recorded like a live request (failed_upstream
    when the provider refused it, estimated when the outcome is unknown) and drained."""

    quotas.give_back(request_id=reservation.request_id)  # no job: its slot is free before the answer
    try:
        record(reservation=reservation, outcome=outcome)
    except RecordRejected:
        return  # left to expiry, which charges the worst case
    drain(request_ids=[reservation.request_id])


# --- files ------------------------------------------------------------------------------------


def owned_file(*, organization_id: int, file_id: str) -> JobFile | None:
    return JobFile.objects.select_related("connection").filter(organization_id=organization_id, file_id=file_id).first()


def keep_file(*, organization_id: int, file_id: str, connection_id: int | None, purpose: str, **fields) -> JobFile:
    row, _ = JobFile.objects.get_or_create(
        organization_id=organization_id,
        file_id=file_id[:200],
        defaults={"connection_id": connection_id, "purpose": purpose[:50], **fields},
    )
    return row


def forget_file(*, organization_id: int, file_id: str) -> None:
    JobFile.objects.filter(organization_id=organization_id, file_id=file_id).delete()


# --- jobs -------------------------------------------------------------------------------------


def owned_job(*, organization_id: int, kind: str, provider_job_id: str) -> Job | None:
    return (
        Job.objects.select_related("connection")
        .filter(organization_id=organization_id, kind=kind, provider_job_id=provider_job_id)
        .first()
    )


def owned_jobs(*, organization_id: int, kind: str, after: str | None, limit: int) -> list[Job]:
    rows = Job.objects.filter(organization_id=organization_id, kind=kind).order_by("-id")
    if after:
        anchor = rows.filter(provider_job_id=after).first()
        if anchor is not None:
            rows = rows.filter(id__lt=anchor.id)
    return list(rows.select_related("connection")[:limit])


def request_cancel(*, job_id: int) -> None:
    """A cancel request changes nothing about the money: the hold stays until the provider
    reports the final state and what it billed (jobs/settle.py). It only makes the next poll come
    soon."""
    now = timezone.now()
    Job.objects.filter(pk=job_id, state=Job.State.LIVE).update(
        state=Job.State.CANCELLING, cancel_requested_at=now, next_poll_at=now
    )
    if not GUARDS.keep_hold_on_cancel:  # what the guard prevents: settling on the cancel request alone
        job = Job.objects.get(pk=job_id)
        reservation = Reservation.objects.filter(request_id=job.request_id).first()
        if reservation is not None:
            release(reservation=reservation, error="cancel requested")
        Job.objects.filter(pk=job_id).update(state=Job.State.SETTLED, cost_nano=0, settled_at=now)


def keep_result_files(*, job: Job, data: dict) -> None:
    """A batch's output and error files belong to the batch's organization."""
    for name in ("output_file_id", "error_file_id"):
        file_id = data.get(name)
        if isinstance(file_id, str) and file_id:
            keep_file(
                organization_id=job.organization_id,
                file_id=file_id,
                connection_id=job.connection_id,
                purpose="batch_output",
            )
