"""Refusing a NUL character in a request's path, query string or form fields, before any view
runs a query with it.

PostgreSQL text cannot hold NUL (U+0000): a filter, a slug or an id carrying one fails in the
database (a 500) wherever it reaches SQL. Rather than a check at each of those places, this one
refuses it at the door: in the path a 404 (no object has such a name), elsewhere a 400, in the
management API's error shape under /api/ and as a plain page on the dashboard. JSON bodies are
refused by their loader (core/jsonlimits.py); the gateway's /v1 paths by gateway/http/app.py.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotFound,
    JsonResponse,
    QueryDict,
)

NUL = "\x00"
_API_PREFIX = "/api/"
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def holds_nul(pairs: QueryDict) -> bool:
    """Whether any key or value of a QueryDict (every value of a repeated key) holds a NUL."""
    return any(NUL in key or any(NUL in value for value in values) for key, values in pairs.lists())


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = request.path.startswith(_API_PREFIX)
        if NUL in request.path:
            return _refuse(api, 404, "not_found", "Not found.")
        if holds_nul(request.GET):
            return _refuse(api, 400, "nul_character", "The query string holds a NUL character (%00).")
        # The API's bodies are JSON (its loader refuses a NUL); a dashboard form's fields are here.
        if not api and request.method == "POST" and request.content_type in _FORM_TYPES and holds_nul(request.POST):
            return _refuse(api, 400, "nul_character", "A form field holds a NUL character.")
        return self.get_response(request)


def _refuse(api: bool, status: int, code: str, message: str) -> HttpResponse:
    if api:
        return JsonResponse({"code": code, "detail": message, "errors": {}}, status=status)
    page = HttpResponseNotFound if status == 404 else HttpResponseBadRequest
    return page(f"<!doctype html><title>{message}</title><h1>{message}</h1>", content_type="text/html")
