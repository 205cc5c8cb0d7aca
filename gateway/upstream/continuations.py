"""The Responses API's stored state: the context a continuation adds, and who owns a response.

A request with `previous_response_id` or `conversation` makes the provider add earlier context
that the request body does not show. capgate bounds it from what it relayed itself: for every
response it served it keeps input + output tokens (the context a continuation starts from),
per organization. An id it did not relay cannot be bounded: refused under a blocking cap.

A conversation grows by every item each of its turns adds, so a turn bounded by the
conversation's stored context must not run beside another turn: under a blocking cap a
conversation has one turn in flight at a time (`claim_turn`), held from before its context is
read until its response is remembered. A second turn meanwhile gets 409 `conversation_locked`,
the code OpenAI answers concurrent turns with. A turn that ends without a remembered response
(outcome unknown, process died) leaves its own bound as the conversation's context.

Anthropic's message threads are the same shape: a `thread` of type `continue` makes the provider
add the conversation it keeps under `previous_message_id`. capgate keeps a threaded message's
input + output tokens under its id with the THREAD prefix (so no Responses lookup by id finds it)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from core.guards import Guards
from gateway.http.errors import GatewayError
from gateway.models import ConversationTurn, StoredResponse

# Removal test: tests/gateway/test_conversation_turns.py.
GUARDS = Guards(
    one_turn_per_conversation="under a blocking budget a conversation has one turn in flight at a time, so "
    "no turn is billed for items another turn adds after its context was read",
)

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
    *, organization_id: int, connection_id: int | None, response_id: str, conversation_id: str | None, context: int
) -> None:
    """Keep a relayed response's context size. The same id twice keeps the first (a retry)."""
    try:
        with transaction.atomic():
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


def claim_turn(*, organization_id: int, conversation_id: str, request_id: str, owner_id: int | None) -> None:
    """Hold `conversation_id` for this turn, or raise 409 `conversation_locked` while another
    turn holds it. A claim whose owner stopped heartbeating, or past the request's maximum
    lifetime, is taken over: its bound is kept first as the conversation's context."""
    if not GUARDS.one_turn_per_conversation:
        return
    now = timezone.now()
    with transaction.atomic():
        for stale in (
            ConversationTurn.objects.select_for_update(of=("self",))
            .filter(organization_id=organization_id, conversation_id=conversation_id)
            .filter(_stale(now))
        ):
            _keep_bound(stale)
            stale.delete()
        try:
            with transaction.atomic():
                ConversationTurn.objects.create(
                    organization_id=organization_id,
                    conversation_id=conversation_id,
                    request_id=request_id,
                    owner_id=owner_id,
                    expires_at=now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
                )
        except IntegrityError:
            held = ConversationTurn.objects.filter(organization_id=organization_id, conversation_id=conversation_id)
            if held.filter(request_id=request_id).exists():
                return  # this request's own claim (admission resolved who pays again)
            raise GatewayError(
                f"Another request is running a turn of conversation '{conversation_id}'; retry once it ends. "
                "A turn is billed for every item the conversation holds when it runs, so under a blocking "
                "budget capgate runs one turn of a conversation at a time.",
                code="conversation_locked",
                status=409,
                param="conversation",
            ) from None


def _stale(now: datetime) -> Q:
    grace = settings.CAPGATE["HEARTBEAT_GRACE"]
    return Q(expires_at__lt=now) | Q(owner__heartbeat_at__lt=now - grace) | Q(owner__stopped_at__isnull=False)


def _keep_bound(turn: ConversationTurn) -> None:
    if turn.bound_tokens is not None:
        remember(
            organization_id=turn.organization_id,
            connection_id=None,
            response_id=turn.request_id,
            conversation_id=turn.conversation_id,
            context=turn.bound_tokens,
        )


def bound_turn(*, organization_id: int, conversation_id: str, request_id: str, tokens: int) -> None:
    """Note what the conversation may hold once this admitted turn ends (before it is sent)."""
    ConversationTurn.objects.filter(
        organization_id=organization_id, conversation_id=conversation_id, request_id=request_id
    ).update(bound_tokens=tokens)


def release_turn(*, conversation_id: str, request_id: str, ran: bool) -> None:
    """End this turn's hold. A turn that `ran` (admitted) without a remembered response leaves
    its bound as the conversation's context: the provider may have added its items."""
    with transaction.atomic():
        turn = (
            ConversationTurn.objects.select_for_update()
            .filter(conversation_id=conversation_id, request_id=request_id)
            .first()
        )
        if turn is None:
            return
        if ran:
            _keep_bound(turn)
        turn.delete()
