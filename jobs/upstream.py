"""Calls to a provider's job endpoints on one connection, with the gateway's guarded transport."""

from __future__ import annotations

import json
from typing import Any

import httpx

from catalog.models import Connection
from gateway.admission.routing import Target
from gateway.providers import connection_url, upstream_headers
from gateway.upstream import transport

# Connect refused or never sent: the provider cannot have started anything.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def headers(connection: Connection, *, multipart: bool = False) -> dict[str, str]:
    out = upstream_headers(Target(connection=connection, model=None), {})  # type: ignore[arg-type]
    if multipart:
        out.pop("content-type", None)
    return out


async def send(
    client: httpx.AsyncClient,
    connection: Connection | None,
    method: str,
    path: str,
    *,
    body: Any = None,
    files: dict | None = None,
    data: dict | None = None,
) -> httpx.Response:
    """One call to `path` (starting /v1/) on the connection. `body` is sent as JSON."""
    assert connection is not None, "callers check that the job's connection still exists"
    kwargs: dict[str, Any] = {
        "headers": headers(connection, multipart=files is not None),
        "extensions": transport.tag(connection=connection),
    }
    if files is not None:
        kwargs.update(files=files, data=data or {})
    elif body is not None:
        kwargs["content"] = json.dumps(body).encode()
    return await client.request(method, connection_url(connection.base_url, path), **kwargs)


def new_client() -> httpx.AsyncClient:
    """A client for beat's polls (its own event loop per run): the same guarded transport."""
    return transport.new_client()


def loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None
