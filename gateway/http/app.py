"""The /v1 gateway as a plain ASGI application in front of Django.

Why not Django views: the gateway needs exact control of streaming and of client disconnects
(an abandoned stream must be charged, not forgotten) and the lowest per-request overhead. It
still uses Django's ORM and settings, on a database thread pool (gateway/upstream/runtime.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError

from core.errors import CapgateError
from gateway.admission import count_tokens, reservations
from gateway.admission.bounds import parse_json
from gateway.admission.routing import authenticate, list_models
from gateway.http import metrics, ops
from gateway.http.errors import GatewayError, render
from gateway.http.request import ClientGone, Request
from gateway.upstream import proxy, runtime, transport
from gateway.upstream.stored import handle_stored_response
from ledger.errors import BudgetExceeded, BudgetUnavailable
from requestlog import buffer as request_log

log = logging.getLogger("capgate.gateway")
_RESERVATION = re.compile(r"^/v1/reservations/([^/]+)/(settle|release)$")
_PROXIED = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
_STORED_RESPONSE = re.compile(r"^/v1/responses/([A-Za-z0-9_\-]{1,200})(/cancel|/input_items)?$")
_STORED_ACTIONS = {
    ("GET", None): "get",
    ("DELETE", None): "delete",
    ("POST", "/cancel"): "cancel",
    ("GET", "/input_items"): "input_items",
}
# Endpoints served by an app above the gateway (jobs/: files, batches, videos), registered by its
# AppConfig.ready(): (method, full-path pattern, handler(request, match)).
ROUTES: list[tuple[str, re.Pattern[str], Callable[[Request, re.Match[str]], Awaitable[None]]]] = []


async def handle(req: Request) -> None:
    path = req.path.rstrip("/")
    kind = _PROXIED.get(path)
    if kind is not None:
        if req.method != "POST":
            return await _error(
                req,
                GatewayError("Use POST.", code="method_not_allowed", status=405),
                "anthropic" if kind == "messages" else "openai",
            )
        return await proxy.handle(req, kind)
    if path == count_tokens.PATH and req.method == "POST":
        return await count_tokens.handle(req)
    for method, pattern, handler in ROUTES:
        matched = pattern.match(path)
        if matched is not None and req.method == method:
            return await handler(req, matched)
    stored = _STORED_RESPONSE.match(path)
    if stored is not None and (req.method, stored.group(2)) in _STORED_ACTIONS:
        return await handle_stored_response(req, stored.group(1), _STORED_ACTIONS[(req.method, stored.group(2))])
    try:
        if path == "/v1/models" and req.method == "GET":
            key = await runtime.db(authenticate, req.api_key())
            names = await runtime.db(list_models, key=key)
            return await req.json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": n, "object": "model", "created": 0, "owned_by": key.organization.slug} for n in names
                    ],
                },
            )
        if path == "/v1/reservations" and req.method == "POST":
            return await _reserve(req)
        match = _RESERVATION.match(path)
        if match and req.method == "POST":
            raw = await req.body(settings.CAPGATE["MAX_BODY_BYTES"])
            if match.group(2) == "settle":
                status, data = await runtime.db(
                    reservations.settle,
                    raw_key=req.api_key(),
                    reservation_id=match.group(1),
                    body=parse_json(raw or b"{}"),
                    lane="settle",
                )
            else:
                status, data = await runtime.db(
                    reservations.release_reservation,
                    raw_key=req.api_key(),
                    reservation_id=match.group(1),
                    lane="settle",
                )
            if runtime.background is not None:
                runtime.background.kick_drain()
            return await req.json(status, data)
        raise GatewayError(f"No route for {req.method} {req.path}.", code="not_found", status=404)
    except ClientGone:
        return
    except BudgetExceeded as exc:
        proxy._note_refusal(exc)
        return await _error(req, exc, "openai")
    except CapgateError as exc:
        return await _error(req, exc, "openai")
    except DatabaseError:
        log.exception("gateway: database unavailable")
        return await _error(req, BudgetUnavailable("The database is unavailable; nothing was reserved."), "openai")


@dataclass
class _Answered:
    """A request answered outside ProxyCall, as the request log's note() reads it."""

    req: Request
    kind: str
    request_id: str = field(default_factory=proxy.new_request_id)
    started: float = field(default_factory=time.monotonic)
    prepared: object | None = None  # the reservation API's admitted requests have their usage record
    model_name: str = ""


async def _reserve(req: Request) -> None:
    """POST /v1/reservations. Its refusals (402, 429) and other errors once the key is known go
    to the request log like the proxy's: noted in memory only (requestlog/buffer.py), so the
    admission path gains no write; the answer carries the id they are logged under."""
    call = _Answered(req, "reservations")
    try:
        body: dict = parse_json(await req.body(settings.CAPGATE["MAX_BODY_BYTES"]))
        call.model_name = str(body.get("model") or "") if isinstance(body, dict) else ""
        bg = runtime.background
        status, data = await runtime.db(
            reservations.create,
            raw_key=req.api_key(),
            body=body,
            headers=req.headers,
            owner_id=bg.instance_id if bg else None,
        )
    except ClientGone:
        return
    except CapgateError as exc:
        if isinstance(exc, BudgetExceeded):
            h = req.headers
            proxy._note_refusal(
                exc,
                tipped_by={
                    "request_id": call.request_id,
                    "key": (req.api_key() or "")[:12],
                    "customer": h.get("x-capgate-customer", ""),
                    "run": h.get("x-capgate-run", ""),
                    "model": call.model_name[:200],
                },
            )
        return await _logged_error(call, exc)
    except DatabaseError:
        log.exception("gateway: database unavailable")
        return await _logged_error(call, BudgetUnavailable("The database is unavailable; nothing was reserved."))
    await req.json(status, data)


async def _logged_error(call: _Answered, exc: CapgateError) -> None:
    request_log.note(call, exc)
    status, headers, body = render(exc, flavor="openai")
    await call.req.respond(status, body, [*headers, (b"x-capgate-request-id", call.request_id.encode())])


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
