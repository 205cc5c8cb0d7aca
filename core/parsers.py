"""The management API's JSON parser: DRF's, with the limits of core/jsonlimits.py, so a huge or
deeply nested body, or one holding a lone surrogate or a NUL, is a 413/400 in the API's error
shape with the loader's code."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

from core import jsonlimits


class RequestTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class JSONRefused(exceptions.ParseError):
    """A body the loader refuses (too deep, a lone surrogate, a NUL), with the loader's code."""


class LimitedJSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        # Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default) guards form bodies; DRF reads
        # JSON from the raw stream, past it. Read one byte more than the limit to know.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if stream is None:
            raw = b""
        else:
            raw = stream.read() if limit is None else stream.read(limit + 1)
        try:
            return jsonlimits.loads(raw, max_bytes=limit)
        except jsonlimits.JSONLimitError as exc:
            if exc.status == 413:
                raise RequestTooLarge(exc.message) from None
            if exc.param:
                # A string the loader refuses, inside a field: named as the API names a bad field.
                field = re.split(r"[.\[]", exc.param, maxsplit=1)[0] or "non_field_errors"
                raise exceptions.ValidationError({field: [exc.message]}, code=exc.code) from None
            raise JSONRefused(exc.message, code=exc.code) from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
