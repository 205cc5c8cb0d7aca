"""Optional OpenTelemetry traces (CAPGATE_OTEL_ENABLED): the standard ASGI instrumentation
around the whole ASGI app, one server span per HTTP request, exported over OTLP.

Only imported when enabled (config/asgi.py), so a default deployment loads none of it and never
dials a collector. The exporter reads the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, ...).

What a span never carries: request or response bodies (the instrumentation records none) and
credentials. The instrumentation captures no headers unless OTEL_INSTRUMENTATION_HTTP_CAPTURE_
HEADERS_SERVER_REQUEST asks for some; if an operator asks for ".*", SECRET_HEADERS are still
replaced by "[REDACTED]" — merged with the operator's own sanitize list, because the middleware
takes either its argument or the environment, not both.
"""

from __future__ import annotations

import os
import re
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.util.http import (
    OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS,
    get_custom_headers,
    get_excluded_urls,
    parse_excluded_urls,
)

SECRET_HEADERS = ["authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie", "x-csrftoken"]
# Probes and scrapes every few seconds would bury the requests worth reading; the standard
# OTEL_PYTHON_ASGI_EXCLUDED_URLS / OTEL_PYTHON_EXCLUDED_URLS (regexes searched in the full URL)
# replace this default.
DEFAULT_EXCLUDED = r"^https?://[^/]+/(healthz|readyz|metrics)/?(\?|$)"

# Paths with ids in them, as templates: span names and http.route stay a small fixed set.
_TEMPLATES = [
    (re.compile(r"^/v1/reservations/[^/]+/(settle|release)$"), r"/v1/reservations/{id}/\1"),
    (re.compile(r"^/v1/responses/[^/]+/(cancel|input_items)$"), r"/v1/responses/{id}/\1"),
    (re.compile(r"^/v1/responses/[^/]+$"), "/v1/responses/{id}"),
]


def route_of(path: str) -> str | None:
    """The gateway route a path is served by (its template), or None outside /v1 and probes."""
    path = path.rstrip("/") or "/"
    for pattern, template in _TEMPLATES:
        if pattern.match(path):
            return pattern.sub(template, path)
    if path.startswith("/v1/") or path in ("/healthz", "/readyz", "/metrics"):
        return path
    return None


def span_details(scope: dict) -> tuple[str, dict[str, Any]]:
    """`<METHOD> <route>` and http.route for the gateway; Django's pages get `<METHOD>` only,
    since their paths carry organization slugs and ids (unbounded span names)."""
    method = str(scope.get("method") or "HTTP")
    route = route_of(str(scope.get("path") or ""))
    if route is None:
        return method, {}
    return f"{method} {route}", {"http.route": route}


def otlp_provider() -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "capgate")})
    provider = TracerProvider(resource=resource)
    # Batched on the SDK's own thread: exporting never waits on the request path.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def traced(app: Any, *, tracer_provider: TracerProvider | None = None) -> OpenTelemetryMiddleware:
    """Wrap the ASGI app; `tracer_provider` defaults to one exporting over OTLP (tests pass their own)."""
    sanitize = SECRET_HEADERS + get_custom_headers(OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS)
    own = "OTEL_PYTHON_ASGI_EXCLUDED_URLS" in os.environ or "OTEL_PYTHON_EXCLUDED_URLS" in os.environ
    return OpenTelemetryMiddleware(
        app,
        excluded_urls=get_excluded_urls("ASGI") if own else parse_excluded_urls(DEFAULT_EXCLUDED),
        default_span_details=span_details,
        tracer_provider=tracer_provider or otlp_provider(),
        http_capture_headers_sanitize_fields=sanitize,
    )
