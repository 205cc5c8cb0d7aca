"""Creating a budget's window for a period: the period's whole truth, never less.

A window created at its period's start begins empty: every request of the period admits after
it exists and holds on it. A window created *mid-life* — the budget was created, or its period,
timezone or mode changed (Budget.version), after the period began — must start with everything
the period already holds for its scope (decisions.md, 2026-12-01):

    spent    = cost of the scope's usage records admitted in the period whose reservation is gone
    reserved = worst cases of the scope's live reservations admitted in the period
    holds    = one per such reservation, so the drain charges this window when it settles

and no admission may slip between that read and the window becoming visible. So a mid-life
window is created under a SHARE ROW EXCLUSIVE lock on the reservation table: it waits for every
admission statement and drain in progress to commit, and holds new ones off for the few
milliseconds it takes. The mode conflicts with itself, so two such creations queue instead of
deadlocking when each, inside a caller's transaction, goes on to insert a reservation. An
admission that read the budgets before the edit re-checks them inside its own statement
(ledger.admission._ADMIT_SQL, `stale`) and retries.

Reading a window's counters (`current_windows`, which creates missing ones) and the window writes
budgets' edits need (`retire` on a new version, `release_budget` before a deletion) are here too.
The seed reads usage records by table name in SQL: the ledger sits above usage's models, so
this is a choice of one statement over an ORM query, not a way round the import layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core.guards import Guards
from ledger.locks import lock_reservations_table, lock_windows, windows_for_delete
from ledger.models import Budget, Hold, Window
from ledger.periods import period_bounds
from ledger.scopes import subject_filter, usage_sql

Bounds = dict[int, tuple[datetime, datetime | None]]

# Removal test: tests/gateway/test_admin_actions.py.
GUARDS = Guards(
    carry_holds="a window created mid-period carries the live holds of its scope, so requests in flight stay counted",
)


def _subject(budget: Budget) -> Any:
    """The value of the subject the budget names (None for the organization: matched apart)."""
    return next(iter(subject_filter(budget).values()), None)


@dataclass(frozen=True)
class WindowState:
    """A window's counters as one unlocked, consistent read saw them."""

    id: int
    spent_nano: int
    reserved_nano: int


def current_windows(
    *, budgets: Sequence[Budget], now: datetime, create: bool = True, new_subjects: bool = False
) -> dict[int, WindowState]:
    """Return {budget_id: window state} for the period containing `now`, creating missing
    windows. The counters come from one unlocked statement: a consistent snapshot.

    Creation is INSERT .. ON CONFLICT DO NOTHING, so racing first requests agree on one row.
    A window created mid-life starts with the period's whole truth for its scope: recorded spend
    plus the holds of requests in flight (create_windows). A budget deleted or reconfigured
    since it was read has no window here: the caller reads the budgets again.
    Runs outside the admission statement: it takes no lock the admission needs. `create=False`
    only reads: a missing window is left out, as a deleted budget's is. `new_subjects`: the
    budgets' subjects were created in the caller's open transaction, so no request of theirs can
    be in flight and their windows need no lock on the reservations table (create_windows).
    """
    if not budgets:
        return {}
    bounds = {b.id: period_bounds(period=b.period, tz=b.timezone, now=now) for b in budgets}
    found = _read_windows(budgets, bounds)
    missing = [b for b in budgets if b.id not in found]
    if missing and create:
        create_windows(budgets=missing, bounds=bounds, lock=not new_subjects)
        found.update(_read_windows(missing, bounds))
    return found


def _read_windows(budgets: Sequence[Budget], bounds: dict) -> dict[int, WindowState]:
    """One statement, so the counters of all the windows come from one snapshot."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT w.budget_id, w.id, w.spent_nano, w.reserved_nano
              FROM budgets_window w
              JOIN unnest(%s::bigint[], %s::int[], %s::timestamptz[]) AS k(budget_id, version, period_start)
                ON w.budget_id = k.budget_id AND w.budget_version = k.version AND w.period_start = k.period_start
            """,
            [[b.id for b in budgets], [b.version for b in budgets], [bounds[b.id][0] for b in budgets]],
        )
        rows = cursor.fetchall()
    return {budget_id: WindowState(wid, spent, reserved) for budget_id, wid, spent, reserved in rows}


def ensure_windows(*, budgets: Sequence[Budget], now: datetime) -> dict[int, int]:
    """{budget_id: window_id} for the period containing `now` (see current_windows)."""
    return {bid: w.id for bid, w in current_windows(budgets=budgets, now=now).items()}


def mid_life(budget: Budget, start: datetime) -> bool:
    """Created or reconfigured after its period began: in-flight requests may lack its hold."""
    return budget.version_at is not None and budget.version_at > start


def create_windows(*, budgets: Sequence[Budget], bounds: Bounds, lock: bool = True) -> None:
    """Create each budget's window for its period (INSERT .. ON CONFLICT DO NOTHING: racing
    first requests agree on one row), seeded with the period's truth for its scope. `lock=False`
    skips the reservations table's lock, for subjects no request can be in flight for yet."""
    plain = [b for b in budgets if not mid_life(b, bounds[b.id][0])]
    carried = [b for b in budgets if mid_life(b, bounds[b.id][0])]
    with transaction.atomic():
        for b in plain:
            _create(b, bounds[b.id], carry=False)
    if carried:
        with transaction.atomic():
            # Run budgets are created by their run's own first call, before it admits: no
            # request of the run can hold a stale list, so they skip the table lock.
            if GUARDS.carry_holds and lock and any(b.scope != Budget.Scope.RUN for b in carried):
                lock_reservations_table()
            for b in carried:
                _create(b, bounds[b.id], carry=GUARDS.carry_holds)


def _create(budget: Budget, bounds: tuple[datetime, datetime | None], *, carry: bool) -> None:
    start, end = bounds
    params: dict[str, Any] = {
        "org": budget.organization_id,
        "subject": _subject(budget),
        "start": start,
        "end": end,
        "budget": budget.id,
        "version": budget.version,
        "block": budget.mode == Budget.Mode.BLOCK,
    }
    in_period = "{t}.{col} >= %(start)s AND (%(end)s::timestamptz IS NULL OR {t}.{col} < %(end)s)"
    live = (
        (
            f"SELECT r.id, r.amount_nano FROM budgets_reservation r WHERE r.organization_id = %(org)s"
            f" AND {usage_sql(budget.scope, 'r', 'subject')} AND {in_period.format(t='r', col='created_at')}"
        )
        if carry
        else "SELECT NULL::uuid AS id, 0::bigint AS amount_nano WHERE false"
    )
    sql = f"""
    WITH live AS ({live}),
    seed AS (
        SELECT coalesce(sum(u.cost_nano), 0) AS spent
          FROM usage_usagerecord u
         WHERE u.organization_id = %(org)s AND {usage_sql(budget.scope, "u", "subject")}
           AND {in_period.format(t="u", col="admitted_at")}
           AND (u.reservation_id IS NULL OR u.reservation_id NOT IN (SELECT id FROM live))
    ), win AS (
        INSERT INTO budgets_window (budget_id, budget_version, period_start, period_end, spent_nano,
                                    reserved_nano, seed_spent_nano, seed_reserved_nano, blocking, touched_at)
        SELECT %(budget)s, %(version)s, %(start)s, %(end)s, seed.spent, carried.reserved, seed.spent,
               carried.reserved, %(block)s, now()
          FROM seed, (SELECT CASE WHEN %(block)s THEN (SELECT coalesce(sum(amount_nano), 0) FROM live) ELSE 0 END
                             AS reserved) AS carried
            -- Not for a budget deleted or reconfigured since it was read. FOR SHARE: a deletion or
            -- an edit (which locks the budget row first) waits for this window, and then sees it.
         WHERE EXISTS (SELECT 1 FROM budgets_budget b WHERE b.id = %(budget)s AND b.version = %(version)s
                       FOR SHARE)
        ON CONFLICT DO NOTHING
        RETURNING id
    )
    INSERT INTO budgets_hold (reservation_id, window_id, amount_nano)
    SELECT live.id, win.id, CASE WHEN %(block)s THEN live.amount_nano ELSE 0 END FROM live, win
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def retire(budget: Budget) -> None:
    """Retire the budget's current windows (a new version starts; budgets.services.update_budget
    holds the budget row): lock them in id order, so admissions on them finish first and later
    ones are refused by their own statement and read the budget again."""
    ids = list(
        Window.objects.filter(budget=budget, budget_version=budget.version, retired_at__isnull=True).values_list(
            "id", flat=True
        )
    )
    if ids:
        lock_windows(ids)
        Window.objects.filter(id__in=ids).update(retired_at=timezone.now())


def release_budget(budget_id: int) -> None:
    """Before a budget is deleted (its row locked by the caller): delete its holds, lock its
    windows FOR UPDATE in id order, then delete the holds added meanwhile. Holds before windows,
    the drain's order (ledger/locks.py), so the two cannot deadlock. The windows go with the
    budget row (ON DELETE CASCADE)."""
    Hold.objects.filter(window__budget_id=budget_id).delete()
    ids = list(Window.objects.filter(budget_id=budget_id).values_list("id", flat=True))
    windows_for_delete(ids)
    Hold.objects.filter(window_id__in=ids).delete()
