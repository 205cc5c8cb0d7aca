"""The one domain error shape: an HTTP status, a code the user reads, a message, details.

The gateway renders it as OpenAI's or Anthropic's error body, the API as DRF's. InvalidChange
and NotAllowed are what every app's services raise for a write that breaks a rule or a role;
forms, the API and `apply` show them next to the field `param` names.
"""

from typing import Any


class CapgateError(Exception):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details or {}
        self.param = param


class InvalidChange(CapgateError):
    """A change that breaks a rule. `param` names the field, so forms and the API can show the
    message next to it."""

    status = 400
    code = "invalid"


class NotAllowed(CapgateError):
    status = 403
    code = "permission_denied"
