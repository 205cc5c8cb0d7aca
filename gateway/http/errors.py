"""Gateway errors, rendered in the calling endpoint's own shape (OpenAI or Anthropic)."""

from __future__ import annotations

from core import fastjson
from core.errors import CapgateError
from core.money import usd_str
from ledger.errors import BudgetExceeded

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
    # A refusal is final: tell SDKs that honour it (openai-python does) not to retry.
    headers = [(b"x-should-retry", b"false")] if exc.status in (400, 401, 402, 403, 404, 409, 413) else []
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
