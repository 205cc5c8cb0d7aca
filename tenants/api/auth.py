"""Management API plumbing that DRF settings name: token authentication, the organization
permission, and the one error shape. Kept free of DRF view imports (DRF imports these while
its views module is still loading)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response

from core.errors import CapgateError
from tenants import services
from tenants.models import TOKEN_PREFIX, ApiToken

# --- authentication and access -------------------------------------------------------------------


class TokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer cgt_…` — an organization API token (never a gateway key)."""

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() != b"bearer":
            return None
        raw = parts[1].decode("latin-1")
        if not raw.startswith(TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed("Not a management API token (they start with cgt_).")
        token = services.authenticate_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        return AnonymousUser(), token

    def authenticate_header(self, request):
        return 'Bearer realm="capgate"'


class OrgPermission(BasePermission):
    """Authenticated, a member of (or a token of) the URL's organization — else 404 — and, for
    writes, allowed to write (owner/admin or a write token; see `can_write` per view)."""

    message = "Your role or token scope can only read."

    def has_permission(self, request, view) -> bool:
        if not (isinstance(request.auth, ApiToken) or request.user.is_authenticated):
            raise exceptions.NotAuthenticated()
        if "org_slug" not in view.kwargs:
            return True  # a list across the caller's own organizations
        access = view.access  # raises 404 for outsiders
        return request.method in SAFE_METHODS or view.can_write(access)


# --- the one error shape ---------------------------------------------------------------------------


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every API error is `{"code", "detail", "errors": {field: [messages]}}`."""
    if isinstance(exc, CapgateError):
        errors = {exc.param: [exc.message]} if exc.param else {}
        return Response({"code": exc.code, "detail": exc.message, "errors": errors}, status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        # DRF reads JSON bodies through request.body, which enforces DATA_UPLOAD_MAX_MEMORY_SIZE.
        return Response(
            {"code": "request_too_large", "detail": "The request body is too large.", "errors": {}},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, ProtectedError):
        return Response(
            {"code": "in_use", "detail": "It is still in use (e.g. by a route).", "errors": {}},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, IntegrityError):
        # A concurrent change won a unique constraint: the caller may retry.
        return Response(
            {"code": "conflict", "detail": "A conflicting change was made at the same time.", "errors": {}},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = response.data if isinstance(response.data, dict) else {"non_field_errors": response.data}
        response.data = {"code": "invalid", "detail": "Invalid input.", "errors": errors}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()  # the instance's code (core/parsers.py gives the loader's)
        code = codes if isinstance(codes, str) else exc.default_code
        response.data = {"code": code, "detail": str(exc.detail), "errors": {}}
    return response
