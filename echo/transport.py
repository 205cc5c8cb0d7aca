"""echo on the wire: an httpx transport the gateway's upstream client hands every call on a
connection of kind "echo" to (registered at app ready, gateway/upstream/transport.py). The
request path sends to echo exactly what it sends to any provider; echo answers in-process:

- POST /v1/chat/completions, /v1/messages, /v1/embeddings, /v1/responses: a live answer
  (echo/provider.py), streamed as server-sent events when the body asks for a stream;
- a background response and every job endpoint: echo/jobs.py;
- a stored response echo does not keep (it keeps only background ones): answered as a provider
  that stored it would.

Fault injection for capcheck and the tests lives here too: on a connection whose options set
`allow_fault_headers`, a caller's `x-capgate-echo-fail: <status>` header makes echo answer that
status (500 unless a number) with no body, as a failing provider would, before any work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from core.strict import ascii_int
from echo import jobs as echo_jobs
from echo import provider
from gateway.upstream.transport import CALL, Call, InProcess
from jobs.files import parse_multipart

FAULT_HEADER = "x-capgate-echo-fail"
LIVE = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
STORED_SUFFIXES = {"": "get", "/cancel": "cancel", "/input_items": "input_items"}


class EchoTransport(InProcess):
    """Answers an echo connection's calls in-process, as the provider would on the wire."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call: Call = request.extensions[CALL]
        fault = _fault(call)
        if fault is not None:
            return httpx.Response(fault, content=b"", request=request)
        raw = await request.aread()
        path = request.url.path
        kind = LIVE.get(path) if request.method == "POST" else None
        if kind is not None:
            body = json.loads(raw)
            if not (kind == "responses" and body.get("background") is True):
                return await _live(request, call, kind, body)
        query = request.url.query.decode("ascii")
        target = f"{path}?{query}" if query else path
        body, files, data = _parts(request, raw)
        answer = await echo_jobs.send(call.connection, request.method, target, body=body, files=files, data=data)
        if answer.status_code == 404 and path.startswith("/v1/responses/"):
            answer = _stored(request.method, path) or answer
        answer.request = request
        return answer

    async def drop_idle(self) -> None:
        await echo_jobs.drop_idle()


def _fault(call: Call) -> int | None:
    # Honoured only on echo connections that opt in: never on a provider, never by default.
    fault = call.client_headers.get(FAULT_HEADER)
    if not fault or not call.connection.options.get("allow_fault_headers"):
        return None
    status = ascii_int(fault)
    return 500 if status is None else status


async def _live(request: httpx.Request, call: Call, kind: str, body: dict) -> httpx.Response:
    opts = call.connection.options
    if body.get("stream") is True:
        events = provider.echo_stream(opts, kind, body, call.input_tokens)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_SSE(events), request=request)
    content = await provider.echo_response(opts, kind, body, call.input_tokens)
    return httpx.Response(200, headers={"content-type": "application/json"}, content=content, request=request)


class _SSE(httpx.AsyncByteStream):
    """echo's events on the wire: each event, then the blank line that ends it."""

    def __init__(self, events: AsyncIterator[provider.SSEEvent]):
        self.events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for event in self.events:
            yield event.raw + b"\n\n"

    async def aclose(self) -> None:
        closing = getattr(self.events, "aclose", None)
        if closing is not None:
            await closing()


def _parts(request: httpx.Request, raw: bytes) -> tuple[Any, dict | None, dict | None]:
    """The call's JSON body, or its multipart upload as files and fields (echo/jobs.py's form)."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        files: dict = {}
        data: dict = {}
        for name, (filename, payload) in parse_multipart(content_type, raw).items():
            if filename is None:
                data[name] = payload.decode()
            else:
                files[name] = (filename, payload)
        return None, files, data
    if not raw:
        return None, None, None
    try:
        return json.loads(raw), None, None
    except ValueError:
        return None, None, None


def _stored(method: str, path: str) -> httpx.Response | None:
    """A live response echo served and did not keep, read, cancelled or deleted: answered as a
    provider that stored it would."""
    rest = path[len("/v1/responses/") :]
    response_id, _, suffix = rest.partition("/")
    suffix = f"/{suffix}" if suffix else ""
    data: dict
    if method == "DELETE" and not suffix:
        data = {"id": response_id, "object": "response.deleted", "deleted": True}
    elif method == "POST" and suffix == "/cancel":
        data = {"id": response_id, "object": "response", "status": "cancelled"}
    elif method == "GET" and suffix == "/input_items":
        data = {"object": "list", "data": [], "has_more": False}
    elif method == "GET" and not suffix:
        data = {"id": response_id, "object": "response", "status": "completed"}
    else:
        return None
    return httpx.Response(200, headers={"content-type": "application/json"}, content=json.dumps(data).encode())
