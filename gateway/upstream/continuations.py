"""The Responses API's stored state: the context a continuation adds, and who owns a response.

A request with `previous_response_id` or `conversation` makes the provider add earlier context
that the request body does not show. capgate bounds it from what it relayed itself: for every
response it served it keeps input + output tokens (the context a continuation starts from),
per organization. An id it did not relay cannot be bounded: refused under a blocking cap."""

from __future__ import annotations

from django.db import IntegrityError

from gateway.http.errors import GatewayError
from gateway.models import StoredResponse


def context_tokens(*, organization_id: int, ref: tuple[str, str]) -> int | None:
    """The earlier context a continuation adds, or None when capgate did not relay it."""
    kind, ident = ref
    rows = StoredResponse.objects.filter(organization_id=organization_id)
    if kind == "response":
        row = rows.filter(response_id=ident).only("context_tokens").first()
    else:  # the conversation's context is its latest response's
        row = rows.filter(conversation_id=ident).order_by("-id").only("context_tokens").first()
    return row.context_tokens if row is not None else None


def unknown_context(ref: tuple[str, str]) -> GatewayError:
    kind, ident = ref
    field = "previous_response_id" if kind == "response" else "conversation"
    return GatewayError(
        f"capgate did not relay {kind} '{ident}', so it cannot bound the context the provider would add to "
        "this request; a blocking budget cannot admit it. Continue from a response made through capgate.",
        code=f"unknown_{field}",
        status=402,
        param=field,
    )


def remember(
    *, organization_id: int, connection_id: int, response_id: str, conversation_id: str | None, context: int
) -> None:
    """Keep a relayed response's context size. The same id twice keeps the first (a retry)."""
    try:
        StoredResponse.objects.create(
            organization_id=organization_id,
            connection_id=connection_id,
            response_id=response_id[:200],
            conversation_id=(conversation_id or None),
            context_tokens=max(context, 0),
        )
    except IntegrityError:
        pass  # already remembered: the first relay's numbers stand


def owned(*, organization_id: int, response_id: str) -> StoredResponse | None:
    return (
        StoredResponse.objects.select_related("connection")
        .filter(organization_id=organization_id, response_id=response_id)
        .first()
    )


def forget(*, organization_id: int, response_id: str) -> None:
    StoredResponse.objects.filter(organization_id=organization_id, response_id=response_id).delete()
