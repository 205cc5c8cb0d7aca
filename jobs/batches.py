"""OpenAI batches: POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST .../cancel.

A batch reserves the sum of its input file's line bounds (each at the batch price, computed at
upload by jobs/sizing.py) through one admission, before the provider sees it."""

from __future__ import annotations

import json
import re

import httpx
from django.conf import settings

from gateway.admission.bounds import parse_json
from gateway.http.errors import bad_request
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import listing, service
from jobs.http import endpoint, refuse_unlisted, upstream_failed
from jobs.models import Job
from jobs.sizing import BATCH_ENDPOINTS
from jobs.submit import Submission, submit
from jobs.upstream import loads, send
from tenants.models import ApiKey


@endpoint("openai")
async def create(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    body = parse_json(await req.body(settings.CAPGATE["MAX_BODY_BYTES"]))
    refuse_unlisted("batches", body)
    file_id, target = body.get("input_file_id"), body.get("endpoint")
    if not isinstance(file_id, str) or not file_id:
        raise bad_request("'input_file_id' is required.", param="input_file_id")
    if not isinstance(target, str) or target not in BATCH_ENDPOINTS:
        raise bad_request(f"'endpoint' must be one of {sorted(BATCH_ENDPOINTS)}.", param="endpoint")
    if body.get("completion_window") != "24h":
        raise bad_request("'completion_window' must be '24h'.", param="completion_window")
    row = await runtime.db(service.owned_file, organization_id=key.organization_id, file_id=file_id)
    if row is None or row.connection is None or row.purpose != "batch":
        raise service.not_found("batch input file", file_id, "input_file_id")
    if BATCH_ENDPOINTS[target] != row.kind:
        raise bad_request(f"The file's requests call {row.kind}, not '{target}'.", param="endpoint")
    await submit(
        req,
        key,
        Submission(
            kind=Job.Kind.BATCH,
            worst_nano=sum(row.line_bounds),
            route=row.route,
            refused_code=row.refused_code,
            connection=row.connection,
            model_id=row.model_id,
            path="/v1/batches",
            body=body,
            input_file_id=file_id,
            detail={"lines": row.line_count},
            line_models=row.line_models,
        ),
    )


async def _owned(key: ApiKey, batch_id: str) -> Job:
    job = await runtime.db(
        service.owned_job, organization_id=key.organization_id, kind=Job.Kind.BATCH, provider_job_id=batch_id
    )
    if job is None or job.connection is None:
        raise service.not_found("batch", batch_id, "batch_id")
    return job


@endpoint("openai")
async def retrieve(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    job = await _owned(key, match.group(1))
    try:
        resp = await send(proxy.client(), job.connection, "GET", f"/v1/batches/{job.provider_job_id}")
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    data = loads(resp.content)
    if resp.status_code == 200 and isinstance(data, dict):
        await runtime.db(service.keep_result_files, job=job, data=data, lane="settle")
    await req.respond(resp.status_code, resp.content)


@endpoint("openai")
async def cancel(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    job = await _owned(key, match.group(1))
    await runtime.db(service.request_cancel, job_id=job.id, lane="settle")
    try:
        resp = await send(proxy.client(), job.connection, "POST", f"/v1/batches/{job.provider_job_id}/cancel")
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    await req.respond(resp.status_code, resp.content)


@endpoint("openai")
async def list_batches(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    """The organization's own batches, newest first, each as the provider reports it now."""
    page = await listing.page(req, key, kind=Job.Kind.BATCH, after="after", path="/v1/batches", last_known=_last_known)
    await req.respond(200, json.dumps({"object": "list", **page}).encode())


def _last_known(job: Job) -> dict:
    return {
        "id": job.provider_job_id,
        "object": "batch",
        "status": job.provider_status or "unknown",
        "endpoint": "",
        "input_file_id": job.input_file_id,
        "completion_window": "24h",
        "created_at": int(job.created_at.timestamp()),
    }
