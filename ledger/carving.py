"""Headroom slices, the database side: carving a request out of its slice with its usage record,
giving a slice's unused part back, and recalling other processes' slices. The process side (what
a gateway process holds in memory, and when it takes, retires and closes a slice) is
ledger/slices.py, whose docstring tells the whole life of a slice."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, connection

from ledger.errors import SubjectGone
from ledger.locks import WINDOW_LOCK_STRENGTH
from ledger.models import Budget, Reservation
from ledger.scopes import CHARGED_COLUMNS, matching_sql, subject_filter

SLICE = Reservation.Origin.SLICE
NOTIFY_CHANNEL = "capgate_slices"

_COLS = ", ".join(CHARGED_COLUMNS)

# The carve, part of the group commit's one statement (ledger/recording.py). For each
# request not recorded before: its reservation (the slice's subject and lease) and its holds (its
# worst case on each window the slice holds positively, 0 on the rest), then the slice's row and
# holds lose the same amount; a slice that reaches zero goes. A slice of no blocking ceiling
# holds 0 and stays as it is. Carving more than a slice holds would drive its row negative,
# which its CHECK constraint refuses: the whole batch fails loudly rather than drift. A slice
# already charged by expiry (its own usage record exists) is not carved: its estimate covers
# the request.
#
# CARVE_CTES reads the requests from a CTE `item` (id, request_id, slice_id, amount_nano, model,
# created_at) that the statement using it defines: CARVE_SQL from its own arrays, the group
# commit's insert from the records it writes (ledger/recording.py), so both run the same carve.
CARVE_CTES = f"""
fresh AS MATERIALIZED (
    SELECT i.* FROM item i
     WHERE NOT EXISTS (SELECT 1 FROM usage_usagerecord u WHERE u.request_id = i.request_id)
       AND NOT EXISTS (SELECT 1 FROM budgets_reservation r WHERE r.request_id = i.request_id)
), slice AS MATERIALIZED (
    SELECT r.id, r.amount_nano, r.owner_id, r.expires_at, r.deadline_at, {", ".join(f"r.{c}" for c in CHARGED_COLUMNS)}
      FROM budgets_reservation r
     WHERE r.id IN (SELECT slice_id FROM fresh) AND r.origin = '{SLICE}'
       AND NOT EXISTS (SELECT 1 FROM usage_usagerecord u WHERE u.request_id = r.request_id)
     ORDER BY r.id
       FOR UPDATE
), carved AS MATERIALIZED (
    INSERT INTO budgets_reservation (id, request_id, {_COLS}, model, amount_nano, owner_id,
                                     created_at, expires_at, deadline_at, job_id, origin)
    SELECT f.id, f.request_id, {", ".join(f"s.{c}" for c in CHARGED_COLUMNS)}, f.model, f.amount_nano, s.owner_id,
           f.created_at, s.expires_at, s.deadline_at, NULL, '{Reservation.Origin.GATEWAY}'
      FROM fresh f JOIN slice s ON s.id = f.slice_id
    RETURNING id, amount_nano
), per_slice AS MATERIALIZED (
    SELECT f.slice_id, sum(c.amount_nano) AS total, s.amount_nano AS had
      FROM carved c JOIN fresh f ON f.id = c.id JOIN slice s ON s.id = f.slice_id
     GROUP BY f.slice_id, s.amount_nano
), holds AS (
    INSERT INTO budgets_hold (reservation_id, window_id, amount_nano)
    SELECT c.id, h.window_id, CASE WHEN h.amount_nano > 0 THEN c.amount_nano ELSE 0 END
      FROM carved c JOIN fresh f ON f.id = c.id JOIN budgets_hold h ON h.reservation_id = f.slice_id
), kept_holds AS (
    UPDATE budgets_hold h SET amount_nano = h.amount_nano - p.total
      FROM per_slice p
     WHERE h.reservation_id = p.slice_id AND h.amount_nano > 0 AND p.had > 0 AND p.total <> p.had
), gone_holds AS (
    DELETE FROM budgets_hold h USING per_slice p
     WHERE h.reservation_id = p.slice_id AND p.had > 0 AND p.total = p.had
), kept AS (
    UPDATE budgets_reservation r SET amount_nano = p.had - p.total
      FROM per_slice p
     WHERE r.id = p.slice_id AND p.had > 0 AND p.total <> p.had
), gone AS (
    DELETE FROM budgets_reservation r USING per_slice p
     WHERE r.id = p.slice_id AND p.had > 0 AND p.total = p.had
)
"""
CARVE_SQL = f"""
WITH item AS (
    SELECT * FROM unnest(%s::uuid[], %s::varchar[], %s::uuid[], %s::bigint[], %s::varchar[], %s::timestamptz[])
        AS i(id, request_id, slice_id, amount_nano, model, created_at)
), {CARVE_CTES}
SELECT count(*) FROM carved
"""


def carve_params(reservations: Sequence[Reservation]) -> list:
    """CARVE_SQL's parameters for the requests (each with `slice_id`) being recorded."""
    return [
        [r.id for r in reservations],
        [r.request_id for r in reservations],
        [r.slice_id for r in reservations],
        [r.amount_nano for r in reservations],
        [r.model for r in reservations],
        [r.created_at for r in reservations],
    ]


def carve(reservations: Sequence[Reservation]) -> int:
    """Carve these requests out of their slices now (the ORM path of recording, inside the
    record's own transaction). Returns how many reservations were carved."""
    todo = [r for r in reservations if r.slice_id is not None and not r.carved]
    if not todo:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(CARVE_SQL, carve_params(todo))
        return int(cursor.fetchone()[0])


# A request admitted from a slice of no blocking ceiling gets its own reservation and holds (0 on
# each alert window the slice holds) at admission, before the provider call: no window row is
# locked or written, yet a blocking budget created or switched on while the request is in flight
# finds its row and carries its worst case into the new window (ledger/windows.py). Refused
# (nothing written) when the slice was charged by expiry, or when a blocking budget now covers
# the subject: the slice was taken knowing none, so the caller admits the request afresh. The
# reservation insert waits for a mid-life window's creation (its table lock), so the check runs
# after that creation committed and sees the budget it was for.
_SUBJECT_PARAMS = {c: c for c in CHARGED_COLUMNS}
ADMIT_UNBLOCKED_SQL = f"""
WITH slice AS MATERIALIZED (
    SELECT r.id FROM budgets_reservation r
     WHERE r.id = %(slice_id)s AND r.origin = '{SLICE}'
       AND NOT EXISTS (SELECT 1 FROM usage_usagerecord u WHERE u.request_id = r.request_id)
), blocked AS (
    SELECT 1 FROM budgets_budget b
     WHERE b.organization_id = %(organization_id)s AND b.mode = 'block'
       AND {matching_sql("b", _SUBJECT_PARAMS)}
), reservation AS (
    INSERT INTO budgets_reservation (id, request_id, {_COLS}, model, amount_nano, owner_id,
                                     created_at, expires_at, deadline_at, job_id, origin)
    SELECT %(id)s, %(request_id)s, {", ".join(f"%({c})s" for c in CHARGED_COLUMNS)}, %(model)s, %(amount)s,
           %(owner_id)s, %(created_at)s, %(expires_at)s, %(deadline_at)s, NULL, %(origin)s
      FROM slice
     WHERE NOT EXISTS (SELECT 1 FROM blocked)
    RETURNING id
), holds AS (
    INSERT INTO budgets_hold (reservation_id, window_id, amount_nano)
    SELECT reservation.id, h.window_id, 0
      FROM reservation JOIN budgets_hold h ON h.reservation_id = %(slice_id)s
)
SELECT count(*) FROM reservation
"""


def admit_unblocked(*, reservation: Reservation) -> bool:
    """Write the row of a request admitted from a slice of no blocking ceiling (ADMIT_UNBLOCKED_SQL).
    True if written; False if the caller must admit the request afresh."""
    assert reservation.slice_id is not None
    params = {
        "slice_id": reservation.slice_id,
        "id": reservation.id,
        "request_id": reservation.request_id,
        **{c: getattr(reservation, c) for c in CHARGED_COLUMNS},
        "model": reservation.model,
        "amount": reservation.amount_nano,
        "owner_id": reservation.owner_id,
        "created_at": reservation.created_at,
        "expires_at": reservation.expires_at,
        "deadline_at": reservation.deadline_at,
        "origin": reservation.origin,
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute(ADMIT_UNBLOCKED_SQL, params)
            return bool(cursor.fetchone()[0])
    except IntegrityError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "23503":  # foreign key: the subject was just deleted
            raise SubjectGone(
                "Who this request is charged to (its project, member, key or end customer) "
                "was deleted while it was being admitted; nothing was reserved."
            ) from exc
        raise


# Give a slice's unused part back: lock its row, take `amount` off it and its positive holds
# (or delete them all, and its requests' claims, when `close` and that is everything left), then
# lock the windows those holds were on, in id order, and take the same amount off `reserved`.
# Reservation, holds, then windows in ascending order: the ledger's lock order (ledger/locks.py).
_GIVE_BACK_SQL = f"""
WITH s AS MATERIALIZED (
    SELECT r.id, r.amount_nano, %(close)s AND r.amount_nano = %(amount)s AS whole
      FROM budgets_reservation r
     WHERE r.id = %(id)s AND r.origin = '{SLICE}' AND r.amount_nano >= %(amount)s
       AND NOT EXISTS (SELECT 1 FROM usage_usagerecord u WHERE u.request_id = r.request_id)
       FOR UPDATE
), kept_holds AS (
    UPDATE budgets_hold h SET amount_nano = h.amount_nano - %(amount)s
      FROM s WHERE h.reservation_id = s.id AND NOT s.whole AND h.amount_nano > 0
    RETURNING h.window_id
), gone_holds AS (
    DELETE FROM budgets_hold h USING s WHERE h.reservation_id = s.id AND s.whole
    RETURNING h.window_id, h.amount_nano
), kept AS (
    UPDATE budgets_reservation r SET amount_nano = r.amount_nano - %(amount)s FROM s WHERE r.id = s.id AND NOT s.whole
), gone AS (
    DELETE FROM budgets_reservation r USING s WHERE r.id = s.id AND s.whole
), gone_claims AS (
    DELETE FROM ledger_sliceclaim c USING s WHERE c.slice_id = s.id AND s.whole
), released AS MATERIALIZED (
    SELECT window_id FROM kept_holds UNION SELECT window_id FROM gone_holds WHERE amount_nano > 0
), locked AS MATERIALIZED (
    SELECT w.id FROM budgets_window w WHERE w.id IN (SELECT window_id FROM released) AND %(amount)s > 0
     ORDER BY w.id
       {WINDOW_LOCK_STRENGTH}
), applied AS (
    UPDATE budgets_window w SET reserved_nano = w.reserved_nano - %(amount)s, touched_at = now()
      FROM (SELECT count(*) AS n FROM locked) l
     WHERE w.id IN (SELECT id FROM locked) AND l.n > 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM s), (SELECT bool_or(whole) FROM s), (SELECT count(*) FROM applied)
"""


def give_back(*, slice_id: uuid.UUID, amount_nano: int, close: bool) -> bool:
    """Return `amount_nano` of a slice to its windows; with `close`, delete the slice if that is
    all it has left. False if the slice is gone, was charged by expiry, or holds less than that
    (a carve lost in a database crash: what is left lapses and is charged at worst case)."""
    if amount_nano < 0:
        raise ValueError("amount must be >= 0")
    with connection.cursor() as cursor:
        cursor.execute(_GIVE_BACK_SQL, {"id": slice_id, "amount": amount_nano, "close": close})
        found, _whole, _windows = cursor.fetchone()
    return bool(found)


# Notification payloads on NOTIFY_CHANNEL. Comma-separated window ids: those windows refused a
# request. A JSON object {"org": id, "column": name or null, "value": ...}: a budget of that
# organization and subject (column null: the whole organization) was created, edited or deleted,
# so the slices of that subject were taken under budgets that are no longer current.


def notify_budgets_changed(*, budget: Budget) -> None:
    """Tell every gateway process a budget changed: each retires its slices of the budget's
    subject and gives their unused parts back at once, instead of when they lapse. A window
    created for the change carries every live slice's whole row, unused part included, and until
    that part is back the new ceiling refuses requests it has room for. Inside a transaction the
    notification is sent when it commits (and not at all if it rolls back)."""
    [(column, value)] = subject_filter(budget).items() or [(None, None)]
    payload = json.dumps({"org": budget.organization_id, "column": column, "value": value})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])


@dataclass(frozen=True)
class Changed:
    """A budget change's subject: the organization, and the subject column and value (None: all)."""

    organization_id: int
    column: str | None
    value: object


def parse_notification(payload: str) -> tuple[list[int], list[Changed]]:
    """(windows that refused, subjects whose budgets changed) named by a NOTIFY_CHANNEL payload;
    anything malformed is ignored (a lost notice costs utilization, never the cap)."""
    if payload.startswith("{"):
        try:
            data = json.loads(payload)
            org, column = int(data["org"]), data.get("column")
        except (ValueError, KeyError, TypeError):
            return [], []
        if column is not None and column not in CHARGED_COLUMNS:
            return [], []
        return [], [Changed(organization_id=org, column=column, value=data.get("value"))]
    return [int(t) for t in payload.split(",") if t.strip().isdigit()], []


# What live slices hold on a window: their unused parts and the requests admitted from them and
# not yet recorded. A refusal that this would cover waits for the slices to be recalled.
_SLICES_HOLD_SQL = f"""
SELECT coalesce(sum(h.amount_nano), 0) FROM budgets_hold h
  JOIN budgets_reservation r ON r.id = h.reservation_id
 WHERE h.window_id = %s AND r.origin = '{SLICE}'
"""


def slices_hold(*, window_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_SLICES_HOLD_SQL, [window_id])
        return int(cursor.fetchone()[0])


_RECALLABLE_ROOM_SQL = f"""
SELECT b.amount_nano - w.spent_nano - w.reserved_nano + ({_SLICES_HOLD_SQL.replace("%s", "w.id")})
  FROM budgets_window w
  JOIN budgets_budget b ON b.id = w.budget_id
 WHERE w.id = %s
"""


def recallable_room(*, window_id: int) -> int:
    """The window's room now plus what live slices hold on it, read in one snapshot: the most a
    refused request could be admitted into once every slice there gave its part back. Read
    together, a give-back landing between a refusal and this read moves room from one term to
    the other and changes nothing (the refusal's own `remaining` is older than the holds)."""
    with connection.cursor() as cursor:
        cursor.execute(_RECALLABLE_ROOM_SQL, [window_id])
        row = cursor.fetchone()
        return int(row[0]) if row is not None else 0


def notify_refused(window_ids: Sequence[int]) -> None:
    """Tell every gateway process that these windows refused a request: they give back their
    slices' unused parts on them (gateway/upstream/runtime.py listens)."""
    if window_ids:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, ",".join(str(w) for w in window_ids)])
