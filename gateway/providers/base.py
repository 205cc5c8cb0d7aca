"""The adapter interface: what the request path asks of a connection kind, and the registry of
kinds.

The proxy and the stream relay never look at `Connection.kind`; they ask the kind's adapter:

- which endpoints it serves in their own wire format (`endpoints`; routing keeps only those);
- the upstream request for one call (`request`: URL, headers, body bytes), so a kind that signs
  the whole request (Bedrock's SigV4) or rewrites the body (the model id in the path) can;
- which parameter carries the output ceiling the gateway reserved (`output_param`; `with_ceiling`
  writes it there and drops every other ceiling parameter);
- how usage is read from a body (`usage_from_body`) and from a stream (`events`, which turns
  the provider's stream into SSE events in the endpoint's format, and `StreamUsage`).

A kind is registered once, at import (this package's modules) or at app ready (the built-in echo
provider): `register(kind, adapter)`. An unregistered kind has no adapter and is never routed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from catalog.pricing import Usage
from gateway.providers import usage as usage_mod
from gateway.providers.sse import SSEEvent, sse_events

if TYPE_CHECKING:
    from catalog.models import Connection
    from gateway.admission.routing import Target

PATHS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
    "compact": "/v1/responses/compact",
}
# The parameters an output ceiling can travel in, in OpenAI's and Anthropic's formats (Gemini's and
# Converse's top-level ceiling is moved into their config by their adapters).
OUTPUT_CEILINGS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass
class UpstreamRequest:
    """One call as it goes to the provider."""

    url: str
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)


class Adapter:
    """A connection kind. The defaults are OpenAI's: bearer auth, `/v1/...` under the base URL,
    the body as the client shaped it, usage in the endpoint's own format, SSE streams."""

    kind = ""
    endpoints: frozenset[str] = frozenset()
    default_base_url = ""
    # Answers POST /v1/messages/count_tokens under the base URL (Anthropic's own endpoint).
    counts_tokens = False
    # The provider job APIs a connection of this kind runs (jobs/): "batches" (OpenAI's),
    # "message_batches" (Anthropic's), "background" (background responses). A job routed to a
    # kind without its API is refused at submission.
    jobs: frozenset[str] = frozenset()
    # The parameter the output ceiling the gateway reserved is sent in, on the chat endpoint
    # (a connection's options.max_tokens_param overrides it: some servers know only max_tokens).
    max_tokens_param = "max_completion_tokens"

    # --- where and how ------------------------------------------------------------------------

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        return connection_url(target.connection.base_url or self.default_base_url, PATHS[endpoint])

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        """The connection's credentials (and any client header the kind forwards)."""
        if target.connection.plain_secret:
            headers["authorization"] = f"Bearer {target.connection.plain_secret}"

    def headers(self, target: Target, client_headers: dict[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self.auth(target, client_headers, headers)
        # The fake upstream used by tests and benchmarks takes its fault knobs from these.
        if target.connection.options.get("forward_test_headers"):
            for name, value in client_headers.items():
                if name.startswith("x-upstream-"):
                    headers[name] = value
        return headers

    def model_id(self, target: Target) -> str:
        """The id the provider knows the route target's model by: the connection's own mapping
        (options.model_ids, catalog name -> provider id), else the catalog's name."""
        return target.connection.provider_model_id(target.model.name)

    def variant(self, connection: Connection) -> Adapter:
        """The adapter a connection of this kind is called through: a kind whose provider
        offers more than one API picks one by the connection's options (Bedrock's Converse)."""
        return self

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        """The body as this kind's provider takes it (the client's, shaped by the gateway)."""
        return body

    async def request(
        self, target: Target, endpoint: str, body: dict, client_headers: dict[str, str], *, stream: bool
    ) -> UpstreamRequest:
        """The upstream request for one attempt. Async: a kind may need to fetch or refresh a
        credential first (Vertex's OAuth token), off the event loop."""
        return UpstreamRequest(
            url=self.url(target, endpoint, stream=stream),
            content=json.dumps(self.body(target, endpoint, body, stream=stream)).encode(),
            headers=self.headers(target, client_headers),
        )

    def with_ceiling(self, target: Target, endpoint: str, body: dict, ceiling: int) -> dict:
        """`body` carrying `ceiling` as its only output ceiling, in the parameter this provider
        reads: a ceiling left beside it in another parameter is one a server may read instead
        (several know only max_tokens and never see a max_completion_tokens)."""
        out = {k: v for k, v in body.items() if k not in OUTPUT_CEILINGS}
        out[self.output_param(target, endpoint)] = ceiling
        return out

    def output_param(self, target: Target, endpoint: str) -> str:
        if endpoint == "messages":
            return "max_tokens"
        if endpoint == "responses":
            return "max_output_tokens"
        return str(target.connection.options.get("max_tokens_param") or self.max_tokens_param)

    # --- what came back ---------------------------------------------------------------------

    def usage_from_body(self, endpoint: str, data: bytes) -> tuple[Usage | None, str]:
        return usage_mod.usage_from_body(endpoint, data)

    def events(self, response: httpx.Response, endpoint: str) -> AsyncIterator[SSEEvent]:
        """The stream as SSE events in the endpoint's format."""
        return sse_events(response.aiter_lines())

    def stream_usage(self, endpoint: str) -> usage_mod.StreamUsage:
        """Follows the relayed events and keeps the usage they report."""
        return usage_mod.StreamUsage(endpoint)

    # --- checks at connection time ------------------------------------------------------------

    def check_options(self, options: dict, secret: str | None) -> str | None:
        """What is wrong with a connection's options or secret for this kind (a message naming
        the option), or None. The secret is None on an edit that keeps the stored one."""
        return None


_REGISTRY: dict[str, Adapter] = {}


def register(kind: str, adapter: Adapter) -> None:
    """Make `kind` a connection kind the gateway can route to (idempotent per kind)."""
    adapter.kind = kind
    _REGISTRY[kind] = adapter


def adapter_for(kind: str) -> Adapter | None:
    return _REGISTRY.get(kind)


def serves(kind: str, endpoint: str) -> bool:
    adapter = _REGISTRY.get(kind)
    return adapter is not None and endpoint in adapter.endpoints


def formats(connection: Connection) -> frozenset[str]:
    """The endpoint formats a connection is served in (its kind's adapter, as the connection's
    options pick it)."""
    adapter = _REGISTRY.get(connection.kind)
    return adapter.variant(connection).endpoints if adapter is not None else frozenset()


def registered() -> dict[str, Adapter]:
    return dict(_REGISTRY)


@functools.lru_cache(maxsize=1024)  # a pure function of two strings, parsed twice per call uncached
def connection_url(base_url: str, path: str) -> str:
    """`path` (starting /v1/) under a connection's base URL. Joined as a URL, not a string: a
    query or fragment in a stored base URL is dropped, never allowed to turn the endpoint's path
    into a query string."""
    base = httpx.URL(base_url)
    # The path still percent-encoded: decoded, an escaped `?` or `#` in it (`/v1%3F`) is one
    # httpx refuses to put back into a path, and every call on the connection would fail.
    prefix = base.raw_path.decode("ascii").partition("?")[0].rstrip("/")
    if prefix.endswith("/v1"):  # accept the SDK-style base URL too
        prefix = prefix[: -len("/v1")]
    return str(base.copy_with(path=prefix + path, query=None, fragment=None))


def joined_url(base_url: str, path: str) -> str:
    """`path` (no leading slash) directly under a base URL's path, without adding /v1 (Azure's
    deployments, Gemini's OpenAI-compatible endpoint, Vertex's resource paths)."""
    base = httpx.URL(base_url)
    prefix = base.raw_path.decode("ascii").partition("?")[0].rstrip("/")
    return str(base.copy_with(raw_path=f"{prefix}/{path}".encode("ascii"), query=None, fragment=None))
