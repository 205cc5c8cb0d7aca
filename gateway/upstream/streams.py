"""Streamed calls (SSE): open the upstream stream, relay its events to the client,
and record once when it ends however it ends (gateway/upstream/proxy.py drives the attempt)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from gateway.admission.service import Target
from gateway.http.request import ClientGone
from gateway.providers import adapter
from gateway.translate import stream_translator
from gateway.upstream import runtime
from gateway.upstream.transport import client
from ledger.recording import Outcome

if TYPE_CHECKING:
    from gateway.upstream.proxy import ProxyCall

NOT_BILLED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass
class Attempt:
    """The result of trying one target."""

    kind: str  # ok | failover | not_billed | unknown
    status: int = 0
    body: bytes = b""
    error: str = ""


async def stream_attempt(call: ProxyCall, target: Target, up_body: dict) -> Attempt:
    """Try one target with a streamed call: relay it to the client, or say why not."""
    upstream_client = client()
    try:
        # The adapter may fetch a credential first (a refused one is not billed either).
        up = await call.until_client_leaves(
            adapter(target).request(target, call.format_of(target), up_body, call.headers_for(target), stream=True)
        )
        request = upstream_client.build_request(
            "POST", up.url, content=up.content, headers=up.headers, extensions=call.upstream_tag(target)
        )
        response = await call.until_client_leaves(upstream_client.send(request, stream=True))
    except NOT_BILLED as exc:
        return Attempt(kind="failover", error=f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        return Attempt(kind="unknown", error=f"{type(exc).__name__}: {exc}")
    if response.status_code >= 400:
        data = await response.aread()
        await response.aclose()
        status = response.status_code
        if status >= 500 or status == 429:
            return Attempt(kind="failover", status=status, body=data, error=f"upstream status {status}")
        return Attempt(kind="not_billed", status=status, body=data, error=f"upstream rejected: {status}")
    events = adapter(target).events(response, call.format_of(target))
    runtime.health.succeeded(target.connection.id)
    await relay(call, target, events, response)
    return Attempt(kind="done")


async def relay(call: ProxyCall, target: Target, events, response: httpx.Response) -> None:
    """Relay SSE events to the client until the stream ends, the client leaves, the
    upstream drops, or the request's hard lifetime runs out; then record once. A target of the
    other format is billed from its own events and relayed in the endpoint's (gateway/translate/)."""
    p = call.admission
    assert p is not None
    kind = call.format_of(target)
    tracker = adapter(target).stream_usage(kind)
    wants_usage = call.client_stream_options.get("include_usage") is True
    translator = (
        stream_translator(client=call.kind, upstream=kind, wants_usage=wants_usage, request=call.body)
        if kind != call.kind
        else None
    )
    ending = "completed"
    deadline = call.seconds_left()

    async def pump() -> None:
        async for event in events:
            try:
                usage_only = tracker.feed(event.data)
            except ValueError:
                usage_only = False
            if translator is not None:
                for raw in translator.feed(event.data):
                    await call.req.send({"type": "http.response.body", "body": raw + b"\n\n", "more_body": True})
                continue
            if usage_only and not wants_usage:
                continue
            await call.req.send({"type": "http.response.body", "body": event.raw + b"\n\n", "more_body": True})
        for raw in translator.end() if translator is not None else []:
            await call.req.send({"type": "http.response.body", "body": raw + b"\n\n", "more_body": True})

    await call.req.start(
        200, [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *call.capgate_headers()]
    )
    try:
        async with asyncio.timeout(deadline):
            await call.until_client_leaves(pump())
    except ClientGone:
        ending = "client disconnected mid-stream"
    except TimeoutError:
        ending = "request reached its maximum lifetime"
    except httpx.HTTPError as exc:
        ending = f"upstream stream broke: {type(exc).__name__}"
    except OSError:
        ending = "client connection lost"
    finally:
        await response.aclose()
    if ending == "completed" and tracker.usage is None:
        ending = "stream ended without usage"
    # Usage that arrived is the provider's final word even if the client left afterwards.
    usage = tracker.usage
    await call.record(
        call.served_outcome(target, usage, tracker.model, error=ending)
        if usage is not None
        else Outcome(status="estimated", cost_nano=p.worst_nano, connection_id=target.connection.id, error=ending),
        target,
    )
    if call.kind == "responses" and kind == "responses" and tracker.response is not None:
        await call.remember_response(target, tracker.response)
    if call.kind == "messages" and kind == "messages" and usage is not None and ending == "completed":
        await call.remember_message(target, tracker.message_id, usage)
    if ending != "client disconnected mid-stream":
        try:
            await call.req.send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass
