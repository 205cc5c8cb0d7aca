"""echo's job endpoints: files, batches (both providers), background responses and videos.

Entry point (for echo/transport.py, which hands it every call that is not a live answer):

    async def send(connection, method, path, *, body=None, files=None, data=None) -> httpx.Response

The arguments are the call's parts, as echo/transport.py reads them off the wire: `path` starts with
/v1/ (a query string, e.g. `?variant=thumbnail`, may follow), `body` is a JSON body, `files` and
`data` a multipart upload in httpx's form ({"file": (filename, content[, content_type])},
{"purpose": "batch"}; a `files` part whose filename is None is a plain field). It answers as
the provider would, as an httpx.Response: status, JSON or bytes, content-type; errors in the
provider's own shape (Anthropic's for /v1/messages/...).
Paths: POST /v1/files, GET|DELETE /v1/files/{id}, GET /v1/files/{id}/content; POST /v1/batches,
GET /v1/batches/{id}, POST /v1/batches/{id}/cancel; POST /v1/messages/batches, GET
/v1/messages/batches/{id}, POST .../cancel, GET .../results; POST /v1/responses (background or
not), GET|DELETE /v1/responses/{id}, POST .../cancel; POST /v1/videos, GET|DELETE
/v1/videos/{id}, GET /v1/videos/{id}/content.

A job is finished when it is created: the create call answers "validating" / "queued" /
"in_progress", every later read answers it completed with priced usage (token usage per line as
echo answers the same request live; a video bills its `seconds`), and a cancel, arriving after
the end, answers the finished job unchanged. The objects are kept in Redis (settings.REDIS_URL,
keys `capgate-echo:*`, for CAPGATE_ECHO_STORE_SECONDS: a day by default), so any worker process
can answer for a job another created (docs/decisions.md, 2026-12-01); one batch's output is at most
CAPGATE_ECHO_MAX_OUTPUT_BYTES (echo/batches.py), so no single job fills Redis.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from echo import batches as echo_batches
from echo import provider as echo
from gateway.admission.bounds import SHAPERS
from gateway.http.errors import GatewayError, bad_request, error_body
from gateway.http.routes import NoRoute, Route, RouteTable
from gateway.providers import connection_url

PREFIX = "capgate-echo:"
PURPOSES = {"assistants", "batch", "fine-tune", "vision", "user_data", "evals"}
SECONDS = ("4", "8", "12")
SIZES = ("720x1280", "1280x720", "1024x1792", "1792x1024")
VARIANTS = {
    "video": ("video/mp4", b"\x00\x00\x00\x18ftypmp42"),
    "thumbnail": ("image/webp", b"RIFF\x00\x00\x00\x00WEBP"),
    "spritesheet": ("image/jpeg", b"\xff\xd8\xff\xe0echo"),
}
Answer = tuple[int, Any, str]  # status, a JSON-able object or bytes, content type


class _Call:
    """One call: the connection's options, the request's parts, and the Redis client."""

    def __init__(
        self,
        connection: Any,
        r: aioredis.Redis,
        body: Any,
        files: dict | None,
        data: dict | None,
        query: dict[str, str],
    ) -> None:
        self.connection, self.opts, self.r = connection, dict(connection.options or {}), r
        self.body = body if isinstance(body, dict) else {}
        self.files, self.data, self.query = {}, dict(data or {}), query
        for name, part in (files or {}).items():  # a part without a filename is a plain field
            if isinstance(part, tuple) and part[0] is None:
                self.data[name] = part[1].decode() if isinstance(part[1], bytes) else str(part[1])
            else:
                self.files[name] = part

    async def put(self, key: str, value: Any) -> None:
        data = value if isinstance(value, bytes) else json.dumps(value)
        await self.r.set(PREFIX + key, data, ex=settings.CAPGATE["ECHO_STORE_SECONDS"])

    async def raw(self, key: str) -> bytes | None:
        return await self.r.get(PREFIX + key)

    async def obj(self, key: str, what: str, object_id: str) -> dict:
        raw = await self.raw(f"{key}:{object_id}")
        if raw is None:
            raise GatewayError(f"No such {what} object: {object_id}", code="not_found", status=404)
        return json.loads(raw)

    async def drop(self, *keys: str) -> None:
        await self.r.delete(*(PREFIX + k for k in keys))


# -- files ----------------------------------------------------------------------------------


async def _add_file(call: _Call, filename: str, purpose: str, content: bytes, file_id: str | None = None) -> dict:
    meta = {
        "id": file_id or f"file-{uuid.uuid4().hex[:24]}",
        "object": "file",
        "bytes": len(content),
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
    await call.put(f"file-data:{meta['id']}", content)
    await call.put(f"file:{meta['id']}", meta)
    return meta


async def file_create(call: _Call) -> Answer:
    upload, purpose = call.files.get("file"), call.data.get("purpose")
    if upload is None:
        raise bad_request("'file' is required.", param="file")
    if purpose not in PURPOSES:
        raise bad_request(f"'purpose' must be one of {sorted(PURPOSES)}.", param="purpose")
    content = upload[1].read() if hasattr(upload[1], "read") else upload[1]
    content = content.encode() if isinstance(content, str) else bytes(content)
    return (
        200,
        await _add_file(call, str(upload[0] or "upload"), str(purpose), content),
        "application/json",
    )


async def file_get(call: _Call, file_id: str) -> Answer:
    return 200, await call.obj("file", "File", file_id), "application/json"


async def file_content(call: _Call, file_id: str) -> Answer:
    await call.obj("file", "File", file_id)
    return 200, await call.raw(f"file-data:{file_id}") or b"", "application/octet-stream"


async def file_delete(call: _Call, file_id: str) -> Answer:
    await call.obj("file", "File", file_id)
    await call.drop(f"file:{file_id}", f"file-data:{file_id}")
    return 200, {"id": file_id, "object": "file", "deleted": True}, "application/json"


# -- batches --------------------------------------------------------------------------------


async def batch_create(call: _Call) -> Answer:
    file_id = str(call.body.get("input_file_id"))
    meta = await call.raw(f"file:{file_id}")
    content = await call.raw(f"file-data:{file_id}") or b""
    created, finished, outputs = echo_batches.openai_batch(
        call.opts,
        call.body,
        json.loads(meta) if meta else None,
        content,
        max_output_bytes=settings.CAPGATE["ECHO_MAX_OUTPUT_BYTES"],
    )
    for name, data in outputs.items():
        await _add_file(
            call,
            f"{created['id']}_{name}.jsonl",
            "batch_output",
            data,
            f"file-{created['id']}-{name}",
        )
    await call.put(f"batch:{created['id']}", finished)
    return 200, created, "application/json"


async def batch_get(call: _Call, batch_id: str) -> Answer:
    return 200, await call.obj("batch", "Batch", batch_id), "application/json"


async def message_batch_create(call: _Call) -> Answer:
    def results_url(bid: str) -> str:
        return connection_url(call.connection.base_url or "", f"/v1/messages/batches/{bid}/results")

    created, ended, results = echo_batches.message_batch(
        call.opts, call.body, results_url, max_output_bytes=settings.CAPGATE["ECHO_MAX_OUTPUT_BYTES"]
    )
    await call.put(f"msgbatch-results:{created['id']}", results)
    await call.put(f"msgbatch:{created['id']}", ended)
    return 200, created, "application/json"


async def message_batch_get(call: _Call, batch_id: str) -> Answer:
    return 200, await call.obj("msgbatch", "message batch", batch_id), "application/json"


async def message_batch_results(call: _Call, batch_id: str) -> Answer:
    await call.obj("msgbatch", "message batch", batch_id)
    return 200, await call.raw(f"msgbatch-results:{batch_id}") or b"", "application/x-jsonl"


# -- responses and videos -------------------------------------------------------------------


async def response_create(call: _Call) -> Answer:
    shape = SHAPERS["responses"](call.body)
    full = echo.echo_body(call.opts, "responses", call.body, shape.text_tokens)
    if not call.body.get("background"):
        return 200, full, "application/json"
    full["background"] = True
    await call.put(f"response:{full['id']}", full)
    return 200, {**full, "status": "queued", "output": [], "usage": None}, "application/json"


async def response_get(call: _Call, response_id: str) -> Answer:
    return 200, await call.obj("response", "Response", response_id), "application/json"


async def response_delete(call: _Call, response_id: str) -> Answer:
    await call.obj("response", "Response", response_id)
    await call.drop(f"response:{response_id}")
    return (
        200,
        {"id": response_id, "object": "response.deleted", "deleted": True},
        "application/json",
    )


async def video_create(call: _Call) -> Answer:
    fields = {**call.data, **call.body}
    prompt, seconds, size = (
        fields.get("prompt"),
        str(fields.get("seconds") or "4"),
        str(fields.get("size") or "720x1280"),
    )
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("'prompt' is required.", param="prompt")
    if seconds not in SECONDS:
        raise bad_request(f"'seconds' must be one of {list(SECONDS)}.", param="seconds")
    if size not in SIZES:
        raise bad_request(f"'size' must be one of {list(SIZES)}.", param="size")
    now = int(time.time())
    video = {
        "id": f"video_{uuid.uuid4().hex[:24]}",
        "object": "video",
        "created_at": now,
        "completed_at": now,
        "expires_at": now + 86400,
        "error": None,
        "model": str(fields.get("model") or "sora-2"),
        "prompt": prompt,
        "remixed_from_video_id": None,
        "seconds": seconds,
        "size": size,
        "status": "completed",
        "progress": 100,
    }
    await call.put(f"video:{video['id']}", video)
    return (
        200,
        {**video, "status": "queued", "progress": 0, "completed_at": None, "expires_at": None},
        "application/json",
    )


async def video_get(call: _Call, video_id: str) -> Answer:
    return 200, await call.obj("video", "Video", video_id), "application/json"


async def video_content(call: _Call, video_id: str) -> Answer:
    await call.obj("video", "Video", video_id)
    variant = call.query.get("variant") or "video"
    if variant not in VARIANTS:
        raise bad_request(f"'variant' must be one of {sorted(VARIANTS)}.", param="variant")
    content_type, magic = VARIANTS[variant]
    return 200, magic + video_id.encode(), content_type


async def video_delete(call: _Call, video_id: str) -> Answer:
    await call.obj("video", "Video", video_id)
    await call.drop(f"video:{video_id}")
    return 200, {"id": video_id, "object": "video.deleted", "deleted": True}, "application/json"


Handler = Callable[..., Awaitable[Answer]]
# Declared like the gateway's own routes (gateway/http/routes.py); an id is any run of id characters.
ROUTES: RouteTable[Handler] = RouteTable(
    [
        Route("POST", "/v1/files", file_create),
        Route("GET", "/v1/files/{file_id:token}", file_get),
        Route("GET", "/v1/files/{file_id:token}/content", file_content),
        Route("DELETE", "/v1/files/{file_id:token}", file_delete),
        Route("POST", "/v1/batches", batch_create),
        Route("GET", "/v1/batches/{batch_id:token}", batch_get),
        Route("POST", "/v1/batches/{batch_id:token}/cancel", batch_get),  # finished already: answered unchanged
        Route("POST", "/v1/messages/batches", message_batch_create),
        Route("GET", "/v1/messages/batches/{batch_id:token}", message_batch_get),
        Route("POST", "/v1/messages/batches/{batch_id:token}/cancel", message_batch_get),
        Route("GET", "/v1/messages/batches/{batch_id:token}/results", message_batch_results),
        Route("POST", "/v1/responses", response_create),
        Route("GET", "/v1/responses/{response_id:token}", response_get),
        Route("POST", "/v1/responses/{response_id:token}/cancel", response_get),
        Route("DELETE", "/v1/responses/{response_id:token}", response_delete),
        Route("POST", "/v1/videos", video_create),
        Route("GET", "/v1/videos/{video_id:token}", video_get),
        Route("GET", "/v1/videos/{video_id:token}/content", video_content),
        Route("DELETE", "/v1/videos/{video_id:token}", video_delete),
    ]
)


def _route(method: str, path: str) -> tuple[Handler, tuple[str, ...]]:
    try:
        route, match = ROUTES.resolve(method, path)
    except NoRoute:
        raise GatewayError(f"echo has no endpoint {method} {path}", code="unknown_url", status=404) from None
    return route.handler, match.groups()


_stores: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}


def _store() -> aioredis.Redis:
    """This event loop's Redis client: one pool of a few connections shared by every call (a new
    client per call opened one connection per upload, and 500 uploads at once timed out)."""
    loop = asyncio.get_running_loop()
    found = _stores.get(loop)
    if found is None:
        for stale in [other for other in _stores if other.is_closed()]:
            del _stores[stale]
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL,
            max_connections=32,
            timeout=10,
            socket_timeout=10,
            socket_connect_timeout=5,
            **settings.REDIS_SOCKET_HEALTH,
        )
        found = _stores[loop] = aioredis.Redis(connection_pool=pool)
    return found


async def drop_idle() -> None:
    """Close this event loop's idle job-store connections (gateway/upstream/runtime.py, periodically)."""
    found = _stores.get(asyncio.get_running_loop())
    if found is not None:
        await found.connection_pool.disconnect(inuse_connections=False)


async def send(
    connection: Any,
    method: str,
    path: str,
    *,
    body: Any = None,
    files: dict | None = None,
    data: dict | None = None,
) -> httpx.Response:
    """Answer one job-endpoint call on an echo connection as the provider would (module docstring)."""
    path, _, qs = path.partition("?")
    flavor = "anthropic" if path.startswith("/v1/messages") else "openai"
    try:
        handler, ids = _route(method.upper(), path)
        call = _Call(connection, _store(), body, files, data, {k: v[-1] for k, v in parse_qs(qs).items()})
        status, content, content_type = await handler(call, *ids)
    except GatewayError as exc:
        status, content, content_type = (
            exc.status,
            error_body(exc, flavor=flavor),
            "application/json",
        )
    except RedisError as exc:
        # Redis went away (or restarted): close the idle sockets at once, so none lingers
        # half-closed in the pool; the next call connects afresh.
        await _store().connection_pool.disconnect(inuse_connections=False)
        unavailable = GatewayError(
            f"echo's job store is unavailable: {type(exc).__name__}", code="unavailable", status=503
        )
        status, content, content_type = (
            503,
            error_body(unavailable, flavor=flavor),
            "application/json",
        )
    if not isinstance(content, bytes):
        content = json.dumps(content).encode()
    return httpx.Response(status, content=content, headers={"content-type": content_type})
