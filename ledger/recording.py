"""Recording outcomes: the request path's one cheap insert into the outbox.

No locks here: the drain (ledger/drain.py) applies records to windows in batches.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.backends.utils import CursorWrapper
from django.db.models import F, Model, Q
from django.utils import timezone

from catalog.models import Connection
from catalog.pricing import Usage
from core.guards import Guards
from ledger.carving import CARVE_CTES, carve
from ledger.charged_slices import settle_charged_slices
from ledger.drain import drain
from ledger.locks import claim_lapsed, lock_windows, record_for_update, relaxed_commit
from ledger.models import Charged, Reservation, UsageRecord, Window, unsaved
from ledger.scopes import CHARGED_COLUMNS
from ledger.signals import send_after_commit
from ledger.slice_claims import fence_dead_slices, settle_fenced_slices
from tenants.models import AuditLogEntry, Organization

Status = UsageRecord.Status
log = logging.getLogger(__name__)
M = TypeVar("M", bound=Model)

# Outcomes that carry a report of what the call cost (from the provider, or the caller who
# called it): the per-request audit compares them with the recorded cost.
REPORTED = (Status.SERVED, Status.FAILED_UPSTREAM)
# The record's subject references (the Charged columns that reference a row), with the model
# name the tenants audit log uses for each.
_SUBJECT_FIELDS = [f for f in Charged._meta.local_fields if f.is_relation and f.name != "organization"]
_SUBJECT_MODELS = {
    cast(type[Model], f.related_model)._meta.model_name or "": cast(type[Model], f.related_model)
    for f in _SUBJECT_FIELDS
}
SUBJECT_REFS = tuple((f.name, cast(type[Model], f.related_model)._meta.model_name or "") for f in _SUBJECT_FIELDS)


class RecordRejected(Exception):
    """A usage record the database refused for a reason other than being unreachable.

    Deliberately not a DatabaseError: the gateway spools DatabaseErrors to disk for replay, and
    replaying a record the database will always refuse would retry it forever."""


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
    input_bound: str = ""  # how the reserved prompt was bounded: "exact", "bytes" ("" unknown)


def record_values(*, reservation: Reservation, outcome: Outcome) -> dict[str, Any]:
    """The usage record of this outcome, as {attname: value} of every field the request decides
    (all but the id, created_at and the drain's fields: applied, applied_at, window_ids, and the
    reservation API's conflicting_cost_nano)."""
    if outcome.cost_nano < 0:
        raise ValueError("cost must be >= 0")
    usage = outcome.usage
    return {
        **{c: getattr(reservation, c) for c in CHARGED_COLUMNS},
        "request_id": reservation.request_id,
        "subject": {
            name: {"id": ref} for name, _ in SUBJECT_REFS if (ref := getattr(reservation, f"{name}_id")) is not None
        },
        "reservation_id": reservation.id,
        "connection_id": outcome.connection_id,
        "model": reservation.model,
        "provider_model": outcome.provider_model,
        "status": outcome.status,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "cost_nano": outcome.cost_nano,
        "reserved_nano": reservation.amount_nano,
        "excess_nano": max(0, outcome.cost_nano - reservation.amount_nano),
        "reported_cost_nano": outcome.cost_nano if outcome.status in REPORTED else None,
        "error": outcome.error,
        "latency_ms": outcome.latency_ms,
        "input_bound": outcome.input_bound,
        "job_id": reservation.job_id,
        "admitted_at": reservation.created_at,
    }


def build_record(*, reservation: Reservation, outcome: Outcome) -> UsageRecord:
    return UsageRecord(**record_values(reservation=reservation, outcome=outcome))


def record(*, reservation: Reservation, outcome: Outcome, keep_late_report: bool = True) -> UsageRecord:
    """Insert the request's usage record (the outbox row). Idempotent by request id.

    If a record already exists: an `estimated` one (expiry charged the worst case first) is
    corrected by this true report; anything else is returned unchanged — settling twice
    returns the first result — and a report that disagrees with it is kept on it
    (`reported_cost_nano`) for the per-request audit, never silently dropped. With
    `keep_late_report=False` the caller answers such a report itself (the reservation API
    refuses it as a conflict, `note_conflict`) and it is not kept for the audit.

    A subject (project, member, key, end customer) or connection deleted while the request was
    in flight does not lose the record: its reference is cleared, its id and name stay frozen in
    `subject`. Any other refusal is logged once and raised as RecordRejected (never spooled).
    """
    result = record_many(items=[(reservation, outcome)], keep_late_report=keep_late_report)[0]
    if isinstance(result, Exception):
        raise result
    return result


# Removal tests: tests/ledger/test_record_batch.py, tests/gateway/test_admin_actions.py.
GUARDS = Guards(
    split_refused_batch="a batch the database refuses as a whole is written again record by record, "
    "so one bad record cannot lose the others",
    detach_deleted_subjects="a record whose subject was deleted in flight is kept with the reference "
    "cleared, not lost with its spend",
)


def record_many(
    *, items: Sequence[tuple[Reservation, Outcome]], keep_late_report: bool = True
) -> list[UsageRecord | Exception]:
    """`record` for several requests at once (the gateway's group commit, gateway/upstream/recorder.py):
    one INSERT for all of them, in one round trip with a relaxed commit (see relaxed_commit).
    Returns each item's record, or the exception it earned (RecordRejected, or ValueError for a
    negative cost), in order. A DatabaseError (database unreachable) is raised for the whole
    batch: the callers spool their records.

    The gateway may run the batch's statement itself, on the event loop's own connection
    (gateway/upstream/loopdb.py): it calls `prepare_batch`, executes the batch's `sql` with its
    `params` and finishes with `complete_batch`, which is what this does on a thread's connection."""
    batch = prepare_batch(items, keep_late_report=keep_late_report)
    if not batch.todo:
        return batch.out
    if connection.in_atomic_block:  # a caller's transaction (tests, release): the careful path
        return record_each(batch)
    try:
        with _server_cursor() as cursor:
            cursor.execute(batch.sql, batch.params)
            result = cursor.fetchone()
    except IntegrityError:
        if not GUARDS.split_refused_batch:
            raise
        return record_each(batch)
    return complete_batch(batch, result)


@dataclass
class Batch:
    """A group commit's records, built and not yet written: the one statement and its two
    parameters (_insert_sql), and where each item's result goes."""

    out: list[UsageRecord | Exception]  # each item's result, in order (filled in by complete_batch)
    todo: list[tuple[int, UsageRecord, Outcome, Reservation]]  # the items to write, by index in `out`
    carved: list[Reservation]  # those to carve from their slices in the same statement
    sql: str
    params: list[Any]
    keep_late_report: bool = True


def prepare_batch(items: Sequence[tuple[Reservation, Outcome]], *, keep_late_report: bool = True) -> Batch:
    """The records of `items` and the statement that writes them. Reads nothing from the
    database, so any thread (or the event loop) may call it. An item with a negative cost gets its
    ValueError in `out` and is not written."""
    out: list[UsageRecord | Exception] = []
    todo: list[tuple[int, UsageRecord, Outcome, Reservation]] = []
    now = timezone.now()
    for i, (reservation, outcome) in enumerate(items):
        try:
            todo.append((i, _unsaved_record(reservation, outcome, now), outcome, reservation))
            out.append(RecordRejected("not written"))  # replaced by complete_batch
        except ValueError as exc:
            out.append(exc)
    carved = [r for _, _, _, r in todo if r.slice_id is not None and not r.carved]
    sql, attnames = _insert_sql(carving=bool(carved))
    writers = _json_writers(attnames)
    rows = []
    for _, row, _, reservation in todo:
        values = row.__dict__
        item = [values[a] for a in attnames]
        for i, write in writers:
            item[i] = write(item[i])
        if carved:
            item.append(None if reservation.slice_id is None or reservation.carved else str(reservation.slice_id))
        rows.append(item)
    params = [json.dumps(rows), now] if todo else []
    return Batch(out=out, todo=todo, carved=carved, sql=sql, params=params, keep_late_report=keep_late_report)


def complete_needs_database(batch: Batch, result: tuple[int, list | None, list | None]) -> bool:
    """Whether completing `batch` after its statement returned `result` reads or writes the
    database: some request was recorded before (or twice in the batch), or some slice was charged
    whole by expiry before its carve. Otherwise `complete_batch` only fills in ids."""
    n, request_ids, _ = result
    return n < len(batch.carved) or len(request_ids or []) < len(batch.todo)


def complete_batch(batch: Batch, result: tuple[int, list | None, list | None]) -> list[UsageRecord | Exception]:
    """Each item's record once `batch.sql` has committed and returned `result` (how many were
    carved, and the request ids and ids of the rows it inserted)."""
    n, request_ids, ids = result
    inserted = dict(zip(request_ids or [], ids or [], strict=True))
    if n < len(batch.carved):  # recorded before, or the slice was charged whole by expiry
        log.info("%d of %d requests not carved from their slices", len(batch.carved) - n, len(batch.carved))
        costs = {row.request_id: row.cost_nano for _, row, _, _ in batch.todo}
        settle_charged_slices(carved=batch.carved, costs=costs, inserted=list(inserted))
    out = batch.out
    for i, row, outcome, reservation in batch.todo:
        pk = inserted.pop(row.request_id, None)
        if pk is None:  # recorded before (or twice in this batch): the first record wins
            existing = UsageRecord.objects.filter(request_id=row.request_id).first()
            out[i] = (
                _second_report(existing, outcome, batch.keep_late_report)
                if existing is not None
                else _record_one(row, outcome, reservation, batch.keep_late_report)
            )
            continue
        row.pk = pk
        row._state.adding = False
        row._state.db = "default"
        out[i] = row
    return out


def record_each(batch: Batch) -> list[UsageRecord | Exception]:
    """The batch's records one at a time through the ORM (a batch the database refused as a whole,
    or a caller's transaction): one bad record cannot lose the others."""
    for i, row, outcome, reservation in batch.todo:
        batch.out[i] = _record_one(row, outcome, reservation, batch.keep_late_report)
    return batch.out


def _unsaved_record(reservation: Reservation, outcome: Outcome, now: datetime) -> UsageRecord:
    values = record_values(reservation=reservation, outcome=outcome)
    values.update(id=None, created_at=now, **{name: value() for name, (value, _) in _AT_INSERT.items()})
    return unsaved(UsageRecord, values)


# The fields no request decides, with the value and the SQL the insert writes for each (the drain
# and the reservation API set them later).
_AT_INSERT: dict[str, tuple[Callable[[], Any], str]] = {
    "conflicting_cost_nano": (lambda: None, "NULL"),
    "applied": (lambda: False, "false"),
    "applied_at": (lambda: None, "NULL"),
    "window_ids": (list, "'{}'::bigint[]"),
}


@functools.cache
def _insert_sql(*, carving: bool) -> tuple[str, tuple[str, ...]]:
    """The group commit's one statement, and the attnames of the values each row gives, in order.

    One text whatever the batch's size, and two parameters: the rows as one JSON array of arrays
    (values in the order returned, then the slice id with `carving`) and the batch's created_at.
    Python's C encoder writes that in a fraction of what binding ~27 values per row costs (quoted
    into a new text for every batch, or dumped array element by element), and psycopg converts
    the one text's placeholders once. `synchronous_commit` is set inside the statement
    (set_config, local: what relaxed_commit's SET LOCAL does, without a second statement), so
    the statement is its own implicit transaction and one round trip. With `carving`, the
    requests admitted from a headroom slice (their `slice_id`, else null) are carved out of it by
    the same statement (ledger/carving.py CARVE_CTES), so a record and its carve commit or vanish
    together. Returns one row: how many were carved, and the request ids and ids of the rows
    inserted."""
    fields = [f for f in UsageRecord._meta.concrete_fields if not f.primary_key]
    given = [f for f in fields if f.attname not in _AT_INSERT and f.attname != "created_at"]
    fixed = [f for f in fields if f.attname in _AT_INSERT]
    qn = connection.ops.quote_name
    values = [
        # ->> gives text, which every column type reads; a JSON field's value stays JSON. A
        # string is cast without its length: a cast to varchar(n) would cut a long value short,
        # where the insert refuses it, as the ORM's does.
        f"(e->{i})::jsonb AS {qn(f.attname)}"
        if f.db_type(connection) == "jsonb"
        else f"(e->>{i})::{'varchar' if isinstance(f, models.CharField) else f.db_type(connection)} AS {qn(f.attname)}"
        for i, f in enumerate(given)
    ] + ([f"(e->>{len(given)})::uuid AS slice_id"] if carving else [])
    carve = (
        f"item AS (SELECT reservation_id AS id, request_id, slice_id, reserved_nano AS amount_nano, model,"
        f" admitted_at AS created_at FROM rec WHERE slice_id IS NOT NULL), {CARVE_CTES},"
        if carving
        else ""
    )
    sql = f"""
WITH relaxed AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
rec AS MATERIALIZED (SELECT {", ".join(values)} FROM jsonb_array_elements(%s::jsonb) e),
{carve}
ins AS (
    INSERT INTO {qn(UsageRecord._meta.db_table)}
           ({", ".join(qn(str(f.column)) for f in given)}, created_at, {", ".join(qn(str(f.column)) for f in fixed)})
    SELECT {", ".join(qn(f.attname) for f in given)}, %s::timestamptz,
           {", ".join(_AT_INSERT[f.attname][1] for f in fixed)}
      FROM rec
    ON CONFLICT (request_id) DO NOTHING
    RETURNING request_id, id
)
SELECT {"(SELECT count(*) FROM carved)" if carving else "0"}, i.request_ids, i.ids
  FROM relaxed, (SELECT array_agg(request_id) AS request_ids, array_agg(id) AS ids FROM ins) i
"""
    return " ".join(sql.split()), tuple(f.attname for f in given)


def _server_cursor() -> CursorWrapper:
    """A cursor of this thread's connection that binds parameters on the server (Django's own
    binds them into the text on the client, escaping each one): the rows go as one parameter.
    Wrapped as connection.cursor() wraps its own, so errors are Django's and execute wrappers
    see the statement. (`connections[...]` once: each attribute read through the `connection`
    proxy looks the thread's connection up again.)"""
    db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors:
        return db._prepare_cursor(ServerBindingCursor(db.connection))  # type: ignore[attr-defined, call-arg]


def _uuid_text(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


def _time_text(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@functools.cache
def _json_writers(attnames: tuple[str, ...]) -> tuple[tuple[int, Callable[[Any], str | None]], ...]:
    """For the values JSON cannot hold as they are, their index and how each is written: a uuid
    as text, a time in full (ISO 8601 with microseconds and offset, which timestamptz reads back
    exactly)."""
    out: list[tuple[int, Callable[[Any], str | None]]] = []
    for i, attname in enumerate(attnames):
        field = UsageRecord._meta.get_field(attname)
        if isinstance(field, models.UUIDField):
            out.append((i, _uuid_text))
        elif isinstance(field, models.DateTimeField):
            out.append((i, _time_text))
    return tuple(out)


def _record_one(
    row: UsageRecord, outcome: Outcome, reservation: Reservation, keep_late_report: bool = True
) -> UsageRecord | RecordRejected:
    """One record through the ORM, detaching subjects deleted in flight."""
    try:
        return _save_one(row, outcome, reservation, keep_late_report)
    except RecordRejected as exc:
        return exc


def _save_one(row: UsageRecord, outcome: Outcome, reservation: Reservation, keep_late_report: bool) -> UsageRecord:
    for attempt in range(2):
        try:
            with transaction.atomic():  # a savepoint when called inside a transaction
                relaxed_commit()
                carve([reservation])  # admitted from a headroom slice: carved with its record
                row.save(force_insert=True)
            return row
        except IntegrityError as exc:
            existing = UsageRecord.objects.filter(request_id=row.request_id).first()
            if existing is not None:
                return _second_report(existing, outcome, keep_late_report)
            if attempt == 0 and _is_foreign_key_violation(exc) and _detach_deleted(row):
                row.pk = None
                continue
            log.error("usage record %s rejected by the database (not spooled): %s", row.request_id, exc)
            raise RecordRejected(f"usage record {row.request_id} rejected: {exc}") from exc
    raise AssertionError("unreachable")


def _second_report(existing: UsageRecord, outcome: Outcome, keep_late_report: bool = True) -> UsageRecord:
    if existing.status == Status.ESTIMATED:
        return correct_estimate(record_id=existing.pk, outcome=outcome)
    if keep_late_report and outcome.status in REPORTED and outcome.cost_nano != existing.cost_nano:
        log.warning(
            "usage record %s is final at %s nano; a later report of %s nano is kept for the audit",
            existing.request_id,
            existing.cost_nano,
            outcome.cost_nano,
        )
        UsageRecord.objects.filter(pk=existing.pk).update(reported_cost_nano=outcome.cost_nano)
        existing.reported_cost_nano = outcome.cost_nano
    return existing


def note_conflict(*, record_id: int, cost_nano: int) -> None:
    """Keep a conflicting settle on a final record: the first one only, so a client retrying
    with another cost writes once, and never as the record's cost (the first settle stands).
    The per-request audit does not count it: it is answered (409), not lost."""
    UsageRecord.objects.filter(pk=record_id, conflicting_cost_nano__isnull=True).exclude(cost_nano=cost_nano).update(
        conflicting_cost_nano=cost_nano
    )


def _is_foreign_key_violation(exc: IntegrityError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == "23503"


def _detach_deleted(row: UsageRecord) -> bool:
    """Clear references to subjects (and the connection) deleted since admission, keeping each
    one's id and name frozen in `row.subject`. False if nothing was missing or the organization
    itself is gone (then there is nothing left to charge)."""
    if not GUARDS.detach_deleted_subjects:
        return False
    if not Organization.objects.filter(pk=row.organization_id).exists():
        return False
    detached = False
    for name, model_name in SUBJECT_REFS:
        ref = getattr(row, f"{name}_id")
        model = _SUBJECT_MODELS[model_name]
        if ref is not None and not model._default_manager.filter(pk=ref).exists():
            setattr(row, f"{name}_id", None)
            row.subject[name] = {"id": ref, "name": deleted_name(row.organization_id, model_name, ref)}
            detached = True
    if row.connection_id is not None and not Connection.objects.filter(pk=row.connection_id).exists():
        row.connection_id = None
        detached = True
    return detached


def freeze_subject_name(sender: Any, *, organization_id: int, name: str, pk: int, label: str, **kwargs: Any) -> None:
    """Write a subject's name into the `subject` of its usage records before it is deleted (their
    foreign key then goes NULL; the id and name stay). Connected to tenants' `subject_deleting`
    (ledger/apps.py), sent inside the deletion's transaction."""
    if name not in {ref for ref, _ in SUBJECT_REFS}:
        raise ValueError(f"not a subject reference: {name!r}")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {UsageRecord._meta.db_table} SET subject = jsonb_set(subject, %s, %s::jsonb)"
            f" WHERE organization_id = %s AND {name}_id = %s",
            [[name], json.dumps({"id": pk, "name": label[:300]}), organization_id, pk],
        )


def deleted_name(organization_id: int, model_name: str, pk: int) -> str:
    """The name a deleted subject had, from the audit entry of its deletion."""
    entry = (
        AuditLogEntry.objects.filter(
            organization_id=organization_id, object_type=model_name, object_id=str(pk), action="delete"
        )
        .order_by("-id")
        .first()
    )
    return entry.object_repr if entry is not None else ""


def correct_estimate(*, record_id: int, outcome: Outcome) -> UsageRecord:
    """Replace an `estimated` record's cost with a true report, once.

    1. Lock the record (waits for a drain that holds it; after that it is applied or not).
    2. If it is no longer estimated, someone corrected it already: return it.
    3. If it was applied, add the difference to the same windows it was charged to, locked in
       id order; then update the record in place (never a second record).
    """
    with transaction.atomic():
        rec = record_for_update(record_id)
        if rec.status != Status.ESTIMATED or outcome.status == Status.ESTIMATED:
            return rec
        delta = outcome.cost_nano - rec.cost_nano
        if rec.applied and delta and rec.window_ids:
            lock_windows(rec.window_ids)
            Window.objects.filter(id__in=rec.window_ids).update(spent_nano=F("spent_nano") + delta)
        rec.status = outcome.status
        rec.cost_nano = outcome.cost_nano
        rec.excess_nano = max(0, outcome.cost_nano - rec.reserved_nano)
        rec.reported_cost_nano = outcome.cost_nano if outcome.status in REPORTED else None
        rec.input_tokens = outcome.usage.input_tokens
        rec.output_tokens = outcome.usage.output_tokens
        rec.cache_read_tokens = outcome.usage.cache_read_tokens
        rec.cache_write_tokens = outcome.usage.cache_write_tokens
        rec.connection_id = outcome.connection_id or rec.connection_id
        rec.provider_model = outcome.provider_model or rec.provider_model
        rec.error = outcome.error
        rec.save()
        if rec.applied and delta > 0 and rec.window_ids:
            send_after_commit(window_ids=rec.window_ids)
        return rec


def release(*, reservation: Reservation, error: str = "") -> UsageRecord:
    """Give a reservation's room back: a zero-cost `released` record, applied at once."""
    rec = record(reservation=reservation, outcome=Outcome(status=Status.RELEASED, error=error))
    drain(request_ids=[rec.request_id])
    rec.refresh_from_db()
    return rec


def expire(
    *,
    now: datetime | None = None,
    limit: int = 1000,
    dead_owner_ids: Sequence[int] = (),
    dead_owner_seen_before: datetime | None = None,
) -> int:
    """Charge lapsed reservations at their worst case, as `estimated`: the call may have gone
    out, and charging is the safe direction. A later true report corrects it.

    Lapsed: the lease ran out, the hard deadline passed, or the owning gateway process is dead
    (`dead_owner_ids`: stopped heartbeating past the grace) — so a crash settles within the
    grace, not a whole lease later. With `dead_owner_seen_before`, only a dead owner's
    reservations made before then are charged: one made later proves its owner was alive then
    (a process judged dead on a stale heartbeat keeps what it admitted since).

    A reservation whose usage record already exists (applied or not) is never touched: the
    insert is ON CONFLICT DO NOTHING on the unique request id, so two expiries racing charge
    once. Returns the records this call inserted.
    """
    now = now or timezone.now()
    if dead_owner_ids:
        # A dead owner's slices keep only their requests in flight (ledger/slice_claims.py). The
        # fence commits on its own before the claims are read.
        fence_dead_slices(dead_owner_ids=dead_owner_ids, now=now, seen_before=dead_owner_seen_before)
    settle_fenced_slices()
    # A fenced slice not settled yet (another expiry holds it) is settled next time, never
    # charged whole.
    fenced = Q(origin=Reservation.Origin.SLICE, owner__isnull=True)
    lapsed_q = (Q(expires_at__lt=now) | Q(deadline_at__lt=now)) & ~fenced
    if dead_owner_ids:
        dead_q = Q(owner_id__in=list(dead_owner_ids))
        if dead_owner_seen_before is not None:
            dead_q &= Q(created_at__lt=dead_owner_seen_before)
        lapsed_q |= dead_q
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
