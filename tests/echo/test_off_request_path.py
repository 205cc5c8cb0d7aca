"""echo is chosen by connection kind like any provider: the request path sends to it what it
sends to any provider, and the upstream transport hands the call to echo's registered transport."""

from __future__ import annotations

import asyncio
import json
import pathlib

import httpx
import pytest

from catalog.models import Connection
from echo.transport import EchoTransport
from gateway.upstream import transport

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUEST_PATH = [
    "gateway/http/app.py",
    "gateway/http/routes.py",
    "gateway/http/endpoints.py",
    "gateway/upstream/proxy.py",
    "gateway/upstream/outcomes.py",
    "gateway/upstream/streams.py",
    "gateway/upstream/stored.py",
    "gateway/upstream/runtime.py",
    "gateway/upstream/transport.py",
    "gateway/admission/limits.py",
    "gateway/admission/routing.py",
    "gateway/admission/sizing.py",
    "gateway/admission/service.py",
    "jobs/upstream.py",
    "jobs/sizing.py",
    "jobs/background.py",
    "jobs/submit.py",
]


@pytest.mark.parametrize("module", REQUEST_PATH)
def test_no_request_path_module_names_echo(module: str) -> None:
    assert "echo" not in (ROOT / module).read_text().lower()


def _chat(connection: Connection, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        client = transport.new_client()
        try:
            return await client.post(
                "/v1/chat/completions",
                content=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                extensions=transport.tag(connection=connection, client_headers=headers, input_tokens=40),
            )
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_an_echo_connection_is_answered_in_process_by_its_registered_transport() -> None:
    # given: an echo connection (never saved: echo reads its options only)
    conn = Connection(name="echo", kind="echo", base_url="", options={"completion_tokens": 3})
    # when
    r = _chat(conn)
    # then: echo's answer, a quarter of the input bound as prompt tokens
    assert isinstance(transport.in_process("echo"), EchoTransport)
    assert r.status_code == 200
    assert r.json()["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def test_unregistered_the_same_call_goes_to_the_network_and_is_not_answered(monkeypatch) -> None:
    # given: the registration removed (the control for the test above)
    monkeypatch.setattr(transport, "_IN_PROCESS", {})
    conn = Connection(name="echo", kind="echo", base_url="", options={})
    # when / then: nothing answers the call in-process; the never-dialled host is not reached
    with pytest.raises(httpx.ConnectError):
        _chat(conn)


def test_fault_header_is_honoured_only_on_a_connection_that_opts_in() -> None:
    # given: the same fault header, on a connection without and with allow_fault_headers
    plain = Connection(name="echo", kind="echo", base_url="", options={})
    opted = Connection(name="echo", kind="echo", base_url="", options={"allow_fault_headers": True})
    fault = {"x-capgate-echo-fail": "503"}
    # when / then
    assert _chat(plain, fault).status_code == 200
    assert _chat(opted, fault).status_code == 503
