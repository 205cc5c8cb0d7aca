"""Provider jobs in the fake upstream: their state, what they bill, and the control plane.

A job is an OpenAI batch, an Anthropic message batch, a background response or a video. What a
job would bill is fixed when it is created: every batch line is run through the same handler (and
the same knobs, including ``X-Upstream-*`` headers on the create request) that would answer it as
a plain request, so a line's usage is exactly what the fake reports for that request today.

State (the control plane, tests only):
- a new job stays in progress until ``POST /_control/jobs/{id}`` moves it, or, when the knob
  ``job_auto_complete`` was on at creation, until its first status read (which completes it, or
  cancels it if a cancel was requested);
- ``done`` = how many lines finished before a cancel or expiry (billed when they succeeded);
  completed bills every line; failed bills nothing;
- ``gone`` makes every read of the job 404 until another state is set.
``GET /_control/jobs`` lists each job with what it billed (``billed``: token totals, video
seconds, and the per-line usage objects).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .files import ApiError, FileStore

STATES = ("in_progress", "completed", "cancelled", "expired", "failed", "gone")
FINAL = {"completed", "cancelled", "expired", "failed"}


@dataclass
class Line:
    custom_id: str
    status: int  # the status the fake answered the line's request with
    body: dict[str, Any]  # the response body (or error body)


@dataclass
class Job:
    id: str
    kind: str  # "batch" | "message_batch" | "response" | "video"
    auto: bool  # job_auto_complete was on when it was created
    lines: list[Line]
    data: dict[str, Any] = field(default_factory=dict)
    created_at: int = field(default_factory=lambda: int(time.time()))
    state: str = "in_progress"
    done: int = 0
    gone: bool = False
    deleted: bool = False
    cancel_at: int | None = None  # when the client asked to cancel
    ended_at: int | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # batch validation errors

    def finished(self) -> int:
        """How many lines reached an outcome (succeeded or errored) before the job ended."""
        if self.state == "completed":
            return len(self.lines)
        if self.state in ("cancelled", "expired") and self.kind in ("batch", "message_batch"):
            return min(self.done, len(self.lines))
        if self.state == "cancelled" and self.kind == "response":
            return min(self.done, 1)
        return 0

    def billed(self) -> list[Line]:
        """The lines the provider billed: the finished ones that succeeded."""
        return [line for line in self.lines[: self.finished()] if line.status == 200]

    def finish(self, state: str, done: int | None = None) -> None:
        if state not in FINAL:
            raise ValueError(state)
        if self.state not in FINAL:
            self.ended_at = int(time.time())
        self.state = state
        self.done = (len(self.lines) if state == "completed" else 0) if done is None else done


def line_usage(kind: str, line: Line) -> tuple[int, int]:
    """(input, output) tokens of a billed line, however its provider names them."""
    if kind == "video":
        return 0, 0
    u = line.body.get("usage") or {}
    return int(u.get("prompt_tokens", u.get("input_tokens", 0))), int(
        u.get("completion_tokens", u.get("output_tokens", 0))
    )


def billed_summary(job: Job) -> dict[str, Any]:
    lines = job.billed()
    pairs = [line_usage(job.kind, line) for line in lines]
    seconds = int(job.data["seconds"]) if job.kind == "video" and lines else 0
    return {
        "lines": len(lines),
        "input_tokens": sum(p[0] for p in pairs),
        "output_tokens": sum(p[1] for p in pairs),
        "seconds": seconds,
        "usage": [line.body.get("usage") for line in lines if job.kind != "video"],
        # the model each billed line ran on, as the provider's answer to it names it
        "models": [line.body.get("model") for line in lines if job.kind != "video"],
    }


class _Capture:
    """Stands in for an exchange so a route handler's answer to one batch line can be kept."""

    def __init__(self, body: dict[str, Any], knobs: dict[str, Any]) -> None:
        self.body, self.knobs, self.fail = body, knobs, ""
        self.status, self.obj = 0, {}

    async def respond(self, obj: dict[str, Any]) -> None:
        self.status, self.obj = 200, obj

    async def json(self, status: int, obj: dict[str, Any]) -> None:
        self.status, self.obj = status, obj


Handler = Callable[[Any], Awaitable[None]]
Renderer = Callable[["JobStore", Job, str], dict[str, Any]]
RENDER: dict[str, Renderer] = {}  # kind -> the provider object of a job (filled by batches/media)


class JobStore:
    """One app's jobs and files. ``routes`` are the fake's plain endpoint handlers."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.files = FileStore()
        self.jobs: dict[str, Job] = {}

    async def run_line(self, url: str, body: dict[str, Any], knobs: dict[str, Any], custom_id: str) -> Line:
        handler = self.routes.get(("POST", url))
        if handler is None:
            raise ApiError(400, f"unsupported url {url!r}")
        capture = _Capture({**body, "stream": False, "background": False}, knobs)
        await handler(capture)
        return Line(custom_id=custom_id, status=capture.status, body=capture.obj)

    def add(self, job: Job) -> Job:
        self.jobs[job.id] = job
        return job

    def read(self, job_id: str, kind: str) -> Job:
        """A job as its provider's GET sees it: 404 when unknown, deleted or gone."""
        job = self.lookup(job_id, kind)
        if job.auto and job.state == "in_progress":
            job.finish("cancelled" if job.cancel_at else "completed")
        return job

    def lookup(self, job_id: str, kind: str) -> Job:
        """A job for a write (cancel, delete): like ``read`` but never completes it."""
        job = self.jobs.get(job_id)
        if job is None or job.kind != kind or job.deleted or job.gone:
            raise ApiError(404, f"No such {kind} object: {job_id}")
        return job

    def render(self, job: Job, when: str = "read") -> dict[str, Any]:
        """The provider object; ``when`` is "create" for the answer to the create request."""
        return RENDER[job.kind](self, job, when)

    def control(self, job_id: str, payload: Any) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise LookupError(job_id)
        if not isinstance(payload, dict) or payload.get("state") not in STATES:
            raise ValueError(f'body must be {{"state": one of {list(STATES)}, "done"?: int}}')
        done = payload.get("done")
        if done is not None and (isinstance(done, bool) or not isinstance(done, int) or done < 0):
            raise ValueError("done must be a non-negative integer")
        state = payload["state"]
        if state == "gone":
            job.gone = True
        elif state == "in_progress":
            job.gone, job.state, job.ended_at, job.done = False, "in_progress", None, 0
        else:
            job.gone = False
            job.finish(state, done)
        return self.render(job, "control")

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        for j in self.jobs.values():
            obj = self.render(j, "control")
            rows.append(
                {
                    "id": j.id,
                    "kind": j.kind,
                    "state": "gone" if j.gone else j.state,
                    "done": j.done,
                    "cancel_requested": j.cancel_at is not None,
                    "deleted": j.deleted,
                    "status": obj.get("status", obj.get("processing_status")),
                    "lines": len(j.lines),
                    "billed": billed_summary(j),
                }
            )
        return rows


CONTROL_PATH = re.compile(r"^/_control/jobs(?:/([^/]+))?$")


def control(store: JobStore, method: str, path: str, raw: bytes) -> tuple[int, Any]:
    """``GET /_control/jobs`` and ``POST /_control/jobs/{id}``: (status, JSON body)."""
    import json

    match = CONTROL_PATH.match(path)
    if match is None:
        return 404, {"error": f"unknown path {method} {path}"}
    job_id = match.group(1)
    if method == "GET" and job_id is None:
        return 200, {"jobs": store.summary()}
    if method == "GET" and job_id is not None:
        rows = [row for row in store.summary() if row["id"] == job_id]
        return (200, rows[0]) if rows else (404, {"error": f"unknown job {job_id!r}"})
    if method != "POST" or job_id is None:
        return 404, {"error": f"unknown path {method} {path}"}
    try:
        return 200, store.control(job_id, json.loads(raw or b"{}"))
    except LookupError:
        return 404, {"error": f"unknown job {job_id!r}"}
    except ValueError as exc:
        return 400, {"error": str(exc)}
