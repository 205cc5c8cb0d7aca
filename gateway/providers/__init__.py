"""Provider adapters, one module per connection kind (gateway/providers/base.py says what an
adapter answers). Importing the package registers every kind it ships; the built-in echo
provider registers itself.

Upstream responses are consumed as raw bytes (non-stream) or as SSE events (stream) so the
client receives the endpoint's own wire format, untouched except where an adapter says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.providers import anthropic, azure_openai, bedrock, gemini, openai, presets, vertex
from gateway.providers.base import (
    PATHS,
    Adapter,
    UpstreamRequest,
    adapter_for,
    connection_url,
    formats,
    register,
    registered,
    serves,
)
from gateway.providers.sse import SSEEvent, sse_events
from gateway.providers.usage import (
    StreamUsage,
    response_state,
    usage_anthropic,
    usage_from_body,
    usage_openai,
    usage_responses,
)

if TYPE_CHECKING:
    from gateway.admission.routing import Target

__all__ = [
    "PATHS",
    "Adapter",
    "SSEEvent",
    "StreamUsage",
    "UpstreamRequest",
    "adapter",
    "adapter_for",
    "anthropic",
    "azure_openai",
    "bedrock",
    "connection_url",
    "formats",
    "gemini",
    "openai",
    "presets",
    "register",
    "registered",
    "response_state",
    "serves",
    "sse_events",
    "upstream_headers",
    "upstream_url",
    "usage_anthropic",
    "usage_from_body",
    "usage_openai",
    "usage_responses",
    "vertex",
]


def adapter(target: Target) -> Adapter:
    """The adapter of a target's connection kind (routing only keeps targets that have one)."""
    found = adapter_for(target.connection.kind)
    if found is None:
        raise LookupError(f"no adapter is registered for connection kind {target.connection.kind!r}")
    return found.variant(target.connection)


def upstream_url(target: Target, endpoint: str) -> str:
    return adapter(target).url(target, endpoint)


def upstream_headers(target: Target, client_headers: dict[str, str]) -> dict[str, str]:
    return adapter(target).headers(target, client_headers)
