"""A request body must arrive within BODY_READ_TIMEOUT_SECONDS: a client that sends its headers
and then dribbles (or stops sending) its body gets 408 and its connection back, instead of
holding a task of the gateway for as long as it likes."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import pytest

from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)


def _send_part_of_a_body(url: str, *, wait: float) -> bytes:
    """Headers promising 100 bytes, then 10 of them; whatever the gateway answers within `wait`."""
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port), timeout=wait) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"model":'
        )
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


def test_a_body_that_does_not_arrive_in_time_gets_408(gateway, wired, settings):
    settings.CAPGATE = {**settings.CAPGATE, "BODY_READ_TIMEOUT_SECONDS": 0.5}
    began = time.monotonic()
    answer = _send_part_of_a_body(gateway.url, wait=3)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")
    assert time.monotonic() - began < 2


def test_removal_without_the_bound_the_connection_stays_held(gateway, wired, settings):
    settings.CAPGATE = {**settings.CAPGATE, "BODY_READ_TIMEOUT_SECONDS": 60.0}
    assert _send_part_of_a_body(gateway.url, wait=1.5) == b""
