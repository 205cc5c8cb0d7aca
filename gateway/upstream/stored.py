"""Stored responses (OpenAI Responses API): get, delete, cancel and list the input items of a
response capgate relayed, proxied to the connection that served it. Nothing is billed here."""

from __future__ import annotations

import httpx

from core.errors import CapgateError
from gateway.admission.routing import Target, authenticate
from gateway.http.errors import GatewayError, render
from gateway.http.request import Request
from gateway.providers import connection_url, upstream_headers
from gateway.upstream import continuations, runtime, transport
from gateway.upstream.transport import client


async def handle_stored_response(req: Request, response_id: str, action: str) -> None:
    """GET, DELETE and POST .../cancel (and GET .../input_items) of a stored response, proxied
    to the connection that served it, for the organization that owns it only: anyone else's id
    is 404, as if it did not exist. Nothing is billed, so nothing is reserved."""
    try:
        key = await runtime.db(authenticate, req.api_key())
        stored = await runtime.db(continuations.owned, organization_id=key.organization_id, response_id=response_id)
    except CapgateError as exc:
        status, headers, body = render(exc, flavor="openai")
        return await req.respond(status, body, headers)
    connection = stored.connection if stored is not None else None
    if stored is None or connection is None:
        status, headers, body = render(
            GatewayError(f"No response with id '{response_id}'.", code="not_found", status=404, param="response_id"),
            flavor="openai",
        )
        return await req.respond(status, body, headers)
    suffix = {"get": "", "delete": "", "cancel": "/cancel", "input_items": "/input_items"}[action]
    target = Target(connection=connection, model=None)  # type: ignore[arg-type]
    try:
        resp = await client().request(
            req.method,
            connection_url(connection.base_url, f"/v1/responses/{response_id}{suffix}"),
            headers=upstream_headers(target, {}),
            extensions=transport.tag(connection=connection),
        )
    except httpx.HTTPError as exc:
        status, hdrs, body = render(
            GatewayError(f"Upstream failed: {type(exc).__name__}", code="upstream_error", status=502),
            flavor="openai",
        )
        return await req.respond(status, body, hdrs)
    status, content = resp.status_code, resp.content
    if action == "delete" and status == 200:
        await runtime.db(
            continuations.forget, organization_id=key.organization_id, response_id=response_id, lane="settle"
        )
    await req.respond(status, content)
