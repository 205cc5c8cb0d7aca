"""The Responses API's stored state: the context a continuation adds, and who owns a response.

A request with `previous_response_id` or `conversation` makes the provider add earlier context
that the request body does not show. capgate bounds it from what it relayed itself: for every
response it served it keeps input + output tokens (the context a continuation starts from),
per organization. An id it did not relay cannot be bounded: refused under a blocking cap.

Anthropic's message threads are the same shape: a `thread` of type `continue` makes the provider
add the conversation it keeps under `previous_message_id`. capgate keeps a threaded message's
input + output tokens under its id with the THREAD prefix (so no Responses lookup by id finds it)."""

from __future__ import annotations

from django.db import IntegrityError

from gateway.http.errors import GatewayError
from gateway.models import StoredResponse

THREAD = "thread:"  # a threaded Anthropic message's row: its id behind this prefix
_FIELDS = {"response": "previous_response_id", "conversation": "conversation", "message": "previous_message_id"}


def context_tokens(*, organization_id: int, ref: tuple[str, str]) -> int | None:
    """The earlier context a continuation adds, or None when capgate did not relay it."""
    kind, ident = ref
    rows = StoredResponse.objects.filter(organization_id=organization_id)
    if kind in ("response", "message"):
        stored_id = ident if kind == "response" else THREAD + ident
        row = rows.filter(response_id=stored_id).only("context_tokens").first()
    else:  # the conversation's context is its latest response's
        row = rows.filter(conversation_id=ident).order_by("-id").only("context_tokens").first()
    return row.context_tokens if row is not None else None


def unknown_context(ref: tuple[str, str]) -> GatewayError:
    kind, ident = ref
    field = _FIELDS[kind]
    then = (
        "Continue from a response made through capgate."
        if kind != "message"
        else 'Send the whole conversation with thread {"type": "create"} (or no thread) through capgate.'
    )
    return GatewayError(
        f"capgate did not relay {kind} '{ident}', so it cannot bound the context the provider would add to "
        f"this request; a blocking budget cannot admit it. {then}",
        code=f"unknown_{field}",
        status=402,
        param=field if kind != "message" else "thread.previous_message_id",
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
