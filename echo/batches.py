"""echo's batch APIs: OpenAI `/v1/batches` and Anthropic `/v1/messages/batches` (entry point and
storage: echo/jobs.py).

Every line is answered at creation exactly as echo answers the same request live
(echo/provider.py: prompt tokens from the connection's options, else a quarter of the gateway's
input bound for that body; completion capped by the line's own output ceiling). The batch is
then finished: the create call answers "validating" / "in_progress", and every later read answers
"completed" / "ended" with the output, error or results file and the usage totals. A cancel
arrives after the batch finished, so it answers the finished batch unchanged. A batch whose
output would pass its bound in bytes is never answered in part: an OpenAI batch ends "failed"
with the error `output_too_large`, a message batch is refused with 413.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from echo import provider as echo
from gateway.admission.bounds import SHAPERS
from gateway.http.errors import GatewayError, bad_request, error_body

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}
DAY = 86400


def answer_line(opts: dict, kind: str, body: dict, flavor: str) -> tuple[int, dict]:
    """(status, body) of one batch line, as echo would answer it live."""
    try:
        shape = SHAPERS[kind](body)
    except GatewayError as exc:
        return exc.status, error_body(exc, flavor=flavor)
    return 200, echo.echo_body(opts, kind, body, shape.text_tokens)


def _parse_input(content: bytes, endpoint: str) -> tuple[list[dict], list[dict]]:
    """(request lines, validation errors) of an OpenAI batch input file."""
    lines: list[dict] = []
    errors: list[dict] = []
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
        if problem or not isinstance(item, dict):
            errors.append({"code": "invalid_request", "line": number, "message": problem, "param": None})
            continue
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


def _too_large(max_bytes: int) -> str:
    return (
        f"The batch's output would pass {max_bytes} bytes, the most echo keeps for one batch "
        "(CAPGATE_ECHO_MAX_OUTPUT_BYTES); split it into smaller batches."
    )


def _openai_lines(
    opts: dict, kind: str, requests: list[dict], bid: str, max_bytes: int
) -> tuple[list[str], list[str], dict[str, int]] | None:
    """(output lines, error lines, token totals) of a batch's requests, or None as soon as the
    lines pass `max_bytes` together (nothing more is answered: the batch fails whole)."""
    ok: list[str] = []
    bad: list[str] = []
    totals = {"input": 0, "output": 0}
    size = 0
    for i, item in enumerate(requests):
        status, answer = answer_line(opts, kind, item["body"], "openai")
        line = json.dumps(
            {
                "id": f"batch_req_{bid}_{i}",
                "custom_id": item["custom_id"],
                "error": None,
                "response": {"status_code": status, "request_id": f"req_{bid}_{i}", "body": answer},
            }
        )
        size += len(line) + 1  # json.dumps writes ASCII: one byte a character, and the newline
        if size > max_bytes:
            return None
        (ok if status == 200 else bad).append(line + "\n")
        u = (answer.get("usage") or {}) if status == 200 else {}
        totals["input"] += int(u.get("prompt_tokens", u.get("input_tokens", 0)))
        totals["output"] += int(u.get("completion_tokens", u.get("output_tokens", 0)))
    return ok, bad, totals


def openai_batch(
    opts: dict, body: dict, input_file: dict | None, content: bytes, *, max_output_bytes: int
) -> tuple[dict, dict, dict[str, bytes]]:
    """(the create answer, the finished batch, its output/error files by name "output"/"error").
    A batch whose output and error files would pass `max_output_bytes` together ends `failed`
    with the error `output_too_large` and no files, as a batch that fails validation does."""
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise bad_request(f"endpoint must be one of {sorted(ENDPOINTS)}", param="endpoint")
    if body.get("completion_window") != "24h":
        raise bad_request("completion_window must be '24h'", param="completion_window")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("metadata must be an object", param="metadata")
    if input_file is None or input_file.get("purpose") != "batch":
        raise bad_request(
            f"input_file_id {body.get('input_file_id')!r} is not an uploaded file with purpose 'batch'",
            param="input_file_id",
        )
    bid, now = f"batch_{uuid.uuid4().hex[:24]}", int(time.time())
    requests, errors = _parse_input(content, endpoint)
    answered = None if errors else _openai_lines(opts, ENDPOINTS[endpoint], requests, bid, max_output_bytes)
    if answered is None and not errors:
        errors = [{"code": "output_too_large", "line": None, "message": _too_large(max_output_bytes), "param": None}]
    created = {
        "id": bid,
        "object": "batch",
        "endpoint": endpoint,
        "model": requests[0]["body"].get("model") if requests else None,
        "errors": None,
        "input_file_id": input_file["id"],
        "completion_window": "24h",
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + DAY,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": len(requests), "completed": 0, "failed": 0},
        "metadata": metadata,
        "usage": _usage(0, 0),
    }
    if errors or answered is None:
        return (
            created,
            created | {"status": "failed", "failed_at": now, "errors": {"object": "list", "data": errors}},
            {},
        )
    ok, bad, totals = answered
    files = {name: "".join(lines).encode() for name, lines in (("output", ok), ("error", bad)) if lines}
    finished = created | {
        "status": "completed",
        "in_progress_at": now,
        "finalizing_at": now,
        "completed_at": now,
        "output_file_id": f"file-{bid}-output" if "output" in files else None,
        "error_file_id": f"file-{bid}-error" if "error" in files else None,
        "request_counts": {"total": len(requests), "completed": len(ok), "failed": len(bad)},
        "usage": _usage(totals["input"], totals["output"]),
    }
    return created, finished, files


def _usage(input_tokens: int, output_tokens: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _rfc3339(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def message_batch(
    opts: dict, body: dict, results_url: Callable[[str], str], *, max_output_bytes: int
) -> tuple[dict, dict, bytes]:
    """(the create answer, the ended batch, its results JSONL) of an Anthropic message batch.
    Results that would pass `max_output_bytes` refuse the batch with 413 (Anthropic's
    `request_too_large`), nothing kept: its batches have no failed state to end in."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise bad_request("requests: must be a non-empty list", param="requests")
    ids = [r.get("custom_id") if isinstance(r, dict) else None for r in requests]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        raise bad_request("requests: each needs a custom_id, unique within the batch", param="requests")
    if not all(isinstance(r.get("params"), dict) for r in requests):
        raise bad_request("requests: each needs params (a Messages API request)", param="requests")
    bid, now = f"msgbatch_{uuid.uuid4().hex[:24]}", int(time.time())
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    out: list[str] = []
    size = 0
    for r in requests:
        status, answer = answer_line(opts, "messages", r["params"], "anthropic")
        result: dict[str, Any] = (
            {"type": "succeeded", "message": answer} if status == 200 else {"type": "errored", "error": answer}
        )
        counts[result["type"]] += 1
        out.append(json.dumps({"custom_id": r["custom_id"], "result": result}) + "\n")
        size += len(out[-1])  # ASCII JSON: one byte a character
        if size > max_output_bytes:
            raise GatewayError(_too_large(max_output_bytes), code="output_too_large", status=413, param="requests")
    created = {
        "id": bid,
        "type": "message_batch",
        "processing_status": "in_progress",
        "request_counts": {**counts, "processing": len(requests), "succeeded": 0, "errored": 0},
        "created_at": _rfc3339(now),
        "expires_at": _rfc3339(now + DAY),
        "ended_at": None,
        "archived_at": None,
        "cancel_initiated_at": None,
        "results_url": None,
    }
    ended = created | {
        "processing_status": "ended",
        "request_counts": counts,
        "ended_at": _rfc3339(now),
        "results_url": results_url(bid),
    }
    return created, ended, "".join(out).encode()
