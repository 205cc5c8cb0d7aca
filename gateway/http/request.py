"""Just enough HTTP for the gateway's plain ASGI endpoints."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings

from core import fastjson
from core.strict import ascii_int
from gateway.http.errors import GatewayError

Headers = list[tuple[bytes, bytes]]


class Request:
    def __init__(self, scope: dict, receive, send):
        self.scope = scope
        self.receive = receive
        self.send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.started = False  # response start sent

    def api_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip() or None
        return self.headers.get("x-api-key") or None

    async def body(self, limit: int) -> bytes:
        """The whole body, at most `limit` bytes, read within BODY_READ_TIMEOUT_SECONDS: the
        server (uvicorn) bounds no request read, so a client dribbling a body byte by byte
        would otherwise hold its connection and task for as long as it likes (408 instead)."""
        declared = ascii_int(self.headers.get("content-length") or "")
        if declared is not None and declared > limit:
            raise GatewayError(f"The request body exceeds {limit} bytes.", code="request_too_large", status=413)
        seconds = settings.CAPGATE["BODY_READ_TIMEOUT_SECONDS"]
        try:
            async with asyncio.timeout(seconds):
                return await self._read_body(limit)
        except TimeoutError:
            raise GatewayError(
                f"The request body did not arrive within {seconds:g} s.", code="request_timeout", status=408
            ) from None

    async def _read_body(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise GatewayError(f"The request body exceeds {limit} bytes.", code="request_too_large", status=413)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def start(self, status: int, headers: Headers) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(
        self, status: int, body: bytes, headers: Headers | None = None, content_type: bytes = b"application/json"
    ) -> None:
        await self.start(
            status, [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(headers or [])]
        )
        await self.send({"type": "http.response.body", "body": body})

    async def json(self, status: int, data: Any, headers: Headers | None = None) -> None:
        await self.respond(status, fastjson.dumps(data), headers)


class ClientGone(Exception):
    """The client disconnected."""
