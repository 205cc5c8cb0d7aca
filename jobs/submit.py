"""Submitting a job: admit its worst case, send it, and hand the reservation to the job.

1. One of the organization's live-job slots (jobs/quotas.py: 429 at its bound), then one
   admission of the whole worst case (jobs/service.py `admit_job`, the live `admit`): a refusal
   is a 429 or 402 in the endpoint's shape before anything reaches the provider.
2. The submission goes to the provider. Refused (4xx/5xx) or never sent: the reservation is
   recorded as `failed_upstream` at zero (no job exists). Sent without an answer: recorded as
   `estimated` at the worst case (a job may exist that capgate cannot see).
3. Accepted: a Job row and the reservation's move to it (owner cleared, job id, the job's
   deadline) in one transaction. Beat (jobs/poll.py) then keeps it counted until the provider's
   final report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.db import DatabaseError

from alerts.alerts import note_refusal
from catalog.models import Connection
from core.errors import CapgateError
from core.money import usd_str
from gateway.http.errors import GatewayError, render
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import quotas, service
from jobs.upstream import NOT_SENT, loads, send
from ledger.errors import BudgetExceeded
from ledger.models import UsageRecord
from ledger.recording import Outcome
from requestlog import buffer as request_log
from tenants.models import ApiKey

log = logging.getLogger("capgate.jobs")


@dataclass
class Submission:
    kind: str
    worst_nano: int
    route: str
    refused_code: str
    connection: Connection
    model_id: int | None
    path: str  # the provider endpoint that creates the job
    body: Any
    form: dict | None = None  # send as multipart/form-data (fields) instead of JSON
    files: dict | None = None  # multipart file parts
    input_file_id: str = ""
    detail: dict | None = None
    line_models: dict[str, int] | None = None  # a batch of several models: each line's (jobs/sizing.py)
    flavor: str = "openai"  # the endpoint's error shape
    job_id_of: Callable[[dict], str | None] = lambda data: data.get("id") if isinstance(data.get("id"), str) else None
    status_of: Callable[[dict], str] = lambda data: str(data.get("status") or "")


def capgate_headers(request_id: str, worst_nano: int) -> list[tuple[bytes, bytes]]:
    return [(b"x-capgate-request-id", request_id.encode()), (b"x-capgate-reserved-usd", usd_str(worst_nano).encode())]


@dataclass
class _Refused:
    """A submission refused at admission, as the request log's note() reads it."""

    req: Request
    kind: str
    request_id: str
    model_name: str
    started: float = field(default_factory=time.monotonic)
    admission: object | None = None


async def submit(req: Request, key: ApiKey, sub: Submission) -> None:
    """Submit one job (module docstring). Its live-job slot, taken at admission, is given back
    before the answer when the submission ends without a job (refused, or settle_submission), and
    here again whatever happened (a no-op then): a job's own row counts from start_job on."""
    request_id = proxy.new_request_id()
    try:
        await _submit(req, key, sub, request_id)
    finally:
        await give_back_slot(request_id)


async def give_back_slot(request_id: str) -> None:
    try:
        await runtime.db(quotas.give_back, request_id=request_id, lane="settle")
    except DatabaseError:  # it stops counting once its reservation is gone (jobs/quotas.py)
        log.exception("jobs: could not give back the slot of %s", request_id)


async def _submit(req: Request, key: ApiKey, sub: Submission, request_id: str) -> None:
    bg = runtime.background
    h = req.headers
    call = _Refused(req=req, kind=sub.kind[:20], request_id=request_id, model_name=sub.route)
    try:
        admitted = await runtime.db(
            service.admit_job,
            key=key,
            request_id=request_id,
            worst_nano=sub.worst_nano,
            model=sub.route,
            refused_code=sub.refused_code,
            customer_id=h.get("x-capgate-customer"),
            run_id=h.get("x-capgate-run"),
            run_budget_usd=h.get("x-capgate-run-budget-usd"),
            owner_id=bg.instance_id if bg else None,
        )
    except CapgateError as exc:
        # Refused before the provider saw it: a refusal row in the request log, like a request's.
        if isinstance(exc, BudgetExceeded):
            runtime.run_soon(
                note_refusal,
                window_id=exc.window_id,
                tipped_by={
                    "request_id": request_id,
                    "key": (req.api_key() or "")[:12],
                    "customer": h.get("x-capgate-customer", ""),
                    "run": h.get("x-capgate-run", ""),
                    "model": sub.route[:200],
                },
            )
        request_log.note(call, exc)
        await give_back_slot(request_id)  # refused at admission: free before the answer
        status, headers, body = render(exc, flavor=sub.flavor)
        return await req.respond(status, body, headers + [(b"x-capgate-request-id", request_id.encode())])
    reservation = admitted.reservation
    headers = capgate_headers(request_id, reservation.amount_nano)
    try:
        if sub.form is not None:  # multipart/form-data, as the SDK sends it (plain fields as nameless parts)
            parts = {**{k: (None, v) for k, v in sub.form.items()}, **(sub.files or {})}
            resp = await send(proxy.client(), sub.connection, "POST", sub.path, files=parts)
        else:
            resp = await send(proxy.client(), sub.connection, "POST", sub.path, body=sub.body)
    except NOT_SENT as exc:
        await _settle(
            reservation,
            Outcome(
                status=UsageRecord.Status.FAILED_UPSTREAM,
                connection_id=sub.connection.id,
                error=f"job not submitted: {type(exc).__name__}",
            ),
        )
        raise GatewayError(f"Upstream failed: {type(exc).__name__}", code="upstream_error", status=502) from None
    except httpx.HTTPError as exc:
        await _settle(
            reservation,
            Outcome(
                status=UsageRecord.Status.ESTIMATED,
                cost_nano=reservation.amount_nano,
                connection_id=sub.connection.id,
                error=f"job submission outcome unknown: {type(exc).__name__}",
            ),
        )
        raise GatewayError(
            f"Upstream outcome unknown: {type(exc).__name__}", code="upstream_timeout", status=504
        ) from None
    data = loads(resp.content)
    job_id = sub.job_id_of(data) if resp.status_code == 200 and isinstance(data, dict) else None
    if job_id is None:
        await _settle(
            reservation,
            Outcome(
                status=UsageRecord.Status.FAILED_UPSTREAM,
                connection_id=sub.connection.id,
                error=f"job refused by the provider: status {resp.status_code}",
            ),
        )
        return await req.respond(resp.status_code if resp.status_code >= 400 else 502, resp.content, headers)
    assert isinstance(data, dict)
    try:
        await runtime.db(
            service.start_job,
            reservation=reservation,
            kind=sub.kind,
            provider_job_id=job_id,
            connection_id=sub.connection.id,
            model_id=sub.model_id,
            route=sub.route,
            api_key_id=key.id,
            input_file_id=sub.input_file_id,
            provider_status=sub.status_of(data),
            detail=sub.detail,
            line_models=sub.line_models,
            lane="settle",
        )
    except DatabaseError:
        # The job runs; its reservation stays the request's and lapses to a worst-case charge
        # (the safe direction) since no job row can renew it.
        log.exception("jobs: %s %s accepted but not recorded; its hold will be charged at worst case", sub.kind, job_id)
    await req.respond(200, resp.content, headers)


async def _settle(reservation, outcome: Outcome) -> None:
    try:
        await runtime.db(service.settle_submission, reservation=reservation, outcome=outcome, lane="settle")
    except DatabaseError:
        log.exception("jobs: could not settle submission %s; left to expiry", reservation.request_id)
