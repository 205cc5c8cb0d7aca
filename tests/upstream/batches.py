"""Batch APIs of the fake upstream: OpenAI ``/v1/batches`` and Anthropic ``/v1/messages/batches``.

OpenAI: the input file's JSONL lines ({custom_id, method, url, body}) are validated at creation
(a bad line fails the whole batch, as the provider does). A finished batch has an output file
(succeeded lines) and an error file (lines that errored, plus the lines a cancel or expiry cut
off, with ``batch_cancelled`` / ``batch_expired``), ``request_counts`` and ``usage`` totals of the
billed lines. Anthropic: ``results`` is JSONL of succeeded / errored / canceled / expired lines.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from .files import ApiError
from .jobs import FINAL, RENDER, Job, JobStore, Line

ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
DAY = 86400


def page(ex: Any, items: list[dict[str, Any]], anthropic: bool = False) -> dict[str, Any]:
    """Newest first; ``after`` (OpenAI) / ``after_id`` (Anthropic) and ``limit`` as the APIs take."""
    after = ex.query.get("after_id" if anthropic else "after")
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = int(ex.query.get("limit") or 20)
    page, more = items[:limit], len(items) > limit
    first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
    if anthropic:
        return {"data": page, "has_more": more, "first_id": first, "last_id": last}
    return {"object": "list", "data": page, "has_more": more, "first_id": first, "last_id": last}


# -- OpenAI ---------------------------------------------------------------------------------


def _parse_input(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(request lines, validation errors) of a batch input file."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, text in enumerate(content.decode("utf-8", "replace").splitlines(), 1):
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except ValueError:
            item = None
        problem = None
        if not isinstance(item, dict):
            problem = "the line is not a JSON object"
        elif not isinstance(item.get("custom_id"), str) or item["custom_id"] in seen:
            problem = "custom_id must be a string, unique within the file"
        elif item.get("method") != "POST" or item.get("url") != endpoint:
            problem = f"method must be POST and url must be the batch endpoint {endpoint}"
        elif not isinstance(item.get("body"), dict):
            problem = "body must be a JSON object"
        if problem:
            errors.append({"code": "invalid_request", "line": number, "message": problem, "param": None})
        else:
            assert isinstance(item, dict)
            seen.add(item["custom_id"])
            lines.append(item)
    if not lines and not errors:
        errors.append(
            {
                "code": "empty_file",
                "line": None,
                "message": "the input file has no requests",
                "param": None,
            }
        )
    return lines, errors


async def create(store: JobStore, ex: Any) -> None:
    body = ex.body
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"endpoint must be one of {list(ENDPOINTS)}")
    if body.get("completion_window") != "24h":
        raise ApiError(400, "completion_window must be '24h'")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ApiError(400, "metadata must be an object")
    input_id = body.get("input_file_id")
    f = store.files.files.get(str(input_id))
    if f is None or f.deleted or f.purpose != "batch":
        raise ApiError(400, f"input_file_id {input_id!r} is not an uploaded file with purpose 'batch'")
    requests, errors = _parse_input(f.content, endpoint)
    job = Job(
        id=f"batch_{uuid.uuid4().hex[:24]}",
        kind="batch",
        auto=bool(ex.knobs["job_auto_complete"]),
        lines=[],
        data={"endpoint": endpoint, "input_file_id": f.id, "metadata": metadata, "model": None},
    )
    if errors:
        job.errors = errors
        job.finish("failed")
    else:
        for item in requests:
            job.lines.append(await store.run_line(endpoint, item["body"], ex.knobs, item["custom_id"]))
        job.data["model"] = requests[0]["body"].get("model")
    store.add(job)
    await ex.json(200, store.render(job, "create"))


def _output_line(job: Job, i: int, line: Line, error: dict[str, Any] | None = None) -> str:
    response = None if error else {"status_code": line.status, "request_id": f"req_{job.id}_{i}", "body": line.body}
    return (
        json.dumps(
            {
                "id": f"batch_req_{job.id}_{i}",
                "custom_id": line.custom_id,
                "response": response,
                "error": error,
            }
        )
        + "\n"
    )


def _usage(lines: list[Line]) -> dict[str, int]:
    total = {"input": 0, "cached": 0, "output": 0, "reasoning": 0}
    for line in lines:
        u = line.body.get("usage") or {}
        total["input"] += int(u.get("prompt_tokens", u.get("input_tokens", 0)))
        total["output"] += int(u.get("completion_tokens", u.get("output_tokens", 0)))
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
        total["cached"] += int(details.get("cached_tokens") or 0)
        out_details = u.get("completion_tokens_details") or u.get("output_tokens_details") or {}
        total["reasoning"] += int(out_details.get("reasoning_tokens") or 0)
    return total


def render(store: JobStore, job: Job, when: str) -> dict[str, Any]:
    d, ended = job.data, job.ended_at
    if when == "create":
        status = "validating"
    elif job.state == "in_progress":
        status = "cancelling" if job.cancel_at else "in_progress"
    else:
        status = job.state
    final = status in FINAL
    counts = {"total": len(job.lines), "completed": 0, "failed": 0}
    out_id = err_id = None
    if final and job.state != "failed":
        n = job.finished()
        ok = [(i, x) for i, x in enumerate(job.lines[:n]) if x.status == 200]
        bad = [(i, x) for i, x in enumerate(job.lines[:n]) if x.status != 200]
        code = "batch_expired" if job.state == "expired" else "batch_cancelled"
        cut = {"code": code, "message": f"The request was not executed: the batch was {job.state}."}
        if ok:
            content = "".join(_output_line(job, i, x) for i, x in ok).encode()
            out_id = store.files.add(f"{job.id}_output.jsonl", "batch_output", content, f"file-{job.id}-output").id
        if bad or n < len(job.lines):
            content = "".join(
                [_output_line(job, i, x) for i, x in bad]
                + [_output_line(job, i, x, cut) for i, x in enumerate(job.lines) if i >= n]
            ).encode()
            err_id = store.files.add(f"{job.id}_error.jsonl", "batch_output", content, f"file-{job.id}-error").id
        counts = {"total": len(job.lines), "completed": len(ok), "failed": len(job.lines) - len(ok)}
    u = _usage(job.billed())
    errors = job.errors or [
        {
            "code": "batch_failed",
            "line": None,
            "param": None,
            "message": "The batch failed at the fake provider.",
        }
    ]
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": d["endpoint"],
        "model": d["model"],
        "errors": {"object": "list", "data": errors} if status == "failed" else None,
        "input_file_id": d["input_file_id"],
        "completion_window": "24h",
        "status": status,
        "output_file_id": out_id,
        "error_file_id": err_id,
        "created_at": job.created_at,
        "in_progress_at": None if when == "create" or job.errors else job.created_at,
        "expires_at": job.created_at + DAY,
        "finalizing_at": ended if status == "completed" else None,
        "completed_at": ended if status == "completed" else None,
        "failed_at": ended if status == "failed" else None,
        "expired_at": ended if status == "expired" else None,
        "cancelling_at": job.cancel_at or (ended if status == "cancelled" else None),
        "cancelled_at": ended if status == "cancelled" else None,
        "request_counts": counts,
        "metadata": d["metadata"],
        "usage": {
            "input_tokens": u["input"],
            "input_tokens_details": {"cached_tokens": u["cached"]},
            "output_tokens": u["output"],
            "output_tokens_details": {"reasoning_tokens": u["reasoning"]},
            "total_tokens": u["input"] + u["output"],
        },
    }


async def retrieve(store: JobStore, ex: Any, job_id: str) -> None:
    await ex.json(200, store.render(store.read(job_id, "batch")))


async def cancel(store: JobStore, ex: Any, job_id: str) -> None:
    """Cancelling: the batch says "cancelling" until the control plane (or auto-complete) ends it.
    Cancelling a finished batch answers it unchanged."""
    job = store.lookup(job_id, "batch")
    if job.state == "in_progress" and job.cancel_at is None:
        job.cancel_at = int(datetime.now(UTC).timestamp())
    await ex.json(200, store.render(job))


async def listing(store: JobStore, ex: Any) -> None:
    jobs = [j for j in reversed(store.jobs.values()) if j.kind == "batch" and not (j.gone or j.deleted)]
    await ex.json(200, page(ex, [store.render(j) for j in jobs]))


# -- Anthropic ------------------------------------------------------------------------------


def _rfc3339(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


async def create_messages(store: JobStore, ex: Any) -> None:
    requests = ex.body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ApiError(400, "requests: must be a non-empty list")
    ids = [r.get("custom_id") if isinstance(r, dict) else None for r in requests]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        raise ApiError(400, "requests: each needs a custom_id, unique within the batch")
    if not all(isinstance(r.get("params"), dict) for r in requests):
        raise ApiError(400, "requests: each needs params (a Messages API request)")
    job = Job(
        id=f"msgbatch_{uuid.uuid4().hex[:24]}",
        kind="message_batch",
        auto=bool(ex.knobs["job_auto_complete"]),
        lines=[],
        data={"base": f"http://{ex.headers.get('host', 'localhost')}"},
    )
    for r in requests:
        params = r["params"]
        missing = [k for k in ("model", "max_tokens", "messages") if k not in params]
        if missing:
            error = {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": f"params: {missing[0]}: Field required",
                },
            }
            job.lines.append(Line(custom_id=r["custom_id"], status=400, body=error))
        else:
            job.lines.append(await store.run_line("/v1/messages", params, ex.knobs, r["custom_id"]))
    store.add(job)
    await ex.json(200, store.render(job, "create"))


def _results(job: Job) -> list[dict[str, Any]]:
    n = job.finished()
    out = []
    for i, line in enumerate(job.lines):
        if job.state == "failed":
            result: dict[str, Any] = {
                "type": "errored",
                "error": {
                    "type": "error",
                    "error": {
                        "type": "api_error",
                        "message": "The batch failed at the fake provider.",
                    },
                },
            }
        elif i < n:
            result = (
                {"type": "succeeded", "message": line.body}
                if line.status == 200
                else {"type": "errored", "error": line.body}
            )
        else:
            result = {"type": "expired" if job.state == "expired" else "canceled"}
        out.append({"custom_id": line.custom_id, "result": result})
    return out


def render_messages(store: JobStore, job: Job, when: str) -> dict[str, Any]:
    ended = job.state in FINAL and when != "create"
    counts = {
        "processing": len(job.lines),
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    if ended:
        counts["processing"] = 0
        for r in _results(job):
            counts[r["result"]["type"]] += 1
    status = "ended" if ended else ("canceling" if job.cancel_at else "in_progress")
    return {
        "id": job.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": counts,
        "created_at": _rfc3339(job.created_at),
        "expires_at": _rfc3339(job.created_at + DAY),
        "ended_at": _rfc3339(job.ended_at) if ended else None,
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(job.cancel_at),
        "results_url": f"{job.data['base']}/v1/messages/batches/{job.id}/results" if ended else None,
    }


async def retrieve_messages(store: JobStore, ex: Any, job_id: str) -> None:
    await ex.json(200, store.render(store.read(job_id, "message_batch")))


async def cancel_messages(store: JobStore, ex: Any, job_id: str) -> None:
    job = store.lookup(job_id, "message_batch")
    if job.state == "in_progress" and job.cancel_at is None:
        job.cancel_at = int(datetime.now(UTC).timestamp())
    await ex.json(200, store.render(job))


async def results_messages(store: JobStore, ex: Any, job_id: str) -> None:
    job = store.read(job_id, "message_batch")
    if job.state not in FINAL:
        raise ApiError(400, f"Message batch {job_id} has not ended; its results are not available yet.")
    data = "".join(json.dumps(r) + "\n" for r in _results(job)).encode()
    await ex.start(200, "application/x-jsonl", (b"content-length", b"%d" % len(data)))
    await ex.body_chunk(data)


async def listing_messages(store: JobStore, ex: Any) -> None:
    jobs = [j for j in reversed(store.jobs.values()) if j.kind == "message_batch" and not (j.gone or j.deleted)]
    await ex.json(200, page(ex, [store.render(j) for j in jobs], anthropic=True))


RENDER["batch"] = render
RENDER["message_batch"] = render_messages
