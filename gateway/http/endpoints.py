"""The gateway's own /v1 handlers, as the route table (gateway/http/routes.py) calls them:
each is given the request and its path's match.

The proxied endpoints, count_tokens and stored responses answer their own errors in their
endpoint's shape; `/v1/models` and the reservation API answer theirs in OpenAI's (`openai_errors`).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError

from alerts.alerts import note_refusal
from core.errors import CapgateError
from gateway.admission import count_tokens as token_counting
from gateway.admission import reservations
from gateway.admission.bounds import parse_json
from gateway.admission.routing import authenticate, list_models
from gateway.http.errors import render
from gateway.http.request import ClientGone, Request
from gateway.upstream import proxy, runtime
from gateway.upstream.stored import handle_stored_response
from ledger.errors import BudgetExceeded, BudgetUnavailable
from requestlog import buffer as request_log

log = logging.getLogger("capgate.gateway")
Handler = Callable[[Request, re.Match[str]], Awaitable[None]]


def proxied(kind: str) -> Handler:
    """The proxied endpoint `kind` (chat, messages, embeddings, responses)."""

    async def handle(req: Request, match: re.Match[str]) -> None:
        await proxy.handle(req, kind)

    handle.__qualname__ = f"proxied({kind!r})"
    return handle


async def count_tokens(req: Request, match: re.Match[str]) -> None:
    await token_counting.handle(req)


def stored(action: str) -> Handler:
    """A stored response's `action` (get, delete, cancel, input_items); the match holds its id."""

    async def handle(req: Request, match: re.Match[str]) -> None:
        await handle_stored_response(req, match.group(1), action)

    handle.__qualname__ = f"stored({action!r})"
    return handle


async def error(req: Request, exc: CapgateError, flavor: str) -> None:
    status, headers, body = render(exc, flavor=flavor)
    await req.respond(status, body, headers)


def openai_errors(fn: Handler) -> Handler:
    """Answer the handler's refusals in OpenAI's shape; a database error is 503 (nothing reserved)."""

    @functools.wraps(fn)
    async def run(req: Request, match: re.Match[str]) -> None:
        try:
            await fn(req, match)
        except ClientGone:
            return
        except BudgetExceeded as exc:
            runtime.run_soon(note_refusal, window_id=exc.window_id)
            await error(req, exc, "openai")
        except CapgateError as exc:
            await error(req, exc, "openai")
        except DatabaseError:
            log.exception("gateway: database unavailable")
            await error(req, BudgetUnavailable("The database is unavailable; nothing was reserved."), "openai")

    return run


@openai_errors
async def models(req: Request, match: re.Match[str]) -> None:
    key = await runtime.db(authenticate, req.api_key())
    names = await runtime.db(list_models, key=key)
    await req.json(
        200,
        {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": key.organization.slug} for n in names],
        },
    )


@openai_errors
async def settle(req: Request, match: re.Match[str]) -> None:
    raw = await req.body(settings.CAPGATE["MAX_BODY_BYTES"])
    status, data = await runtime.db(
        reservations.settle,
        raw_key=req.api_key(),
        reservation_id=match.group(1),
        body=parse_json(raw or b"{}"),
        lane="settle",
    )
    if runtime.background is not None:
        runtime.background.kick_drain()
    await req.json(status, data)


@openai_errors
async def release(req: Request, match: re.Match[str]) -> None:
    await req.body(settings.CAPGATE["MAX_BODY_BYTES"])
    status, data = await runtime.db(
        reservations.release_reservation,
        raw_key=req.api_key(),
        reservation_id=match.group(1),
        lane="settle",
    )
    if runtime.background is not None:
        runtime.background.kick_drain()
    await req.json(status, data)


@dataclass
class _Answered:
    """A request answered outside ProxyCall, as the request log's note() reads it."""

    req: Request
    kind: str
    request_id: str = field(default_factory=proxy.new_request_id)
    started: float = field(default_factory=time.monotonic)
    admission: object | None = None  # the reservation API's admitted requests have their usage record
    model_name: str = ""


@openai_errors
async def create_reservation(req: Request, match: re.Match[str]) -> None:
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
            runtime.run_soon(
                note_refusal,
                window_id=exc.window_id,
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
