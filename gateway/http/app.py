"""The /v1 gateway as a plain ASGI application in front of Django.

Why not Django views: the gateway needs exact control of streaming and of client disconnects
(an abandoned stream must be charged, not forgotten) and the lowest per-request overhead. It
still uses Django's ORM and settings, on a database thread pool (gateway/upstream/runtime.py).
"""

from __future__ import annotations

import logging
from urllib.parse import unquote_to_bytes

from core.errors import CapgateError
from gateway.http import metrics, ops, routes
from gateway.http.errors import GatewayError, render
from gateway.http.request import Request
from gateway.http.routes import MethodNotAllowed, NoRoute
from gateway.upstream import runtime, transport

log = logging.getLogger("capgate.gateway")


async def handle(req: Request) -> None:
    """Send the request to its route (gateway/http/routes.py); no route is 404, a proxied path
    asked with another method 405 in its endpoint's shape. A NUL in the path (an id that cannot
    exist: PostgreSQL text cannot hold one) is a 404 and in the query string a 400, before any
    handler can put it in a query (core/middleware.py does the same for Django's pages)."""
    flavor = "anthropic" if req.path.startswith("/v1/messages") else "openai"
    if "\x00" in req.path:
        return await _error(req, GatewayError("No such object.", code="not_found", status=404), flavor)
    if b"\x00" in unquote_to_bytes(req.scope.get("query_string", b"")):
        message = "The query string holds a NUL character (%00)."
        return await _error(req, GatewayError(message, code="nul_character", status=400), flavor)
    try:
        route, match = routes.TABLE.resolve(req.method, req.path.rstrip("/"))
    except MethodNotAllowed as refused:
        allowed = refused.route
        return await _error(
            req,
            GatewayError(f"Use {allowed.method}.", code="method_not_allowed", status=405),
            allowed.flavor,
        )
    except NoRoute:
        return await _error(
            req, GatewayError(f"No route for {req.method} {req.path}.", code="not_found", status=404), "openai"
        )
    await route.handler(req, match)


class InternalError(GatewayError):
    type = "api_error"


async def _error(req: Request, exc: CapgateError, flavor: str) -> None:
    status, headers, body = render(exc, flavor=flavor)
    await req.respond(status, body, headers)


class CapgateASGI:
    """Routes /v1/* to the gateway and everything else to Django; runs the gateway's
    background loops for the lifetime of the server (Django's handler has no lifespan)."""

    def __init__(self, django_app):
        self.django_app = django_app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.lifespan(receive, send)
        if scope["type"] == "http" and scope["path"].rstrip("/") in ops.PATHS:
            return await ops.handle(Request(scope, receive, send))
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            req = Request(scope, receive, metrics.counting(scope, send))
            try:
                return await handle(req)
            except Exception:
                log.exception("gateway: unhandled error on %s", scope["path"])
                if not req.started:
                    # In the endpoint's own shape: an Anthropic SDK cannot read OpenAI's error.
                    flavor = "anthropic" if scope["path"].startswith("/v1/messages") else "openai"
                    await _error(req, InternalError("Internal error", code="internal_error", status=500), flavor)
                return
        return await self.django_app(scope, receive, send)

    async def lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                runtime.background = runtime.Background()
                await runtime.background.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if runtime.background is not None:
                    await runtime.background.stop()
                await transport.close_client()
                await send({"type": "lifespan.shutdown.complete"})
                return


__all__ = ["CapgateASGI", "render"]
