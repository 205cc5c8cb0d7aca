"""Gateway errors, rendered in the calling endpoint's own shape (OpenAI or Anthropic)."""

from __future__ import annotations

import time

from core import fastjson
from core.errors import CapgateError
from core.guards import Guards
from core.money import usd_str
from ledger.errors import BudgetExceeded

# Removal tests: tests/clients/test_refusals_not_retried.py, tests/clients/test_codex.py.
GUARDS = Guards(
    should_retry_header="every final refusal tells the SDKs not to retry it (`x-should-retry: false`), "
    "which they obey before looking at the status",
    refuse_in_stream="a final refusal of a streamed Responses call whose client reads only an event "
    "stream is answered as that stream's `response.failed`, with an error code the client treats as final",
)
# Refusals that sending the same request again cannot change: 4xx but 429 (rate limits) and
# 408. The SDKs retry 409 by default (openai, anthropic), and would repeat a run_budget_conflict.
FINAL_STATUSES = (400, 401, 402, 403, 404, 409, 413)
# Final refusals of a streamed Responses call: budget (402) and run budget conflicts (409).
# Codex CLI reconnects on any status but 400, 401, 429 and 500 (five times by default), and
# reads no header; a `response.failed` whose error code is `invalid_prompt` ends its turn at
# once and shows the message (docs/decisions.md, "Refusals in a Responses stream").
IN_STREAM_STATUSES = (402, 409)
FINAL_IN_STREAM_CODE = "invalid_prompt"

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "budget_exceeded",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


class GatewayError(CapgateError):
    pass


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(message, code=code, status=400, param=param)


def error_body(exc: CapgateError, *, flavor: str) -> dict:
    if flavor == "anthropic":
        err_type = exc.type if exc.status == 402 else _ANTHROPIC_TYPES.get(exc.status, "api_error")
        return {"type": "error", "error": {"type": err_type, "message": exc.message, "code": exc.code}}
    err_type = exc.type
    if exc.status == 401:
        err_type = "authentication_error"
    elif exc.status == 403:
        err_type = "permission_error"
    elif exc.status == 404:
        err_type = "not_found_error" if exc.code != "model_not_found" else "invalid_request_error"
    return {"error": {"message": exc.message, "type": err_type, "code": exc.code, "param": exc.param}}


def error_headers(exc: CapgateError) -> list[tuple[bytes, bytes]]:
    # A refusal is final: tell the SDKs (openai, anthropic: Python and Node) not to retry it.
    final = exc.status in FINAL_STATUSES and GUARDS.should_retry_header
    headers = [(b"x-should-retry", b"false")] if final else []
    if isinstance(exc, BudgetExceeded):
        headers += [
            (b"x-capgate-budget-code", exc.code.encode()),
            (b"x-capgate-budget-limit-usd", usd_str(exc.limit_nano).encode()),
            (b"x-capgate-budget-remaining-usd", usd_str(max(exc.remaining_nano, 0)).encode()),
            (b"x-capgate-budget-worst-case-usd", usd_str(exc.worst_nano).encode()),
        ]
    retry_after = getattr(exc, "retry_after", None)
    if exc.status == 429 and retry_after is not None:
        # Rate and concurrency limits (ratelimits/, gateway/upstream/transport.py): when to try again, and which limit.
        headers += [
            (b"retry-after", str(int(retry_after)).encode()),
            (b"x-capgate-rate-limit", str(getattr(exc, "limit_name", exc.code)).encode()),
        ]
    return headers


def render(exc: CapgateError, *, flavor: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return exc.status, error_headers(exc), fastjson.dumps(error_body(exc, flavor=flavor))


def event_stream_only(accept: str) -> bool:
    """Whether a client reads only an event stream (Codex CLI: `Accept: text/event-stream`),
    not JSON (the SDKs send `application/json`, and read a 402 as an error)."""
    types = {t.split(";")[0].strip().lower() for t in accept.split(",")}
    return "text/event-stream" in types and not types & {"application/json", "application/*", "*/*"}


def refused_in_stream(*, stream: bool, accept: str, status: int) -> bool:
    """Whether a Responses call's refusal is answered as an event stream (`render_failed_response`)."""
    return GUARDS.refuse_in_stream and stream and status in IN_STREAM_STATUSES and event_stream_only(accept)


def render_failed_response(
    exc: CapgateError, *, response_id: str, model: str
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A final refusal as a streamed Responses call's own failure: `response.created` then
    `response.failed`, whose error code a client treats as final and whose message is the
    refusal's. The status is 200 (a client reads the events of no other); the refusal's
    headers (`x-should-retry`, `x-capgate-budget-*`) are sent as on a 402."""
    response = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": None,
    }
    failed = {**response, "status": "failed", "error": {"code": FINAL_IN_STREAM_CODE, "message": exc.message}}
    events = [
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": response}),
        ("response.failed", {"type": "response.failed", "sequence_number": 1, "response": failed}),
    ]
    body = b"".join(b"event: " + name.encode() + b"\ndata: " + fastjson.dumps(data) + b"\n\n" for name, data in events)
    return 200, [(b"cache-control", b"no-cache"), *error_headers(exc)], body
