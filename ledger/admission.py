"""Admission: reserve a request's worst case on every ceiling it falls under, or refuse it.

The invariant: for each blocking window, spent + reserved never exceeds the budget
by admission — only a provider billing above a reserved worst case can push spent past it.

Why this holds under concurrency: every admission that touches a ceiling locks that ceiling's
window row (in ascending id order, so overlapping ceiling sets cannot deadlock), reads its
counters, and adds its worst case to `reserved` before committing. A competing admission waits
on the lock and then reads counters that already include the first one's hold.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Least
from django.utils import timezone

from core.guards import Guards
from ledger.drain import drain
from ledger.errors import AdmitAgain, BudgetExceeded, BudgetUnavailable, SubjectGone
from ledger.locks import ADMIT_WINDOW_LOCK
from ledger.models import Budget, Reservation
from ledger.scopes import CHARGED_COLUMNS, RANK, matching_sql, refusal_code
from ledger.windows import WindowState, current_windows


@dataclass(frozen=True)
class Subject:
    """Who a request is charged to: one field per column of ledger.scopes.CHARGED_COLUMNS, in
    that order (tests/ledger/test_scopes.py)."""

    organization_id: int
    project_id: int | None = None
    member_id: int | None = None
    api_key_id: int | None = None
    end_customer_id: int | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class AdmissionRequest:
    subject: Subject
    request_id: str
    worst_nano: int
    model: str = ""
    owner_id: int | None = None
    lease: timedelta | None = None
    now: datetime | None = None  # tests pin the clock (e.g. 23:59:59)
    budgets: Sequence[Budget] | None = None  # matching budgets, when the caller already has them
    origin: str = Reservation.Origin.GATEWAY  # who may settle it (Reservation.origin)


@dataclass
class Ceiling:
    window_id: int
    budget_id: int
    scope: str
    code: str
    limit_nano: int
    spent_nano: int
    reserved_nano: int

    @property
    def remaining_nano(self) -> int:
        return self.limit_nano - self.spent_nano - self.reserved_nano


@dataclass
class Admitted:
    reservation: Reservation
    ceilings: list[Ceiling] = field(default_factory=list)


# The hot path's two reads are written by hand: building them with the ORM cost ~5 ms of
# Python per admission, which under the GIL capped a process near 145 admissions/s
# (docs/performance.md). Both are plain reads; the money moves in _ADMIT_SQL.
# Both name the request's subject columns as parameters by their own names (ledger/scopes.py).
_SUBJECT_PARAMS = {c: c for c in CHARGED_COLUMNS}
_MATCHING_SQL = f"""
SELECT b.* FROM budgets_budget b
 WHERE b.organization_id = %(organization_id)s
   AND {matching_sql("b", _SUBJECT_PARAMS)}
 ORDER BY b.id
"""


def matching_budgets(subject: Subject) -> list[Budget]:
    """Every budget (alert or block) whose scope covers the subject."""
    return list(Budget.objects.raw(_MATCHING_SQL, {c: getattr(subject, c) for c in CHARGED_COLUMNS}))


def _refusal(ceilings: list[Ceiling], worst_nano: int) -> BudgetExceeded | None:
    failing = [c for c in ceilings if c.spent_nano + c.reserved_nano + worst_nano > c.limit_nano]
    if not failing:
        return None
    c = min(failing, key=lambda c: (RANK[c.scope], c.remaining_nano))
    return BudgetExceeded(
        code=c.code,
        budget_id=c.budget_id,
        window_id=c.window_id,
        limit_nano=c.limit_nano,
        remaining_nano=c.remaining_nano,
        worst_nano=worst_nano,
    )


# Removal tests: tests/ledger/test_admission_races.py, tests/ledger/test_stale_budgets.py.
GUARDS = Guards(
    count_reserved="an admission counts what other requests already hold on each window, in its "
    "unlocked read and in its statement",
    check_stale_budgets="an admission that read its budgets before a blocking one was created or "
    "edited reads them again, so the new budget's window holds it",
    settle_finished="an admission about to refuse first applies the usage records already committed on "
    "its ceilings (their holds out, their costs in) and checks again, so a finished call's hold never "
    "refuses the next call",
    wait_for_drains="that settling waits for the records another drain is applying, so it does not "
    "refuse on holds that drain is about to take out",
    admit_again_outside="an admission inside a caller's transaction creates no window and reads no "
    "budget twice: it gives the transaction up (AdmitAgain) and its caller creates the windows first, "
    "so no transaction holds a window's row while waiting for the reservations table's lock",
)
# The ledger's one window lock (ledger/locks.py); the row-lock removal test swaps the clause.
LOCK_CLAUSE = ADMIT_WINDOW_LOCK
RACE_DELAY_SECONDS = 0.0  # > 0 sleeps between the read and the write (race tests only)
# Budgets edited or deleted while a request is admitted make it read them again. An edit still
# committing is read again unchanged, and a burst of edits (an operator's script, `apply`) can
# change them several times in a row: the request goes on reading them, backing off from
# RETRY_FIRST_SLEEP to RETRY_MAX_SLEEP seconds, until they hold still, for at most
# ADMIT_RETRY_SECONDS, and only then answers 503 budget_unavailable (immediate retries alone
# are outlasted by edits 10 ms apart).
ADMIT_RETRY_SECONDS = 3.0
RETRY_FIRST_SLEEP = 0.002
RETRY_MAX_SLEEP = 0.05

_ADMIT_SQL = f"""
WITH ceilings AS (
    SELECT w.id, w.budget_id, b.scope, b.amount_nano, w.spent_nano, {{reserved}} AS reserved_nano,
           w.retired_at IS NULL AS current
      FROM budgets_window w
      JOIN budgets_budget b ON b.id = w.budget_id
     WHERE w.id = ANY(%(blocking)s::bigint[])
     ORDER BY w.id
     {{lock}}
), stale AS (
    -- A blocking budget this admission does not know at the version it read: created, or
    -- reconfigured, since its budgets were read. Its window may not hold this request: retry.
    SELECT 1 FROM budgets_budget b
     WHERE b.organization_id = %(organization_id)s AND b.mode = 'block'
       AND {matching_sql("b", _SUBJECT_PARAMS)}
       AND (b.id, b.version) NOT IN (SELECT * FROM unnest(%(known_ids)s::bigint[], %(known_versions)s::int[]))
), verdict AS (
    SELECT count(*) = cardinality(%(blocking)s::bigint[])
           AND coalesce(bool_and(current), true)
           AND ({{check_stale}} NOT EXISTS (SELECT 1 FROM stale))
           AND coalesce(bool_and(spent_nano + reserved_nano + %(worst)s <= amount_nano), true) AS fits
      FROM ceilings
     WHERE {{delay}}
), reserve AS (
    UPDATE budgets_window w
       SET reserved_nano = w.reserved_nano + %(worst)s
      FROM verdict
     WHERE verdict.fits AND w.id = ANY(%(blocking)s::bigint[])
), reservation AS (
    INSERT INTO budgets_reservation (id, request_id, {", ".join(CHARGED_COLUMNS)}, model, amount_nano,
                                     owner_id, created_at, expires_at, deadline_at, job_id, origin)
    SELECT %(id)s, %(request_id)s, {", ".join(f"%({c})s" for c in CHARGED_COLUMNS)}, %(model)s, %(worst)s,
           %(owner_id)s, %(now)s, %(expires_at)s, %(deadline_at)s, NULL, %(origin)s
      FROM verdict
     WHERE verdict.fits
    RETURNING id
), holds AS (
    INSERT INTO budgets_hold (reservation_id, window_id, amount_nano)
    SELECT reservation.id, h.window_id, h.amount_nano
      FROM reservation, unnest(%(hold_windows)s::bigint[], %(hold_amounts)s::bigint[]) AS h(window_id, amount_nano)
)
SELECT verdict.fits, c.id, c.budget_id, c.scope, c.amount_nano, c.spent_nano, c.reserved_nano, c.current
  FROM verdict LEFT JOIN ceilings c ON true
"""


def _admit_statement(params: dict) -> tuple[bool, list[Ceiling]]:
    """Lock the ceilings in id order, check every one has room, add the hold to each, and
    insert the reservation with its holds — one statement, which in autocommit is also its own
    transaction. The row locks are taken and released inside the database, so they are never
    held across a client round trip (or a Python thread waiting for the GIL)."""
    sql = _ADMIT_SQL.format(
        lock=LOCK_CLAUSE,
        reserved="w.reserved_nano" if GUARDS.count_reserved else "0",
        delay=f"pg_sleep({float(RACE_DELAY_SECONDS)})::text = ''" if RACE_DELAY_SECONDS else "true",
        check_stale="" if GUARDS.check_stale_budgets else "true OR",
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "40P01" and not connection.in_atomic_block:
            # Deadlock victim: Postgres rolled the whole statement back (it is its own
            # transaction), so nothing was reserved. Seen under load when records carved from
            # headroom slices check their holds' window keys (FOR KEY SHARE) while admissions
            # queue on the same window row; the caller's loop admits again.
            return False, []
        raise
    except IntegrityError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "23503":  # foreign key: the subject was just deleted
            raise SubjectGone(
                "Who this request is charged to (its project, member, key or end customer) "
                "was deleted while it was being admitted; nothing was reserved."
            ) from exc
        raise  # the same request id admitted twice: the caller answers with the first
    fits = bool(rows[0][0])
    ceilings = [
        Ceiling(
            window_id=wid,
            budget_id=bid,
            scope=scope,
            code=refusal_code(scope),
            limit_nano=amount,
            spent_nano=spent,
            reserved_nano=reserved,
        )
        for _, wid, bid, scope, amount, spent, reserved, _current in rows
        if wid is not None
    ]
    return fits, ceilings


def _ceiling(budget: Budget, window: WindowState, *, count_reserved: bool = True) -> Ceiling:
    """A blocking budget's ceiling as its window reads now (`count_reserved` off only in the guard's removal test)."""
    return Ceiling(
        window_id=window.id,
        budget_id=budget.id,
        scope=budget.scope,
        code=refusal_code(budget.scope),
        limit_nano=budget.amount_nano,
        spent_nano=window.spent_nano,
        reserved_nano=window.reserved_nano if count_reserved else 0,
    )


_callers_transaction: ContextVar[bool] = ContextVar("callers_transaction", default=False)


@contextmanager
def in_callers_transaction() -> Iterator[None]:
    """Admissions made inside this run in the caller's open transaction (a first call's, which
    creates its end customer or run budget with its admission): they create no window and read
    no budget twice, and raise AdmitAgain instead (see `admit`)."""
    token = _callers_transaction.set(True)
    try:
        yield
    finally:
        _callers_transaction.reset(token)


def _attempts() -> Iterator[int]:
    """0, 1, 2, ...: the first two at once, then after a growing sleep, until ADMIT_RETRY_SECONDS
    have passed since the first."""
    deadline = time.monotonic() + ADMIT_RETRY_SECONDS
    sleep = RETRY_FIRST_SLEEP
    attempt = 0
    while True:
        yield attempt
        attempt += 1
        if attempt >= 2:
            if time.monotonic() + sleep > deadline:
                return
            time.sleep(sleep)
            sleep = min(sleep * 2, RETRY_MAX_SLEEP)


def admit(*, request: AdmissionRequest) -> Admitted:
    """Reserve `request.worst_nano` on every ceiling, or raise BudgetExceeded.

    1. Find the matching budgets and read their current windows in one unlocked statement
       (creating missing windows). A ceiling already too full in that consistent read refuses
       at once, without taking its lock: deciding on it is the same as deciding at the moment of
       the read, and it keeps refusals in a burst off the hot row lock.
    2. One statement locks the blocking windows in id order, checks each has room for the worst
       case, adds it to `reserved`, and inserts the reservation and its holds.
    Alert budgets never refuse; they get a zero hold so the drain charges their window of the
    admitting period.
    """
    now = request.now or timezone.now()
    subject = request.subject
    worst = request.worst_nano
    if worst < 0:
        raise ValueError("worst case must be >= 0")
    lease = request.lease or settings.CAPGATE["LEASE"]
    budgets: list[Budget] | None = list(request.budgets) if request.budgets is not None else None
    settled = False  # the finished calls on the ceilings were applied (once per admission)
    # Inside a caller's transaction (a first call's, gateway/admission/subjects.py `founding`) no
    # window is created: creating one locks the reservations table while this transaction holds
    # its rows until commit, and a concurrent creation of the same window waits on this one while
    # holding that lock: a deadlock. The caller creates the windows it needs before (AdmitAgain).
    nested = _callers_transaction.get() and GUARDS.admit_again_outside
    for _attempt in _attempts():
        if budgets is None:
            budgets = matching_budgets(subject)
        windows = current_windows(budgets=budgets, now=now, create=not nested)
        if any(b.id not in windows for b in budgets):
            if nested:
                raise AdmitAgain("A budget of the request has no window for this period yet.")
            budgets = None
            continue  # a budget was deleted or reconfigured since it was read: read them again
        blocking_budgets = [b for b in budgets if b.mode == Budget.Mode.BLOCK]
        blocking = sorted(windows[b.id].id for b in blocking_budgets)
        seen = [_ceiling(b, windows[b.id], count_reserved=GUARDS.count_reserved) for b in blocking_budgets]
        refusal = _refusal(seen, worst)
        if refusal is not None:
            if not settled and settle_finished(window_ids=blocking):
                settled = True
                continue  # read the ceilings again, with the finished calls applied
            raise refusal
        blocking_set = set(blocking)
        hold_windows = sorted(w.id for w in windows.values())
        charged = {c: getattr(subject, c) for c in CHARGED_COLUMNS}
        reservation = Reservation(
            id=uuid.uuid4(),
            request_id=request.request_id,
            **charged,
            model=request.model,
            amount_nano=worst,
            owner_id=request.owner_id,
            created_at=now,
            expires_at=now + lease,
            deadline_at=now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
            origin=request.origin,
        )
        fits, ceilings = _admit_statement(
            {
                "blocking": blocking,
                "worst": worst,
                "id": reservation.id,
                "request_id": reservation.request_id,
                **charged,
                "model": reservation.model,
                "owner_id": reservation.owner_id,
                "now": now,
                "expires_at": reservation.expires_at,
                "deadline_at": reservation.deadline_at,
                "hold_windows": hold_windows,
                "hold_amounts": [worst if wid in blocking_set else 0 for wid in hold_windows],
                "origin": request.origin,
                "known_ids": [b.id for b in blocking_budgets],
                "known_versions": [b.version for b in blocking_budgets],
            }
        )
        if fits:
            reservation._state.adding = False
            reservation._state.db = "default"
            return Admitted(reservation=reservation, ceilings=ceilings)
        refusal = _refusal(ceilings, worst)
        if refusal is not None:
            if not settled and settle_finished(window_ids=blocking):
                settled = True
                continue  # read the ceilings again, with the finished calls applied
            raise refusal
        # No ceiling is full, yet the statement refused: a window vanished under it (its budget
        # was deleted), was retired, or a budget appeared or changed. Match the budgets again,
        # unless a caller's transaction holds the locks the statement took (AdmitAgain).
        if nested:
            raise AdmitAgain("The request's budgets changed while it was being admitted.")
        budgets = None
    raise BudgetUnavailable("The request's budgets changed while it was being admitted; retry it.")


def settle_finished(*, window_ids: Sequence[int]) -> bool:
    """Apply the usage records already committed that hold on these windows: their holds leave
    `reserved` and their costs enter `spent`, as the drain would a few ms later. Admission calls
    it before refusing, so a call that finished (its record committed before its response ended)
    never refuses its client's next call with a hold it no longer needs: a refusal counts recorded
    spend and the holds of calls still in flight, nothing else. True when the caller should read
    its ceilings again: always, once it ran (a drain running meanwhile may have applied the
    records this one waited for, and then this one applies none).

    Off the hot path (only an admission about to refuse pays it), and outside any lock the
    admission holds: it runs between the admission's statements, and skips inside a caller's
    transaction, whose window locks the drain's could not be ordered after. A deadlock (rare:
    the drain waits for records another drain holds) refuses as before."""
    if not GUARDS.settle_finished or not window_ids or connection.in_atomic_block:
        return False
    try:
        while drain(limit=500, window_ids=window_ids, wait=GUARDS.wait_for_drains) == 500:
            pass
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "40P01":
            raise
        return False
    return True


def renew(*, owner_ids: Sequence[int], now: datetime | None = None, lease: timedelta | None = None) -> int:
    """Extend the leases of reservations owned by live gateway processes, never past the
    hard deadline. One statement; safe to run concurrently (last writer wins, same value)."""
    now = now or timezone.now()
    lease = lease or settings.CAPGATE["LEASE"]
    return Reservation.objects.filter(owner_id__in=list(owner_ids), deadline_at__gt=now).update(expires_at=now + lease)


def disown(*, request_id: str) -> bool:
    """Let a reservation lapse with its lease: its process stops renewing it, so beat charges it
    at worst case once the lease runs out (CAPGATE_LEASE_SECONDS), not at its hard deadline.
    For a request whose usage record the database refused for good: nothing else will settle
    it. False if it is gone or had no owner."""
    return Reservation.objects.filter(request_id=request_id, owner__isnull=False).update(owner=None) == 1


def hand_to_job(
    *, request_id: str, job_id: str, deadline_at: datetime, now: datetime | None = None, lease: timedelta | None = None
) -> bool:
    """Move a reservation from the request that made it to the provider job it became: no owning
    gateway process any more (beat renews it while the provider reports the job alive,
    `renew_jobs`), the job's id, and the job's hard deadline. The hold itself does not move: it
    stays on the same windows until the job's usage record is applied. False if it is gone."""
    now = now or timezone.now()
    lease = lease or settings.CAPGATE["JOB_LEASE"]
    return (
        Reservation.objects.filter(request_id=request_id).update(
            owner=None, job_id=job_id, expires_at=min(now + lease, deadline_at), deadline_at=deadline_at
        )
        == 1
    )


def renew_jobs(*, request_ids: Sequence[str], now: datetime | None = None, lease: timedelta | None = None) -> int:
    """Extend the leases of job reservations whose provider still reports the job alive, never
    past the job's hard deadline. One statement; idempotent."""
    now = now or timezone.now()
    lease = lease or settings.CAPGATE["JOB_LEASE"]
    return Reservation.objects.filter(
        request_id__in=list(request_ids), job_id__isnull=False, deadline_at__gt=now
    ).update(expires_at=Least(Value(now + lease, output_field=DateTimeField()), F("deadline_at")))


def headroom(*, budgets: Sequence[Budget], now: datetime | None = None, settle: bool = False) -> Ceiling | None:
    """The tightest blocking ceiling's current state, read without locks.

    Used to pick an output ceiling a budget can afford before admission; admission re-checks
    under the lock, so a stale read can only cause a refusal, never an overrun. With `settle`,
    the usage records already committed on those windows are applied first (`settle_finished`:
    for a caller whose choice the room constrains, so finished calls' holds do not shrink it).
    """
    now = now or timezone.now()
    blocking = [b for b in budgets if b.mode == Budget.Mode.BLOCK]
    if not blocking:
        return None
    windows = current_windows(budgets=blocking, now=now)
    if settle and settle_finished(window_ids=sorted(w.id for w in windows.values())):
        windows = current_windows(budgets=blocking, now=now)
    ceilings = [
        _ceiling(b, windows[b.id])
        for b in blocking
        if b.id in windows  # deleted or reconfigured meanwhile: admission reads them again
    ]
    if not ceilings:
        return None
    return min(ceilings, key=lambda c: c.remaining_nano)
