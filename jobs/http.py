"""The job endpoints under /v1, registered in the gateway's route table (gateway/http/routes.py).

Each handler authenticates, finds what the organization owns (anyone else's id is 404, as if
it did not exist), and proxies to the connection that holds it. Submissions admit the job's
worst case first (jobs/service.py) and hand the reservation to the job once the provider
accepted it."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable

from django.db import DatabaseError

from alerts.alerts import note_refusal
from core.errors import CapgateError
from gateway import billing
from gateway.admission.routing import authenticate
from gateway.http.errors import GatewayError, bad_request, render
from gateway.http.request import ClientGone, Request
from gateway.http.routes import Handler as RouteHandler
from gateway.http.routes import Route, register
from gateway.upstream import proxy, runtime
from ledger.errors import BudgetExceeded, BudgetUnavailable
from tenants.models import ApiKey

log = logging.getLogger("capgate.jobs")
Handler = Callable[[Request, ApiKey, re.Match[str]], Awaitable[None]]


def endpoint(flavor: str) -> Callable[[Handler], Callable[[Request, re.Match[str]], Awaitable[None]]]:
    """Authenticate, run the handler, and answer every refusal in the endpoint's own shape."""

    def wrap(fn: Handler) -> Callable[[Request, re.Match[str]], Awaitable[None]]:
        @functools.wraps(fn)
        async def run(req: Request, match: re.Match[str]) -> None:
            try:
                key = await runtime.db(authenticate, req.api_key())
                await fn(req, key, match)
            except ClientGone:
                return
            except CapgateError as exc:
                if isinstance(exc, BudgetExceeded):
                    runtime.run_soon(
                        note_refusal,
                        window_id=exc.window_id,
                        tipped_by={"key": (req.api_key() or "")[:12], "model": "job"},
                    )
                await error(req, exc, flavor)
            except DatabaseError:
                log.exception("jobs: database unavailable")
                await error(req, BudgetUnavailable("The database is unavailable; nothing was reserved."), flavor)

        return run

    return wrap


async def error(req: Request, exc: CapgateError, flavor: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    status, headers, body = render(exc, flavor=flavor)
    await req.respond(status, body, headers + (extra or []))


def refuse_unlisted(
    endpoint: str, names: Iterable[str], *, form: bool = False, allowed: Iterable[str] | None = None
) -> None:
    """400 for a field the billing inventory does not list for this job endpoint
    (gateway/billing/jobs.py JOB_FIELDS, which is the endpoint's allowlist): a field nobody has
    classified could change what the job bills. In a multipart form, `a[b]` is part of field `a`.
    `allowed`: the inventory's list as the gateway process holds it, for a check run elsewhere."""
    fields = {name.split("[", 1)[0] if form else name for name in names}
    unknown = sorted(fields - set(billing.JOB_FIELDS[endpoint] if allowed is None else allowed))
    if unknown:
        raise bad_request(f"Unsupported parameter: '{unknown[0]}'.", param=unknown[0], code="unsupported_parameter")


def upstream_failed(exc: Exception) -> GatewayError:
    return GatewayError(f"Upstream failed: {type(exc).__name__}", code="upstream_error", status=502)


def routes() -> list[Route[RouteHandler]]:
    """The job endpoints, as the gateway's route table declares routes."""
    # Imported here: each of these modules imports this one (`endpoint`, `error`).
    from jobs import batches, files, message_batches, videos

    return [
        Route("POST", "/v1/files", files.upload),
        Route("GET", "/v1/files", files.list_files),
        Route("GET", "/v1/files/{file_id}", files.retrieve),
        Route("DELETE", "/v1/files/{file_id}", files.delete),
        Route("GET", "/v1/files/{file_id}/content", files.content),
        Route("POST", "/v1/batches", batches.create),
        Route("GET", "/v1/batches", batches.list_batches),
        Route("GET", "/v1/batches/{batch_id}", batches.retrieve),
        Route("POST", "/v1/batches/{batch_id}/cancel", batches.cancel),
        Route("POST", "/v1/messages/batches", message_batches.create, flavor="anthropic"),
        Route("GET", "/v1/messages/batches", message_batches.list_batches, flavor="anthropic"),
        Route("GET", "/v1/messages/batches/{batch_id}", message_batches.retrieve, flavor="anthropic"),
        Route("POST", "/v1/messages/batches/{batch_id}/cancel", message_batches.cancel, flavor="anthropic"),
        Route("GET", "/v1/messages/batches/{batch_id}/results", message_batches.results, flavor="anthropic"),
        Route("POST", "/v1/videos", videos.create),
        Route("GET", "/v1/videos/{video_id}", videos.retrieve),
        Route("GET", "/v1/videos/{video_id}/content", videos.content),
        Route("DELETE", "/v1/videos/{video_id}", videos.delete),
    ]


def install() -> None:
    """Register the job routes with the gateway's route table and the background-response
    hand-off with the proxy (once, from JobsConfig.ready: a second registration is refused)."""
    # Imported here: jobs.background imports the proxy, which is loaded once apps are ready.
    from jobs import background, uploads

    register(*routes())
    proxy.register_background(background.submit)
    runtime.on_stop(uploads.stop_sizing)
