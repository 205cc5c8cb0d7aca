"""Every header Claude Code and Codex send is in the billing inventory, forwarded or kept at the
gateway with its reason (docs/billing.md), and the ones kept never reach the provider.

The clients run against a capture server on 127.0.0.1 that records each request's headers and
answers 402 in the endpoint's shape, so each client makes its first model call and stops: a new
client version that sends a header the inventory does not list fails here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gateway import billing
from tests.clients import agents
from tests.gateway.conftest import KEY


class _Capture(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str]]]

    def do_POST(self) -> None:  # noqa: N802 — http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        if "/messages" in self.path:
            body = {"type": "error", "error": {"type": "invalid_request_error", "message": "captured"}}
        else:
            body = {
                "error": {"message": "captured", "type": "invalid_request_error", "code": "captured", "param": None}
            }
        data = json.dumps(body).encode()
        self.send_response(402)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def capture():
    handler = type("Capture", (_Capture,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    server.shutdown()
    server.server_close()


def _unlisted(headers: dict[str, str], kind: str) -> list[str]:
    return [
        name
        for name in headers
        if name not in billing.HEADERS[kind]
        and name not in billing.NOT_FORWARDED
        and billing.client_header(name) is None
    ]


def _model_calls(seen: list[tuple[str, dict[str, str]]], path: str) -> list[dict[str, str]]:
    calls = [headers for p, headers in seen if p.split("?")[0] == path]
    assert calls, f"the client made no call to {path}: {[p for p, _ in seen]}"
    return calls


def test_every_header_claude_code_sends_is_classified(capture, tmp_path):
    url, seen = capture
    agents.claude(tmp_path, "Say hello", base_url=url, key=KEY, model="claude-test")
    for headers in _model_calls(seen, "/v1/messages"):
        assert "x-claude-code-session-id" in headers  # the premise: its own headers are there
        assert _unlisted(headers, "messages") == []


def test_every_header_codex_sends_is_classified(capture, tmp_path):
    url, seen = capture
    agents.codex(tmp_path, "Say hello", base_url=url, key=KEY, model="gpt-test")
    for headers in _model_calls(seen, "/v1/responses"):
        assert "originator" in headers and any(h.startswith("x-codex-") for h in headers)
        assert _unlisted(headers, "responses") == []


def test_an_unlisted_header_is_found(capture, tmp_path):
    # the check above can fail: a header nobody listed is reported
    assert _unlisted({"x-new-client-thing": "1", "x-stainless-os": "Linux"}, "messages") == ["x-new-client-thing"]


CLAUDE_CODE = {
    "anthropic-version": "2023-06-01",
    "x-claude-code-session-id": "c2b7a88a",
    "x-app": "cli",
    "x-stainless-retry-count": "0",
    "anthropic-dangerous-direct-browser-access": "true",
    "user-agent": "claude-cli/2.1.332 (external, sdk-cli)",
}
CODEX = {
    "session-id": "01a2",
    "thread-id": "01a2",
    "originator": "codex_exec",
    "x-client-request-id": "01a2",
    "x-codex-window-id": "01a2:0",
    "x-codex-beta-features": "remote_compaction_v2",
    "x-codex-turn-metadata": '{"installation_id":"x"}',
    "user-agent": "codex_exec/0.171.0",
}


@pytest.mark.parametrize(
    ("path", "body", "sent"),
    [
        (
            "/v1/messages",
            {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
            CLAUDE_CODE,
        ),
        ("/v1/responses", {"model": "gpt-test", "input": "hi", "max_output_tokens": 10}, CODEX),
    ],
    ids=["claude-code", "codex"],
)
def test_the_headers_kept_at_the_gateway_never_reach_the_provider(gateway, wired, upstream, path, body, sent):
    wired.budget(amount="5")
    headers = {"authorization": f"Bearer {KEY}", **sent}
    resp = httpx.post(gateway.url + path, json=body, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    upstream_headers = {k.lower(): v for k, v in upstream.last(path)["headers"].items()}
    for name, value in sent.items():
        if name not in billing.HEADERS[path.removeprefix("/v1/")]:
            assert upstream_headers.get(name) != value, name
