"""Optional OpenTelemetry traces (config/tracing.py): off by default; on, one server span per
request with its route and status, and never a key or a body in its attributes."""

from __future__ import annotations

import importlib
import threading
import time

import httpx
import pytest
import uvicorn
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import config.asgi
from config import tracing
from gateway.http.app import CapgateASGI
from gateway.upstream.runtime import close_thread_connections
from tests.gateway.conftest import KEY, _free_port, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
SECRET_WORD = "do-not-trace-this-prompt"


def test_off_by_default_the_app_is_not_wrapped(settings):
    assert settings.CAPGATE["OTEL_ENABLED"] is False
    assert type(config.asgi.application) is CapgateASGI


@pytest.fixture
def traced_app(settings, monkeypatch):
    """config.asgi imported again with CAPGATE_OTEL_ENABLED on, spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "otlp_provider", lambda: provider)
    # An operator asking for every request header: the secret ones must still be redacted.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    original = settings.CAPGATE
    settings.CAPGATE = {**original, "OTEL_ENABLED": True}
    try:
        yield importlib.reload(config.asgi).application, exporter
    finally:
        settings.CAPGATE = original
        importlib.reload(config.asgi)


def serve(app):
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, lifespan="on", log_level="warning", timeout_graceful_shutdown=2
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


def test_enabled_a_gateway_request_gets_a_server_span_with_route_and_status(traced_app, wired):
    app, exporter = traced_app
    assert isinstance(app, OpenTelemetryMiddleware)
    wired.budget(amount="1")
    server, thread, url = serve(app)
    try:
        # when: a chat call (key in Authorization, and again in x-api-key), a settle of a reservation
        # id that does not exist, and a probe
        body = {"model": "echo-1", "messages": [{"role": "user", "content": SECRET_WORD}], "max_tokens": 20}
        r = httpx.post(
            url + "/v1/chat/completions",
            json=body,
            timeout=30,
            headers={"authorization": f"Bearer {KEY}", "x-api-key": KEY, "x-capgate-customer": "acme-c1"},
        )
        missing = httpx.post(
            url + "/v1/reservations/0e7c1f5e-0000-4000-8000-000000000000/release",
            headers={"authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        probe = httpx.get(url + "/healthz", timeout=30)
        wait_settled()
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        close_thread_connections()
    assert (r.status_code, missing.status_code, probe.status_code) == (200, 404, 200)
    # then: one server span per traced request, named by route, with its status
    servers = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    by_route = {s.attributes["http.route"]: s for s in servers}
    assert sorted(by_route) == ["/v1/chat/completions", "/v1/reservations/{id}/release"]  # probes excluded
    chat = by_route["/v1/chat/completions"]
    assert chat.name == "POST /v1/chat/completions"
    assert chat.attributes["http.status_code"] == 200
    assert by_route["/v1/reservations/{id}/release"].attributes["http.status_code"] == 404
    # headers were captured (the operator asked for all), but the key only as [REDACTED]
    assert chat.attributes["http.request.header.x_capgate_customer"] == ("acme-c1",)
    assert chat.attributes["http.request.header.authorization"] == ("[REDACTED]",)
    assert chat.attributes["http.request.header.x_api_key"] == ("[REDACTED]",)
    # and no span (server, receive or send) carries the key or the body anywhere
    every = repr(
        [
            (s.name, dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events])
            for s in exporter.get_finished_spans()
        ]
    )
    assert KEY not in every and SECRET_WORD not in every


def test_dashboard_pages_get_a_span_named_by_method_only():
    # Django's paths carry slugs and ids: the span name stays bounded.
    assert tracing.span_details({"method": "GET", "path": "/o/acme/keys/17/"}) == ("GET", {})
    assert tracing.span_details({"method": "POST", "path": "/v1/responses/resp_abc/cancel"}) == (
        "POST /v1/responses/{id}/cancel",
        {"http.route": "/v1/responses/{id}/cancel"},
    )
