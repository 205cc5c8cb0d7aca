"""Amazon Bedrock, Claude's Messages body on InvokeModel / InvokeModelWithResponseStream (a
connection with `options.api: "converse"` speaks the Converse API instead:
gateway/providers/bedrock_converse.py).

- URL: `https://bedrock-runtime.{region}.amazonaws.com/model/{model id}/invoke` (or
  `/invoke-with-response-stream`), the region from the connection's options; a base URL on the
  connection replaces the host (a VPC endpoint, the test fake).
- Body: the client's Messages body without `model` and `stream` (the path says both), with
  `anthropic_version: bedrock-2023-05-31` and the client's `anthropic-beta` values as
  `anthropic_beta`.
- Auth: SigV4 over the whole request (botocore's SigV4Auth). Keys come from the connection's
  encrypted secret (`{"access_key_id", "secret_access_key", "session_token"?}`); without keys,
  botocore's credential chain (environment, the `profile` option, the instance role) — only where
  the operator allows it (CAPGATE["BEDROCK_AMBIENT_CREDENTIALS"]): the gateway's own role is the
  operator's account, never a tenant's to spend.
- Answer: Anthropic's message JSON; a stream is the AWS event stream
  (application/vnd.amazon.eventstream) whose `chunk` events carry Anthropic's stream events,
  base64 in `bytes`. It is decoded with botocore's EventStreamBuffer and relayed to the client as
  Anthropic SSE. Usage is Anthropic's (message_start / message_delta); the last event's
  `amazon-bedrock-invocationMetrics` fills in counts a stream did not report.

botocore is imported where a Bedrock connection first needs it, not with this module: a worker
that routes to no Bedrock connection does not hold it (about 6 MiB, docs/performance.md).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from django.conf import settings

from catalog.kinds import aws_keys
from catalog.pricing import Usage
from core.guards import Guards
from gateway.providers.anthropic import beta_headers
from gateway.providers.base import Adapter, UpstreamRequest, register
from gateway.providers.sse import SSEEvent
from gateway.providers.usage import StreamUsage

if TYPE_CHECKING:
    from botocore.credentials import Credentials, ReadOnlyCredentials

    from catalog.models import Connection
    from gateway.admission.routing import Target

BEDROCK_VERSION = "bedrock-2023-05-31"
EVENT_STREAM = "application/vnd.amazon.eventstream"


# Removal test: tests/gateway/test_bedrock.py.
GUARDS = Guards(
    lend_only_where_allowed=(
        "a connection without its own keys is signed with the gateway's credential chain only where the operator "
        "lends it; without it a tenant's keyless connection spends the operator's AWS account"
    ),
)


class CredentialsMissing(httpx.ConnectError):
    """No AWS credentials for the connection: nothing was sent (not billed), and the next
    connection of the route is tried."""


@functools.lru_cache(maxsize=64)
def _chain(profile: str | None) -> Any:
    """botocore's credential chain for a profile (refreshable credentials refresh themselves)."""
    from botocore.session import Session

    return Session(profile=profile).get_credentials()


def _frozen_chain(profile: str | None) -> ReadOnlyCredentials | None:
    found = _chain(profile)
    return found.get_frozen_credentials() if found is not None else None


class Bedrock(Adapter):
    endpoints = frozenset({"messages"})

    def host(self, target: Target) -> str:
        base = target.connection.base_url
        if base:
            return base.rstrip("/")
        return f"https://bedrock-runtime.{target.connection.options.get('region')}.amazonaws.com"

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        action = "invoke-with-response-stream" if stream else "invoke"
        return f"{self.host(target)}/model/{quote(self.model_id(target), safe=':')}/{action}"

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        return {k: v for k, v in body.items() if k not in ("model", "stream")} | {"anthropic_version": BEDROCK_VERSION}

    async def credentials(self, target: Target) -> Credentials | ReadOnlyCredentials:
        from botocore.credentials import Credentials

        keys = aws_keys(target.connection.plain_secret)
        if keys is not None:
            return Credentials(keys["access_key_id"], keys["secret_access_key"], keys.get("session_token") or None)
        if GUARDS.lend_only_where_allowed and not settings.CAPGATE["BEDROCK_AMBIENT_CREDENTIALS"]:
            raise CredentialsMissing("this Bedrock connection has no keys, and lending the gateway's own is off")
        # The chain may read files or ask the instance metadata service: off the event loop.
        found = await asyncio.to_thread(_frozen_chain, target.connection.options.get("profile") or None)
        if found is None:
            raise CredentialsMissing("no AWS credentials found in the gateway's credential chain")
        return found

    async def request(
        self, target: Target, endpoint: str, body: dict, client_headers: dict[str, str], *, stream: bool
    ) -> UpstreamRequest:
        shaped = self.body(target, endpoint, body, stream=stream)
        betas = beta_headers(client_headers).get("anthropic-beta")
        if betas:
            shaped["anthropic_beta"] = [b.strip() for b in betas.split(",") if b.strip()]
        return await self.signed(target, self.url(target, endpoint, stream=stream), shaped, client_headers, stream)

    async def signed(
        self, target: Target, url: str, body: dict, client_headers: dict[str, str], stream: bool
    ) -> UpstreamRequest:
        """The POST of `body` to `url`, SigV4-signed over the whole request."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        content = json.dumps(body).encode()
        headers = {
            "content-type": "application/json",
            "accept": EVENT_STREAM if stream else "application/json",
            "accept-encoding": "identity",
        }
        if target.connection.options.get("forward_test_headers"):
            headers |= {k: v for k, v in client_headers.items() if k.startswith("x-upstream-")}
        signed = AWSRequest(method="POST", url=url, data=content, headers=headers)
        credentials = await self.credentials(target)
        SigV4Auth(credentials, "bedrock", target.connection.options.get("region")).add_auth(signed)
        return UpstreamRequest(url=url, content=content, headers=dict(signed.headers.items()))

    def variant(self, connection: Connection) -> Adapter:
        """A connection with `options.api: "converse"` speaks the Converse API (any Bedrock
        model); otherwise Claude's Messages body on InvokeModel."""
        if connection.options.get("api") == "converse":
            # Imported here: the Converse adapter is a subclass of this one.
            from gateway.providers.bedrock_converse import CONVERSE

            return CONVERSE
        return self

    def events(self, response: httpx.Response, endpoint: str) -> AsyncIterator[SSEEvent]:
        return decode_event_stream(response.aiter_raw())

    def stream_usage(self, endpoint: str) -> StreamUsage:
        return BedrockStreamUsage(endpoint)


async def decode_event_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[SSEEvent]:
    """Bedrock's event stream as Anthropic SSE events. A `chunk` carries one Anthropic event
    (base64 JSON in `bytes`); an exception message becomes Anthropic's `error` event, after
    which the stream is over (its usage incomplete: charged at the worst case)."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    async for chunk in chunks:
        buffer.add_data(chunk)
        for message in buffer:
            headers = message.headers
            kind = headers.get(":message-type")
            if kind == "event" and headers.get(":event-type") == "chunk":
                payload = json.loads(message.payload)
                data = base64.b64decode(payload["bytes"])
                name = json.loads(data).get("type", "message")
                yield SSEEvent(raw=b"event: " + str(name).encode() + b"\ndata: " + data, data=data)
            elif kind in ("exception", "error"):
                error_type = headers.get(":exception-type") or headers.get(":error-code") or "api_error"
                try:
                    text = json.loads(message.payload).get("message") or ""
                except ValueError:
                    text = message.payload.decode("utf-8", "replace")
                data = json.dumps({"type": "error", "error": {"type": error_type, "message": text}}).encode()
                yield SSEEvent(raw=b"event: error\ndata: " + data, data=data)
                return


class BedrockStreamUsage(StreamUsage):
    """Anthropic's stream usage, completed from Bedrock's invocation metrics on the last event
    when a count is missing there (the larger of the two is kept: the safe direction)."""

    def feed(self, data: bytes) -> bool:
        usage_only = super().feed(data)
        if b"amazon-bedrock-invocationMetrics" in data:
            metrics = json.loads(data).get("amazon-bedrock-invocationMetrics")
            if isinstance(metrics, dict):
                self.usage = _with_metrics(self.usage, metrics)
        return usage_only


def _metric(metrics: dict, key: str) -> int:
    value = metrics.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _with_metrics(usage: Usage | None, metrics: dict) -> Usage:
    base = usage or Usage()
    return Usage(
        input_tokens=max(base.input_tokens, _metric(metrics, "inputTokenCount")),
        output_tokens=max(base.output_tokens, _metric(metrics, "outputTokenCount")),
        cache_read_tokens=max(base.cache_read_tokens, _metric(metrics, "cacheReadInputTokenCount")),
        cache_write_tokens=max(
            base.cache_write_tokens, _metric(metrics, "cacheWriteInputTokenCount") - base.cache_write_1h_tokens
        ),
        cache_write_1h_tokens=base.cache_write_1h_tokens,
        web_search_requests=base.web_search_requests,
        service_tier=base.service_tier,
        unpriced=base.unpriced,
    )


register("bedrock", Bedrock())
