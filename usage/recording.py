"""Recording outcomes: the request path's one cheap insert into the outbox.

No locks here: the drain (usage/drain.py) applies records to windows in batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from budgets.admission import windows_for_update
from budgets.models import Reservation, Window
from catalog.pricing import Usage
from usage.models import UsageRecord

Status = UsageRecord.Status


@dataclass(frozen=True)
class Outcome:
    """What happened to an admitted request, as the gateway (or a caller) reports it."""

    status: str
    cost_nano: int = 0
    usage: Usage = Usage()
    connection_id: int | None = None
    provider_model: str = ""
    error: str = ""
    latency_ms: int | None = None


def build_record(*, reservation: Reservation, outcome: Outcome) -> UsageRecord:
    if outcome.cost_nano < 0:
        raise ValueError("cost must be >= 0")
    return UsageRecord(
        request_id=reservation.request_id,
        organization_id=reservation.organization_id,
        project_id=reservation.project_id,
        member_id=reservation.member_id,
        api_key_id=reservation.api_key_id,
        end_customer_id=reservation.end_customer_id,
        run_id=reservation.run_id,
        reservation_id=reservation.id,
        model=reservation.model,
        connection_id=outcome.connection_id,
        provider_model=outcome.provider_model,
        status=outcome.status,
        input_tokens=outcome.usage.input_tokens,
        output_tokens=outcome.usage.output_tokens,
        cache_read_tokens=outcome.usage.cache_read_tokens,
        cache_write_tokens=outcome.usage.cache_write_tokens,
        cost_nano=outcome.cost_nano,
        reserved_nano=reservation.amount_nano,
        excess_nano=max(0, outcome.cost_nano - reservation.amount_nano),
        error=outcome.error,
        latency_ms=outcome.latency_ms,
        admitted_at=reservation.created_at,
    )


def record(*, reservation: Reservation, outcome: Outcome) -> UsageRecord:
    """Insert the request's usage record (the outbox row). Idempotent by request id.

    If a record already exists: an `estimated` one (expiry charged the worst case first) is
    corrected by this true report; anything else is returned unchanged — settling twice
    returns the first result.
    """
    row = build_record(reservation=reservation, outcome=outcome)
    try:
        with transaction.atomic():  # a savepoint when called inside a transaction
            relaxed_commit()
            row.save(force_insert=True)
        return row
    except IntegrityError:
        existing = UsageRecord.objects.filter(request_id=row.request_id).first()
        if existing is None:
            raise  # some other constraint: a bug, not a duplicate
    return correct_estimate(record_id=existing.pk, outcome=outcome)


def relaxed_commit() -> None:
    """Let this transaction's commit return before its WAL reaches disk.

    Only for writes whose loss in a database crash errs on the safe side: a lost usage record
    leaves its reservation (committed durably at admission) to be charged at worst case when it
    lapses; a lost drain leaves records unapplied and holds in place, to be drained again. The
    admission statement itself always commits durably. Inside an outer transaction this applies
    to that whole transaction, so callers that need durability must not nest it.
    """
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")


def correct_estimate(*, record_id: int, outcome: Outcome) -> UsageRecord:
    """Replace an `estimated` record's cost with a true report, once.

    1. Lock the record (waits for a drain that holds it; after that it is applied or not).
    2. If it is no longer estimated, someone corrected it already: return it.
    3. If it was applied, add the difference to the same windows it was charged to, locked in
       id order; then update the record in place (never a second record).
    """
    with transaction.atomic():
        rec = UsageRecord.objects.select_for_update().get(pk=record_id)
        if rec.status != Status.ESTIMATED or outcome.status == Status.ESTIMATED:
            return rec
        delta = outcome.cost_nano - rec.cost_nano
        if rec.applied and delta and rec.window_ids:
            list(windows_for_update(rec.window_ids).values_list("id", flat=True))
            Window.objects.filter(id__in=rec.window_ids).update(spent_nano=F("spent_nano") + delta)
        rec.status = outcome.status
        rec.cost_nano = outcome.cost_nano
        rec.excess_nano = max(0, outcome.cost_nano - rec.reserved_nano)
        rec.input_tokens = outcome.usage.input_tokens
        rec.output_tokens = outcome.usage.output_tokens
        rec.cache_read_tokens = outcome.usage.cache_read_tokens
        rec.cache_write_tokens = outcome.usage.cache_write_tokens
        rec.connection_id = outcome.connection_id or rec.connection_id
        rec.provider_model = outcome.provider_model or rec.provider_model
        rec.error = outcome.error
        rec.save()
        if rec.applied and delta > 0 and rec.window_ids:
            from usage.alerts import on_windows_changed

            transaction.on_commit(lambda: on_windows_changed(window_ids=rec.window_ids), robust=True)
        return rec


def release(*, reservation: Reservation, error: str = "") -> UsageRecord:
    """Give a reservation's room back: a zero-cost `released` record, applied at once."""
    from usage.drain import drain

    rec = record(reservation=reservation, outcome=Outcome(status=Status.RELEASED, error=error))
    drain(request_ids=[rec.request_id])
    rec.refresh_from_db()
    return rec


def claim_lapsed(condition: Q, *, limit: int) -> list[Reservation]:
    """Lock lapsed reservations for this expiry run, skipping those another run holds."""
    return list(Reservation.objects.select_for_update(skip_locked=True).filter(condition).order_by("expires_at")[:limit])


def expire(*, now: datetime | None = None, limit: int = 1000, dead_owner_ids: Sequence[int] = ()) -> int:
    """Charge lapsed reservations at their worst case, as `estimated`: the call may have gone
    out, and charging is the safe direction. A later true report corrects it.

    Lapsed: the lease ran out, the hard deadline passed, or the owning gateway process is dead
    (`dead_owner_ids`: stopped heartbeating past the grace) — so a crash settles within the
    grace, not a whole lease later.

    A reservation whose usage record already exists (applied or not) is never touched: the
    insert is ON CONFLICT DO NOTHING on the unique request id, so two expiries racing charge
    once. Returns the records this call inserted.
    """
    from usage.drain import drain

    now = now or timezone.now()
    lapsed_q = Q(expires_at__lt=now) | Q(deadline_at__lt=now)
    if dead_owner_ids:
        lapsed_q |= Q(owner_id__in=list(dead_owner_ids))
    with transaction.atomic():
        # Claim the lapsed reservations: concurrent expiries skip each other's, so each
        # reservation is considered by one of them and the count below is this call's own.
        lapsed = claim_lapsed(lapsed_q, limit=limit)
        if not lapsed:
            return 0
        have = set(
            UsageRecord.objects.filter(request_id__in=[r.request_id for r in lapsed]).values_list(
                "request_id", flat=True
            )
        )
        fresh = [
            build_record(
                reservation=r,
                outcome=Outcome(
                    status=Status.ESTIMATED, cost_nano=r.amount_nano, error="lease expired: charged at worst case"
                ),
            )
            for r in lapsed
            if r.request_id not in have
        ]
        # A gateway recording the same request at this moment wins or loses on the unique
        # request id; either way one record exists (a true report corrects an estimate).
        UsageRecord.objects.bulk_create(fresh, ignore_conflicts=True)
    drain(request_ids=[r.request_id for r in lapsed])
    return len(fresh)
