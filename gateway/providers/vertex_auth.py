"""google-auth for Vertex connections (gateway/providers/vertex.py): the service account's
credentials, and the HTTP hook google-auth refreshes a token through. Imported with a Vertex
connection's first token, not with the adapter, so a worker that routes to no Vertex connection
does not hold google-auth (docs/performance.md, "Gateway processes and memory")."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from google.auth import exceptions as google_exceptions
from google.auth import transport
from google.oauth2 import service_account

from catalog.kinds import VERTEX_SCOPES
from gateway.upstream.transport import client

GoogleAuthError = google_exceptions.GoogleAuthError
_TOKEN_TIMEOUT = 10.0


def credentials(info: dict[str, Any]) -> service_account.Credentials:
    """A service account key's credentials, scoped for Vertex (no token yet)."""
    return service_account.Credentials.from_service_account_info(info, scopes=VERTEX_SCOPES)


class LoopRequest(transport.Request):
    """google-auth's HTTP hook, answered by the gateway's own upstream client on the event loop
    (called from the worker thread google-auth refreshes in)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def __call__(self, url, method="GET", body=None, headers=None, timeout=None, **kwargs):  # type: ignore[override]

        future = asyncio.run_coroutine_threadsafe(
            client().request(method, url, content=body, headers=headers, timeout=timeout or _TOKEN_TIMEOUT),
            self.loop,
        )
        try:
            response = future.result(timeout=(timeout or _TOKEN_TIMEOUT) + 5)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise google_exceptions.TransportError(f"{type(exc).__name__}: {exc}") from exc
        return _Response(response)


class _Response(transport.Response):
    def __init__(self, response: httpx.Response):
        self._r = response

    @property
    def status(self) -> int:
        return self._r.status_code

    @property
    def headers(self):  # type: ignore[override]
        return dict(self._r.headers)

    @property
    def data(self) -> bytes:
        return self._r.content
