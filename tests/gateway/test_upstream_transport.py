"""The upstream transport (httpx's API over aiohttp) reports failures as capgate bills them:
only a failure known to be before the request was sent is a connect error (not billed)."""

import asyncio
import socket
import threading

import httpx
import pytest

from gateway.upstream import proxy
from gateway.upstream import transport as guard


def _server(answer: bool) -> tuple[socket.socket, list[bytes]]:
    """127.0.0.1: reads one request per connection, then answers or just closes (a provider
    that took the request and dropped the connection: it may have billed)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(65536))
                if answer:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return srv, seen


def _post(url: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=guard.GuardedTransport(
                limits=httpx.Limits(max_connections=4), ssl_context=httpx.create_ssl_context()
            )
        ) as c:
            return await c.post(url, content=b'{"model": "m"}')

    return asyncio.run(go())


def test_a_dropped_connection_after_the_request_is_not_a_connect_error():
    # given: an upstream that reads the request and closes without answering
    srv, seen = _server(answer=False)
    try:
        # when / then: an unknown outcome (billed at worst case), not one of NOT_BILLED
        with pytest.raises(httpx.TransportError) as caught:
            _post(f"http://127.0.0.1:{srv.getsockname()[1]}/v1/chat/completions")
        assert seen and seen[0].startswith(b"POST /v1/chat/completions")
        assert not isinstance(caught.value, proxy.NOT_BILLED), type(caught.value)
    finally:
        srv.close()


def test_without_the_remap_the_same_drop_would_be_released_unbilled(monkeypatch):
    # Guard removal: httpx-aiohttp's own mapping calls it ConnectTimeout, which proxy releases.
    monkeypatch.setattr(guard, "_mapped", lambda exc: exc)
    srv, _ = _server(answer=False)
    try:
        with pytest.raises(httpx.TransportError) as caught:
            _post(f"http://127.0.0.1:{srv.getsockname()[1]}/")
        assert isinstance(caught.value, proxy.NOT_BILLED)
    finally:
        srv.close()


def test_refused_connection_is_a_connect_error_and_answers_pass_through():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there
    with pytest.raises(httpx.ConnectError):
        _post(f"http://127.0.0.1:{port}/")
    srv, _ = _server(answer=True)
    try:
        r = _post(f"http://127.0.0.1:{srv.getsockname()[1]}/")
        assert (r.status_code, r.text) == (200, "ok")
    finally:
        srv.close()
