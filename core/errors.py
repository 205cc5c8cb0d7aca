"""The one domain error shape: an HTTP status, a code the user reads, a message, details.

The gateway renders it as OpenAI's or Anthropic's error body, the API as DRF's.
"""

from typing import Any


class CapgateError(Exception):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 details: dict[str, Any] | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details or {}
        self.param = param
