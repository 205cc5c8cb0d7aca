"""Background responses and videos in the fake upstream (job state: tests/upstream/jobs.py).

Background responses: ``POST /v1/responses`` with ``background: true`` answers "queued"; the
completed Response (usage as the fake computes it for that request) shows once the job completes.
``cancel`` ends an unfinished response "cancelled" at once, as the provider does, billing nothing
unless the control plane says ``{"state": "cancelled", "done": 1}``; expired and failed answer
"failed" without usage.

Videos: ``POST /v1/videos`` (multipart, as the SDK sends it, or JSON) answers "queued"; a
completed video bills its ``seconds``; cancelled, expired and failed videos answer "failed" (with
``error.code`` "cancelled", "expired" or "generation_failed") and bill nothing. ``content`` serves
a few fixed bytes per variant.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .batches import page
from .files import ApiError
from .jobs import RENDER, Job, JobStore, Line

SECONDS = ("4", "8", "12")
SIZES = ("720x1280", "1280x720", "1024x1792", "1792x1024")
VARIANTS = {
    "video": ("video/mp4", b"\x00\x00\x00\x18ftypmp42"),
    "thumbnail": ("image/webp", b"RIFF\x00\x00\x00\x00WEBP"),
    "spritesheet": ("image/jpeg", b"\xff\xd8\xff\xe0fake"),
}


# -- background responses -------------------------------------------------------------------


async def create_response(store: JobStore, ex: Any, response: dict[str, Any]) -> None:
    """Called by server.py's Responses handler with the response it would have answered."""
    job = Job(
        id=response["id"],
        kind="response",
        auto=bool(ex.knobs["job_auto_complete"]),
        lines=[Line(custom_id=response["id"], status=200, body=response)],
    )
    store.add(job)
    await ex.json(200, store.render(job, "create"))


def render_response(store: JobStore, job: Job, when: str) -> dict[str, Any]:
    full = job.lines[0].body
    obj = {**full, "background": True, "output": [], "usage": None, "error": None}
    if when == "create":
        return obj | {"status": "queued"}
    if job.state == "in_progress":
        return obj | {"status": "in_progress"}
    if job.state == "completed":
        return {**full, "background": True, "error": None}
    if job.state == "cancelled":
        return obj | {"status": "cancelled", "usage": full.get("usage") if job.billed() else None}
    message = (
        "The background response expired before it ran."
        if job.state == "expired"
        else "The fake provider failed the background response."
    )
    return obj | {"status": "failed", "error": {"code": "server_error", "message": message}}


async def retrieve_response(store: JobStore, ex: Any, job_id: str) -> None:
    await ex.json(200, store.render(store.read(job_id, "response")))


async def cancel_response(store: JobStore, ex: Any, job_id: str) -> None:
    job = store.lookup(job_id, "response")
    if job.state == "in_progress":
        job.cancel_at = int(time.time())
        job.finish("cancelled", 0)
    await ex.json(200, store.render(job))


async def delete_response(store: JobStore, ex: Any, job_id: str) -> None:
    store.lookup(job_id, "response").deleted = True
    await ex.json(200, {"id": job_id, "object": "response", "deleted": True})


# -- videos ---------------------------------------------------------------------------------


async def create_video(store: JobStore, ex: Any) -> None:
    body = ex.body
    prompt = body.get("prompt")
    seconds = str(body.get("seconds") or "4")
    size = str(body.get("size") or "720x1280")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt is required")
    if seconds not in SECONDS:
        raise ApiError(400, f"seconds must be one of {list(SECONDS)}")
    if size not in SIZES:
        raise ApiError(400, f"size must be one of {list(SIZES)}")
    vid = f"video_{uuid.uuid4().hex[:24]}"
    job = Job(
        id=vid,
        kind="video",
        auto=bool(ex.knobs["job_auto_complete"]),
        lines=[Line(custom_id=vid, status=200, body={})],
        data={
            "prompt": prompt,
            "model": str(body.get("model") or "sora-2"),
            "seconds": seconds,
            "size": size,
        },
    )
    store.add(job)
    await ex.json(200, store.render(job, "create"))


def render_video(store: JobStore, job: Job, when: str) -> dict[str, Any]:
    d = job.data
    obj: dict[str, Any] = {
        "id": job.id,
        "object": "video",
        "created_at": job.created_at,
        "completed_at": None,
        "expires_at": None,
        "error": None,
        "model": d["model"],
        "prompt": d["prompt"],
        "remixed_from_video_id": None,
        "seconds": d["seconds"],
        "size": d["size"],
        "status": "queued",
        "progress": 0,
    }
    if when == "create":
        return obj
    if job.state == "in_progress":
        return obj | {"status": "in_progress", "progress": 50}
    if job.state == "completed":
        ended = job.ended_at or job.created_at
        return obj | {
            "status": "completed",
            "progress": 100,
            "completed_at": ended,
            "expires_at": ended + 3600,
        }
    code = {"cancelled": "cancelled", "expired": "expired"}.get(job.state, "generation_failed")
    return obj | {
        "status": "failed",
        "error": {"code": code, "message": f"The video job ended: {code}."},
    }


async def retrieve_video(store: JobStore, ex: Any, job_id: str) -> None:
    await ex.json(200, store.render(store.read(job_id, "video")))


async def video_content(store: JobStore, ex: Any, job_id: str) -> None:
    job = store.read(job_id, "video")
    variant = ex.query.get("variant") or "video"
    if variant not in VARIANTS:
        raise ApiError(400, f"variant must be one of {sorted(VARIANTS)}")
    if job.state != "completed":
        raise ApiError(400, f"Video {job_id} is not ready: its status is {store.render(job)['status']}.")
    content_type, magic = VARIANTS[variant]
    data = magic + job.id.encode()
    await ex.start(200, content_type, (b"content-length", b"%d" % len(data)))
    await ex.body_chunk(data)


async def delete_video(store: JobStore, ex: Any, job_id: str) -> None:
    store.lookup(job_id, "video").deleted = True
    await ex.json(200, {"id": job_id, "object": "video.deleted", "deleted": True})


async def list_videos(store: JobStore, ex: Any) -> None:
    jobs = [j for j in reversed(store.jobs.values()) if j.kind == "video" and not (j.gone or j.deleted)]
    await ex.json(200, page(ex, [store.render(j) for j in jobs]))


RENDER["response"] = render_response
RENDER["video"] = render_video
