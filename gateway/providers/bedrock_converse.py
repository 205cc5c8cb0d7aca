"""Amazon Bedrock's Converse API: one request format for every Bedrock model (Llama, Mistral,
Nova, Claude, ...). A `bedrock` connection with `options.api: "converse"` is called through
this adapter (Bedrock.variant); its endpoint format is "converse", which no client endpoint
speaks, so every request reaching it is translated (gateway/translate/converse.py).

- URL: `{host}/model/{model id}/converse`, or `/converse-stream` (the host as InvokeModel's).
- Body: the translated Converse body without `model` and `stream` (the path says both); an
  output ceiling the gateway injects goes in `inferenceConfig.maxTokens`.
- Auth: SigV4 over the whole request, as InvokeModel's (gateway/providers/bedrock.py).
- Answer: Converse's JSON (`output.message`, `stopReason`, `usage`); a stream is the AWS event
  stream whose messages are named by `:event-type` (messageStart, contentBlockStart,
  contentBlockDelta, contentBlockStop, messageStop, metadata) and carry that event's JSON. Each
  becomes one event `{name: payload}` (boto3's shape); an exception message becomes
  `{exceptionName: {"message": ...}}`, after which the stream is over.
- Usage: `usage` (the metadata event when streamed): inputTokens (without cache reads and
  writes), outputTokens, cacheReadInputTokens, cacheWriteInputTokens (1-hour writes from
  cacheDetails), at the `serviceTier` the answer reports.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from catalog.pricing import Usage
from gateway.providers.base import UpstreamRequest
from gateway.providers.bedrock import Bedrock
from gateway.providers.sse import SSEEvent
from gateway.providers.usage import StreamUsage

if TYPE_CHECKING:
    from gateway.admission.routing import Target

FORMAT = "converse"
# The top-level field an injected output ceiling arrives in; the body moves it into inferenceConfig.
CEILING = "maxTokens"


def _count(d: object, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_converse(u: object, tier: object = None) -> Usage | None:
    if not isinstance(u, dict):
        return None
    writes = _count(u, "cacheWriteInputTokens")
    details = u.get("cacheDetails")
    one_hour = (
        sum(_count(d, "inputTokens") for d in details if isinstance(d, dict) and d.get("ttl") == "1h")
        if isinstance(details, list)
        else 0
    )
    one_hour = min(one_hour, writes)
    served = tier.get("type") if isinstance(tier, dict) else None
    return Usage(
        input_tokens=_count(u, "inputTokens"),
        output_tokens=_count(u, "outputTokens"),
        cache_read_tokens=_count(u, "cacheReadInputTokens"),
        cache_write_tokens=writes - one_hour,
        cache_write_1h_tokens=one_hour,
        service_tier=served if isinstance(served, str) else None,
    )


class BedrockConverse(Bedrock):
    endpoints = frozenset({FORMAT})

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        action = "converse-stream" if stream else "converse"
        return f"{self.host(target)}/model/{quote(self.model_id(target), safe=':')}/{action}"

    def output_param(self, target: Target, endpoint: str) -> str:
        return CEILING

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        out = {k: v for k, v in body.items() if k not in ("model", "stream", CEILING)}
        if CEILING in body:
            out["inferenceConfig"] = {**(body.get("inferenceConfig") or {}), "maxTokens": body[CEILING]}
        return out

    async def request(
        self, target: Target, endpoint: str, body: dict, client_headers: dict[str, str], *, stream: bool
    ) -> UpstreamRequest:
        shaped = self.body(target, endpoint, body, stream=stream)
        return await self.signed(target, self.url(target, endpoint, stream=stream), shaped, client_headers, stream)

    def usage_from_body(self, endpoint: str, data: bytes) -> tuple[Usage | None, str]:
        try:
            parsed = json.loads(data)
        except ValueError:
            return None, ""
        if not isinstance(parsed, dict):
            return None, ""
        return usage_converse(parsed.get("usage"), parsed.get("serviceTier")), ""

    def events(self, response: httpx.Response, endpoint: str) -> AsyncIterator[SSEEvent]:
        return decode_converse_stream(response.aiter_raw())

    def stream_usage(self, endpoint: str) -> StreamUsage:
        return ConverseStreamUsage(endpoint)


async def decode_converse_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[SSEEvent]:
    """Converse's event stream as one event per message, `{name: payload}`."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    async for chunk in chunks:
        buffer.add_data(chunk)
        for message in buffer:
            headers = message.headers
            kind = headers.get(":message-type")
            if kind == "event":
                try:
                    payload = json.loads(message.payload or b"{}")
                except ValueError:
                    continue
                data = json.dumps({str(headers.get(":event-type")): payload}).encode()
                yield SSEEvent(raw=b"data: " + data, data=data)
            elif kind in ("exception", "error"):
                name = str(headers.get(":exception-type") or headers.get(":error-code") or "internalServerException")
                try:
                    text = json.loads(message.payload).get("message") or ""
                except (ValueError, AttributeError):
                    text = message.payload.decode("utf-8", "replace")
                name = name[:1].lower() + name[1:]
                if not name.endswith("Exception"):
                    name += "Exception"
                data = json.dumps({name: {"message": text}}).encode()
                yield SSEEvent(raw=b"data: " + data, data=data)
                return


class ConverseStreamUsage(StreamUsage):
    """The usage of the metadata event, which ends a Converse stream."""

    def feed(self, data: bytes) -> bool:
        if data.startswith(b'{"metadata"'):
            metadata = json.loads(data).get("metadata") or {}
            usage = usage_converse(metadata.get("usage"), metadata.get("serviceTier"))
            if usage is not None:
                self.usage = usage
        return False


CONVERSE = BedrockConverse()
CONVERSE.kind = "bedrock"
