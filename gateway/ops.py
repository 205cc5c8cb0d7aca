"""GET /healthz, /readyz and /metrics, served in front of Django like /v1.

Here rather than as Django views: a probe must not depend on ALLOWED_HOSTS (orchestrators
probe by pod address), sessions or middleware, and it must not count as a gateway request.
"""

from __future__ import annotations

from config import health
from gateway import metrics, runtime
from gateway.http import Request

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
        # On a settle-lane thread: its connection is already open, and admissions do not wait on it.
        status, body = await runtime.db(health.readiness, lane="settle")
        return await req.json(status, body)
    if not metrics.authorized(req.headers):
        return await req.json(
            401,
            {"error": {"code": "unauthorized", "message": "Send Authorization: Bearer <CAPGATE_METRICS_TOKEN>."}},
            [(b"www-authenticate", b"Bearer")],
        )
    data = await runtime.db(metrics.scrape, lane="settle")
    await req.respond(200, data, content_type=metrics.CONTENT_TYPE_LATEST.encode())


__all__ = ["PATHS", "handle"]
