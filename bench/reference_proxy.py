"""The cap-less reference proxy for bench/gateway.py: uvicorn plus aiohttp's client,
forwarding bytes to one upstream, no database, no auth, no caps. What a proxy costs on this
machine before capgate adds anything; capgate's targets are ratios against it.

    REFERENCE_UPSTREAM=http://127.0.0.1:18201 uvicorn bench.reference_proxy:app --port 18202
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

UPSTREAM = os.environ.get("REFERENCE_UPSTREAM", "http://127.0.0.1:18201")
HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
_session: aiohttp.ClientSession | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _session
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2000), auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _session is not None:
                    await _session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    assert scope["type"] == "http" and _session is not None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.decode().lower() not in HOP]
    async with _session.request(scope["method"], UPSTREAM + scope["path"], data=body, headers=headers) as resp:
        out = [(k.lower(), v) for k, v in resp.raw_headers if k.decode().lower() not in HOP]
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        async for chunk in resp.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
