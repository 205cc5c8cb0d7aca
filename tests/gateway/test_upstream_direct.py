"""A whole upstream call (gateway/upstream/transport.py `post`) goes from the aiohttp session
without httpx's request and response objects, and is the same call as through httpx: the same
bytes on the wire, the same answer, the same errors (as capgate bills them), the same guards."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
import time

import httpx
import pytest

from gateway.upstream import proxy
from gateway.upstream import transport as guard

HEADERS = {
    "content-type": "application/json",
    "accept-encoding": "identity",
    "authorization": "Bearer sk-up",
    "X-Upstream-Knob": "1",
}
BODY = b'{"model": "m", "messages": []}'


class Upstream:
    """127.0.0.1: reads one request per connection, keeps its bytes, then `reply`s (None: closes
    without answering; "hang": keeps the connection open and never answers)."""

    def __init__(self, reply: bytes | str | None):
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.seen: list[bytes] = []
        self.reply = reply
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}/v1/chat/completions"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            with conn:
                self.seen.append(conn.recv(65536))
                if self.reply == "hang":
                    time.sleep(2)
                elif self.reply is not None:
                    conn.sendall(self.reply)  # type: ignore[arg-type]

    def close(self) -> None:
        self.srv.close()


def _answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"".join(h + b"\r\n" for h in extra) + b"content-length: %d\r\n\r\n" % len(body) + body


def _call(path: str, url: str, *, headers=HEADERS, content=BODY, extensions=None) -> guard.Whole:
    """One whole POST through a fresh client: httpx's own post, or the transport's direct one."""

    async def go() -> guard.Whole:
        c = guard.new_client()
        try:
            if path == "httpx":
                r = await c.post(url, content=content, headers=headers, extensions=extensions or {})
                return guard.Whole(r.status_code, r.content)
            return await _guarded(c).post(c, url, content=content, headers=headers, extensions=extensions or {})
        finally:
            await c.aclose()

    return asyncio.run(go())


PATHS = ["httpx", "direct"]


def _guarded(c: httpx.AsyncClient) -> guard.GuardedTransport:
    transport = c._transport
    assert isinstance(transport, guard.GuardedTransport)
    return transport


def test_the_direct_path_sends_the_bytes_httpx_sends_and_reads_the_same_answer():
    # given: an upstream that answers gzip-compressed (httpx decodes; so must the direct path)
    up = Upstream(_answer(gzip.compress(b'{"ok": true}'), b"content-encoding: gzip"))
    try:
        # when
        answers = [_call(path, up.url) for path in PATHS]
        # then
        assert answers[0] == answers[1] == guard.Whole(200, b'{"ok": true}')
        assert len(up.seen) == 2 and up.seen[0] == up.seen[1], up.seen
        assert b"\r\nx-upstream-knob: 1\r\n" in up.seen[0] and up.seen[0].endswith(b"\r\n\r\n" + BODY)
    finally:
        up.close()


def test_both_paths_write_httpx_log_line(caplog):
    up = Upstream(_answer(b"{}"))
    try:
        lines = []
        for path in PATHS:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="httpx"):
                _call(path, up.url)
            lines.append([r.getMessage() for r in caplog.records if r.name == "httpx"])
        assert lines[0] == lines[1] == [f'HTTP Request: POST {up.url} "HTTP/1.1 200 OK"']
    finally:
        up.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_dropped_connection_after_the_request_is_an_unknown_outcome(path):
    # given: an upstream that reads the request and closes without answering (it may have billed)
    up = Upstream(None)
    try:
        # when / then: not one of NOT_BILLED (charged at its worst case, not released)
        with pytest.raises(httpx.TransportError) as caught:
            _call(path, up.url)
        assert up.seen and up.seen[0].startswith(b"POST /v1/chat/completions")
        assert not isinstance(caught.value, proxy.NOT_BILLED), type(caught.value)
        assert type(caught.value) is httpx.ReadError
    finally:
        up.close()


def test_without_the_remap_the_direct_path_would_release_a_dropped_call_unbilled(monkeypatch):
    # Guard removal (transport._mapped, which the direct path applies too): httpx-aiohttp's own
    # mapping calls the drop ConnectTimeout, which the proxy releases as not billed.
    monkeypatch.setattr(guard, "_mapped", lambda exc: exc)
    up = Upstream(None)
    try:
        with pytest.raises(httpx.TransportError) as caught:
            _call("direct", up.url)
        assert isinstance(caught.value, proxy.NOT_BILLED)
    finally:
        up.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_refused_connection_is_a_connect_error(path):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there
    with pytest.raises(httpx.ConnectError) as caught:
        _call(path, f"http://127.0.0.1:{port}/v1/chat/completions")
    assert isinstance(caught.value, proxy.NOT_BILLED)


@pytest.mark.parametrize("path", PATHS)
def test_a_loopback_literal_is_refused_before_any_byte_is_sent(path, settings):
    # given: production's rule (public addresses only)
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    up = Upstream(_answer(b"{}"))
    try:
        # when / then
        with pytest.raises(guard.DestinationRefused, match="not allowed: loopback"):
            _call(path, up.url)
        time.sleep(0.05)
        assert up.seen == []
    finally:
        up.close()


@pytest.mark.parametrize("path", PATHS)
def test_the_first_byte_timeout_holds_and_gives_the_slot_back(path, settings):
    # given: an upstream that takes the request and never answers; a 0.2 s first-byte timeout
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_FIRST_BYTE_TIMEOUT": 0.2}
    up = Upstream("hang")
    try:
        # when
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match=r"no response within the first-byte timeout \(0.2 s\)"):
            _call(path, up.url, extensions={guard.EXTENSION: (901, 902)})
        # then: unknown outcome (sent), on time, and the tenant's slot is free again
        assert time.monotonic() - started < 1.5
        assert 901 not in guard.slots.by_organization and 902 not in guard.slots.by_connection
    finally:
        up.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_tenant_over_its_share_is_refused_before_sending(path, settings):
    # given: one call per connection, already in flight
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_MAX_PER_CONNECTION": 1}
    up = Upstream(_answer(b"{}"))
    guard.slots.take(organization_id=911, connection_id=912)
    try:
        # when / then
        with pytest.raises(guard.UpstreamBusy):
            _call(path, up.url, extensions={guard.EXTENSION: (911, 912)})
        time.sleep(0.05)
        assert up.seen == []
    finally:
        guard.slots.give_back(organization_id=911, connection_id=912)
        up.close()
    # and a call that gets through gives its slot back once its body is read
    up = Upstream(_answer(b'{"x": 1}'))
    try:
        assert _call(path, up.url, extensions={guard.EXTENSION: (911, 912)}) == guard.Whole(200, b'{"x": 1}')
        assert 912 not in guard.slots.by_connection
    finally:
        up.close()


@pytest.mark.parametrize(
    "headers, content",
    [
        ({**HEADERS, "x-upstream-note": "caf\u00e9"}, BODY),  # httpx refuses a header that is not ASCII
        ({**HEADERS, "Content-Type": "text/plain"}, BODY),  # the same name twice: httpx joins them
        (HEADERS, b""),  # an empty body: httpx's own content-length: 0
    ],
    ids=["non-ascii-header", "name-twice", "empty-body"],
)
def test_what_only_httpx_sends_as_it_does_goes_through_httpx(headers, content):
    up = Upstream(_answer(b"{}"))
    try:
        c = guard.new_client()
        assert _guarded(c).direct(c, up.url, content, headers) is None
        outcomes = []
        for path in PATHS:
            try:
                outcomes.append(_call(path, up.url, headers=headers, content=content))
            except Exception as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1]
    finally:
        up.close()
