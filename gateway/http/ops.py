"""GET /healthz, /readyz and /metrics, served in front of Django like /v1.

Here rather than as Django views: a probe must not depend on ALLOWED_HOSTS (orchestrators
probe by pod address), sessions or middleware, and it must not count as a gateway request.
"""

from __future__ import annotations

import asyncio
from functools import partial

from django.conf import settings

from config import health
from gateway.http import metrics
from gateway.http.request import Request
from gateway.upstream import runtime

PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


async def handle(req: Request) -> None:
    path = req.path.rstrip("/") or "/"
    if req.method not in ("GET", "HEAD"):
        return await req.json(
            405, {"error": {"code": "method_not_allowed", "message": "Use GET."}}, [(b"allow", b"GET, HEAD")]
        )
    if path == "/healthz":
        return await req.json(200, {"status": "ok"})
    if path == "/readyz":
        status, body = await _readiness()
        return await req.json(status, body)
    if not metrics.authorized(req.headers):
        return await req.json(
            401,
            {"error": {"code": "unauthorized", "message": "Send Authorization: Bearer <CAPGATE_METRICS_TOKEN>."}},
            [(b"www-authenticate", b"Bearer")],
        )
    data = await runtime.db(metrics.scrape, lane="settle")
    await req.respond(200, data, content_type=metrics.CONTENT_TYPE_LATEST.encode())


# The readiness check in flight on each event loop: probes arriving meanwhile wait on it rather
# than queue more checks behind a database that does not answer.
_checking: dict[asyncio.AbstractEventLoop, asyncio.Future[tuple[int, dict]]] = {}


async def _readiness() -> tuple[int, dict]:
    """/readyz within READYZ_TIMEOUT_SECONDS: on the `probe` lane (its own thread, so neither
    admissions nor the heartbeat wait on it), and a 503 naming the database when it has not
    answered by then (an orchestrator's probe gives up after a second or two)."""
    loop = asyncio.get_running_loop()
    check = _checking.get(loop)
    if check is None or check.done():
        check = _checking[loop] = asyncio.ensure_future(runtime.db(health.readiness, lane="probe"))
    seconds = settings.CAPGATE["READYZ_TIMEOUT_SECONDS"]
    try:
        return await asyncio.wait_for(asyncio.shield(check), timeout=seconds)
    except TimeoutError:
        check.add_done_callback(lambda f: f.exception())  # its late outcome is not needed
        return await loop.run_in_executor(None, partial(health.unanswered, seconds=seconds))


__all__ = ["PATHS", "handle"]
