"""The reservation API, for callers that call providers themselves:
reserve a worst case, then settle it with the actual usage or cost, or release it.

Request ids are namespaced by organization, so one org's ids never collide with another's.

Who may act on a reservation:
- one the gateway made for a proxied call is settled by that call only: 409
  `reservation_owned_by_gateway` here;
- one made here, by the key that made it, or by a management-API token of the organization
  with write scope whose member is an owner or admin (sent as the bearer key); a read token gets
  403 `read_only_token`, a write token of a member below admin 403 `token_role_too_low`, another
  key 403 `not_reservation_owner`. Every settle and release is written to the audit log.

Release and settle, after expiry and after each other (docs/decisions.md): the first
settle or release is final and repeating it returns that first result; the other action after
it is 409 (`reservation_settled` / `reservation_released`), and so is a settle at another cost
than the first (`reservation_settle_conflict`, kept once on the record, not applied). An
expiry's worst-case charge is not final: the first settle or release after it corrects it (a
release to zero), once.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError

from catalog.pricing import Usage, cost_nano
from core.guards import Guards
from core.money import MoneyError, usd_str, usd_to_nano
from gateway.admission.bounds import Shape, shape_chat
from gateway.admission.routing import authenticate, resolve_route, settle_rates
from gateway.admission.service import admit
from gateway.admission.subjects import key_actor, payer
from gateway.http.errors import GatewayError, bad_request
from ledger.drain import drain
from ledger.models import Reservation, UsageRecord
from ledger.recording import Outcome, note_conflict, record, release
from tenants.audit import Actor, audit
from tenants.models import TOKEN_PREFIX, ApiKey, ApiToken
from tenants.selectors import MANAGERS
from tenants.services import authenticate_token

# The reservation API's own fields: everything else in a chat-shaped body is the chat request.
OWN_FIELDS = ("request_id", "ttl_seconds", "amount_usd")
# Removal tests: tests/gateway/test_admin_actions.py, tests/gateway/test_settle_conflicts.py.
GUARDS = Guards(
    check_owner="a reservation is settled or released only by its own key, never another request's",
    record_conflicts_apart="a settle losing a race to another settle at another cost is 409, its cost "
    "kept apart from the record's (else the loser is told 200 and the audit reports drift)",
)

MAX_USD = Decimal("1000000")


def _usd(value: Any, field: str, *, round_up: bool) -> int:
    """A USD amount from the body (a decimal string; never a JSON float) -> nano-USD."""
    try:
        return usd_to_nano(value, round_up=round_up, maximum=MAX_USD)
    except MoneyError as exc:
        raise bad_request(f"'{field}' {exc.message}.", param=field) from None


def _int(body: dict, field: str, *, low: int = 0, high: int = 10_000_000) -> int:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"'{field}' must be an integer between {low} and {high}.", param=field)
    return value


def view(reservation: Reservation) -> dict:
    return {
        "id": str(reservation.id),
        "object": "reservation",
        "request_id": reservation.request_id.split(":", 1)[-1],
        "model": reservation.model,
        "amount_nano": reservation.amount_nano,
        "amount_usd": usd_str(reservation.amount_nano),
        "expires_at": reservation.expires_at.isoformat(),
        "deadline_at": reservation.deadline_at.isoformat(),
        "status": "reserved",
    }


def record_view(rec: UsageRecord) -> dict:
    return {
        "id": str(rec.reservation_id),
        "object": "reservation",
        "request_id": rec.request_id.split(":", 1)[-1],
        "model": rec.model,
        "status": rec.status,
        "cost_nano": rec.cost_nano,
        "cost_usd": usd_str(rec.cost_nano),
        "reserved_nano": rec.reserved_nano,
        "excess_nano": rec.excess_nano,
    }


def create(*, raw_key: str | None, body: dict, headers: dict[str, str], owner_id: int | None) -> tuple[int, dict]:
    """Reserve a worst case: an explicit `amount_usd`, or one sized from a chat-shaped body
    (`model` + `messages`, optional `max_tokens`/`n`), or from token bounds (`model` +
    `input_tokens` + `max_output_tokens`). Idempotent by `request_id`."""
    key = authenticate(raw_key)
    client_id = body.get("request_id") or uuid.uuid4().hex
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= 64:
        raise bad_request("'request_id' must be a string of 1-64 characters.", param="request_id")
    request_id = f"{key.organization_id}:{client_id}"
    existing = Reservation.objects.filter(request_id=request_id, organization_id=key.organization_id).first()
    if existing is not None:
        return 200, view(existing)
    done = UsageRecord.objects.filter(request_id=request_id, organization_id=key.organization_id).first()
    if done is not None:
        return 200, record_view(done)
    ttl = body.get("ttl_seconds", int(settings.CAPGATE["LEASE"].total_seconds()))
    max_ttl = int(settings.CAPGATE["MAX_REQUEST_LIFETIME"].total_seconds())
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= max_ttl:
        raise bad_request(f"'ttl_seconds' must be an integer between 1 and {max_ttl}.", param="ttl_seconds")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string.", param="model")
    lease = timedelta(seconds=ttl)
    shape, targets, amount = None, None, None
    if "amount_usd" in body:
        amount = _usd(body["amount_usd"], "amount_usd", round_up=True)  # a worst case rounds up
    else:
        if not model:
            raise bad_request("Give 'amount_usd', or a 'model' with 'messages' or token bounds.", param="model")
        targets = resolve_route(key=key, name=model, kind="chat")
        if "messages" in body:
            shape = shape_chat({k: v for k, v in body.items() if k not in OWN_FIELDS})
        else:
            shape = Shape(
                kind="chat",
                model=model,
                text_tokens=_int(body, "input_tokens"),
                images=0,
                unbounded_parts=0,
                max_output=_int(body, "max_output_tokens", low=1),
                output_param=None,
                choices=1,
                stream=False,
            )
    who = payer(
        key=key,
        customer_id=headers.get("x-capgate-customer"),
        run_id=headers.get("x-capgate-run"),
        run_budget_usd=headers.get("x-capgate-run-budget-usd"),
    )
    try:
        # Sized and admitted as the proxy sizes and admits, except that the caller makes the call.
        admission = admit(
            payer=who,
            request_id=request_id,
            model=model,
            shape=shape,
            targets=targets,
            amount_nano=amount,
            proxied=False,
            lease=lease,
            origin=Reservation.Origin.API,
        )
    except IntegrityError:
        # The same request id admitted concurrently: the unique request id kept it to one
        # reservation (this statement changed nothing); answer with that one.
        existing = Reservation.objects.filter(request_id=request_id, organization_id=key.organization_id).first()
        if existing is None:
            raise
        return 200, view(existing)
    return 201, view(admission.reservation)


def _caller(raw_key: str | None) -> ApiKey | ApiToken:
    """A gateway key, or a management-API token of the organization (write scope to act)."""
    if raw_key and raw_key.startswith(TOKEN_PREFIX):
        token = authenticate_token(raw_key)
        if token is None:
            raise GatewayError("Invalid API token.", code="invalid_api_key", status=401)
        if not token.can_write:
            raise GatewayError(
                "A read-only token cannot settle or release reservations.", code="read_only_token", status=403
            )
        if token.role not in MANAGERS:  # a write token acts with its member's role, now below admin
            raise GatewayError(
                "This token's member is no longer an owner or admin: it cannot settle or release reservations.",
                code="token_role_too_low",
                status=403,
            )
        return token
    return authenticate(raw_key)


def _find(caller: ApiKey | ApiToken, reservation_id: str) -> tuple[Reservation | None, UsageRecord | None]:
    """The reservation (live) or its record (settled), after checking the caller may act on it."""
    try:
        rid = uuid.UUID(reservation_id)
    except ValueError:
        raise GatewayError("No such reservation.", code="reservation_not_found", status=404) from None
    org_id = caller.organization_id
    reservation = Reservation.objects.filter(id=rid, organization_id=org_id).first()
    rec = UsageRecord.objects.filter(reservation_id=rid, organization_id=org_id).first()
    if reservation is None and rec is None:
        raise GatewayError("No such reservation.", code="reservation_not_found", status=404)
    if GUARDS.check_owner:
        if reservation is not None:
            from_api, key_id = reservation.origin == Reservation.Origin.API, reservation.api_key_id
        else:
            assert rec is not None
            # The API namespaces its request ids by organization; the gateway's start with "req_".
            from_api, key_id = rec.request_id.startswith(f"{org_id}:"), rec.api_key_id
        if not from_api:
            raise GatewayError(
                "This reservation belongs to a call the gateway proxies; only that call settles it.",
                code="reservation_owned_by_gateway",
                status=409,
            )
        if isinstance(caller, ApiKey) and key_id != caller.id:
            raise GatewayError(
                "Only the key that made this reservation (or a write token) can settle or release it.",
                code="not_reservation_owner",
                status=403,
            )
    return reservation, rec


def _audited(caller: ApiKey | ApiToken, action: str, rec: UsageRecord) -> None:
    actor = Actor.of_token(caller) if isinstance(caller, ApiToken) else key_actor(caller)
    entry = Reservation(id=rec.reservation_id, request_id=rec.request_id)
    audit(
        organization=caller.organization,
        actor=actor,
        action="update",
        obj=entry,
        changes={
            "status": ["reserved", rec.status],
            "cost_nano": [rec.reserved_nano, rec.cost_nano],
            "request_id": [None, rec.request_id.split(":", 1)[-1]],
            "by": [None, action],
        },
    )


def _already(rec: UsageRecord, action: str) -> tuple[int, dict]:
    """The first settle or release is final: the same again returns it, the other is a 409."""
    released = rec.status == UsageRecord.Status.RELEASED
    if (action == "release") == released:
        return 200, record_view(rec)
    if released:
        raise GatewayError(
            "This reservation was released; it cannot be settled now.", code="reservation_released", status=409
        )
    raise GatewayError(
        "This reservation was settled; it cannot be released now.", code="reservation_settled", status=409
    )


def _live_or_expired(reservation: Reservation | None, rec: UsageRecord | None) -> Reservation:
    """The live reservation, or one that expired and was charged at worst case, rebuilt from its
    record: a true report (settle or release) corrects that charge once (ledger/recording.py)."""
    if reservation is not None:
        return reservation
    assert rec is not None  # _find raises when both are missing
    return Reservation(
        id=rec.reservation_id,
        request_id=rec.request_id,
        organization_id=rec.organization_id,
        amount_nano=rec.reserved_nano,
        created_at=rec.admitted_at,
        model=rec.model,
    )


def _reported(body: dict, reservation: Reservation) -> tuple[int, Usage]:
    """The cost a settle reports: `cost_usd`, or `usage` priced at the route's first target."""
    if "cost_usd" in body:
        return _usd(body["cost_usd"], "cost_usd", round_up=False), Usage()
    if not isinstance(body.get("usage"), dict):
        raise bad_request("Give 'usage' (token counts) or 'cost_usd'.", param="usage")
    u = body["usage"]
    counts = {
        f: _int(u, f) if f in u else 0
        for f in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    }
    usage = Usage(
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_tokens"],
        cache_write_tokens=counts["cache_write_tokens"],
    )
    target, rates = settle_rates(reservation=reservation)
    if rates is None:
        raise bad_request("This reservation has no priced route: settle with 'cost_usd'.", param="usage")
    return cost_nano(usage=usage, rates=rates), usage


def _settled_before(rec: UsageRecord, cost: int) -> tuple[int, dict]:
    """A settle of a reservation already settled: the same cost again returns the first result;
    another cost is a conflict — 409 to this caller, kept once on the record, never applied."""
    if rec.cost_nano == cost or not GUARDS.record_conflicts_apart:
        return 200, record_view(rec)
    note_conflict(record_id=rec.pk, cost_nano=cost)
    raise GatewayError(
        f"This reservation was settled at ${usd_str(rec.cost_nano)}; a settle at ${usd_str(cost)} conflicts with it "
        "and is not applied (the first settle is final).",
        code="reservation_settle_conflict",
        status=409,
    )


def settle(*, raw_key: str | None, reservation_id: str, body: dict) -> tuple[int, dict]:
    """Settle with `usage` (priced at the route's first target) or `cost_usd`.

    1. The first settle is final (a settle after expiry corrects the worst-case charge once).
    2. Settling again at the same cost returns the first result; at another cost — sequentially
       or racing the first — it is 409 `reservation_settle_conflict`, kept once on the record.
    3. Settling a released reservation is a 409."""
    caller = _caller(raw_key)
    reservation, rec = _find(caller, reservation_id)
    if rec is not None and rec.status == UsageRecord.Status.RELEASED:
        return _already(rec, "settle")
    reservation = _live_or_expired(reservation, rec)
    cost, usage = _reported(body, reservation)
    if rec is not None and rec.status != UsageRecord.Status.ESTIMATED:
        return _settled_before(rec, cost)
    rec = record(
        reservation=reservation,
        outcome=Outcome(status="served", cost_nano=cost, usage=usage),
        keep_late_report=not GUARDS.record_conflicts_apart,
    )
    if GUARDS.record_conflicts_apart and rec.status == UsageRecord.Status.SERVED and rec.cost_nano != cost:
        return _settled_before(rec, cost)  # a concurrent settle of this reservation won

    drain(request_ids=[rec.request_id])
    rec.refresh_from_db()
    if rec.status == UsageRecord.Status.RELEASED:  # a release won the race
        return _already(rec, "settle")
    _audited(caller, "settle", rec)
    return 200, record_view(rec)


def release_reservation(*, raw_key: str | None, reservation_id: str) -> tuple[int, dict]:
    """Release unused: a zero-cost record. After expiry it corrects the worst-case charge to zero
    (once); after a settle it is a 409."""
    caller = _caller(raw_key)
    reservation, rec = _find(caller, reservation_id)
    if rec is not None and rec.status != UsageRecord.Status.ESTIMATED:
        return _already(rec, "release")
    reservation = _live_or_expired(reservation, rec)
    rec = release(reservation=reservation, error="released by caller")
    if rec.status != UsageRecord.Status.RELEASED:  # a settle won the race
        return _already(rec, "release")
    _audited(caller, "release", rec)
    return 200, record_view(rec)
