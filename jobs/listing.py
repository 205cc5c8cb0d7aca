"""GET /v1/batches and GET /v1/messages/batches: one page of the organization's own jobs of one
kind, newest first, each as its provider reports it now."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from core.strict import ascii_int
from gateway.http.errors import bad_request
from gateway.http.request import Request
from gateway.upstream import proxy, runtime
from jobs import service
from jobs.models import Job
from jobs.upstream import loads, send
from tenants.models import ApiKey

log = logging.getLogger("capgate.jobs")


async def page(
    req: Request, key: ApiKey, *, kind: str, after: str, path: str, last_known: Callable[[Job], dict]
) -> dict:
    """The query's `limit` (1 to 100, default 20) jobs after the cursor named `after`, each read
    from the provider at `path`/{provider id}; a job the provider does not answer for is listed as
    last known (`last_known`), and a failed read is logged with the job's id. Returns the page as
    both APIs shape it: data, has_more, first_id, last_id."""
    query = dict(p.split("=", 1) for p in req.scope.get("query_string", b"").decode().split("&") if "=" in p)
    asked = ascii_int(query.get("limit", "20"))
    if asked is None:
        raise bad_request("'limit' must be an integer.", param="limit")
    limit = max(1, min(asked, 100))
    jobs = await runtime.db(
        service.owned_jobs, organization_id=key.organization_id, kind=kind, after=query.get(after), limit=limit + 1
    )

    async def one(job: Job) -> dict:
        try:
            resp = await send(proxy.client(), job.connection, "GET", f"{path}/{job.provider_job_id}")
        except httpx.HTTPError as exc:
            log.warning(
                "jobs: listing job %s (%s): its provider could not be read (%s); listed as last known",
                job.id,
                job.provider_job_id,
                type(exc).__name__,
            )
            return last_known(job)
        data = loads(resp.content)
        return data if resp.status_code == 200 and isinstance(data, dict) else last_known(job)

    data = await asyncio.gather(*(one(j) for j in jobs[:limit] if j.connection is not None))
    return {
        "data": data,
        "has_more": len(jobs) > limit,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
