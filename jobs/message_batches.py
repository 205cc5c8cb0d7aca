"""Anthropic message batches: POST /v1/messages/batches (the requests are in the body), GET
(list and one), POST .../cancel, GET .../results — for the organization that made them only."""

from __future__ import annotations

import json
import re

import httpx

from gateway.admission.bounds import parse_json
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import listing, service, sizing
from jobs.http import endpoint, refuse_unlisted, upstream_failed
from jobs.models import Job
from jobs.submit import Submission, submit
from jobs.upstream import loads, send
from tenants.models import ApiKey


def _status(data: dict) -> str:
    return str(data.get("processing_status") or "")


@endpoint("anthropic")
async def create(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    body = parse_json(await req.body(sizing.max_file_bytes()))
    refuse_unlisted("message_batches", body)
    sized, requests = await runtime.db(sizing.size_message_batch, key=key, body=body)
    connection = sizing.batch_connection(sized, "anthropic")
    await submit(
        req,
        key,
        Submission(
            kind=Job.Kind.MESSAGE_BATCH,
            worst_nano=sized.worst_nano,
            route=sized.route,
            refused_code=sized.refused_code,
            connection=connection,
            model_id=sized.target.model.id,
            path="/v1/messages/batches",
            body={"requests": requests},
            detail={"lines": len(requests)},
            line_models=sized.line_models,
            status_of=_status,
            flavor="anthropic",
        ),
    )


async def _owned(key: ApiKey, batch_id: str) -> Job:
    job = await runtime.db(
        service.owned_job, organization_id=key.organization_id, kind=Job.Kind.MESSAGE_BATCH, provider_job_id=batch_id
    )
    if job is None or job.connection is None:
        raise service.not_found("message batch", batch_id, "message_batch_id")
    return job


async def _relay(req: Request, job: Job, method: str, suffix: str = "", raw: bool = False) -> None:
    try:
        resp = await send(proxy.client(), job.connection, method, f"/v1/messages/batches/{job.provider_job_id}{suffix}")
    except httpx.HTTPError as exc:
        raise upstream_failed(exc) from None
    content = resp.content
    data = loads(content) if not raw else None
    if isinstance(data, dict) and data.get("results_url"):
        # Results are fetched through capgate, for this organization only.
        host = req.headers.get("host", "")
        scheme = req.scope.get("scheme", "http")
        data["results_url"] = f"{scheme}://{host}/v1/messages/batches/{job.provider_job_id}/results"
        content = json.dumps(data).encode()
    ctype = resp.headers.get("content-type", "application/json").encode("latin-1") if raw else b"application/json"
    await req.respond(resp.status_code, content, content_type=ctype)


@endpoint("anthropic")
async def retrieve(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    await _relay(req, await _owned(key, match.group(1)), "GET")


@endpoint("anthropic")
async def results(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    await _relay(req, await _owned(key, match.group(1)), "GET", "/results", raw=True)


@endpoint("anthropic")
async def cancel(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    job = await _owned(key, match.group(1))
    await runtime.db(service.request_cancel, job_id=job.id, lane="settle")
    await _relay(req, job, "POST", "/cancel")


@endpoint("anthropic")
async def list_batches(req: Request, key: ApiKey, match: re.Match[str]) -> None:
    """The organization's own message batches, newest first, each as the provider reports it now."""
    page = await listing.page(
        req,
        key,
        kind=Job.Kind.MESSAGE_BATCH,
        after="after_id",
        path="/v1/messages/batches",
        last_known=lambda job: {
            "id": job.provider_job_id,
            "type": "message_batch",
            "processing_status": job.provider_status,
        },
    )
    await req.respond(200, json.dumps(page).encode())
