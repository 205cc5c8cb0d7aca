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
deadlocking when each, inside a caller's transaction, goes on to insert a reservation. An admission that read the budgets before the edit re-checks them inside its own
statement (ledger.admission._ADMIT_SQL, `stale`) and retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from budgets.models import Budget

Bounds = dict[int, tuple[datetime, datetime | None]]

# Guard point: the tests set it to False to show that without carrying live holds a new window
# under-counts the requests in flight (the leak of issue 15, item 2).
CARRY_HOLDS = True

_SCOPE_SQL = {
    Budget.Scope.ORGANIZATION: "true",
    Budget.Scope.PROJECT: "{t}.project_id = %(subject)s",
    Budget.Scope.MEMBER: "{t}.member_id = %(subject)s",
    Budget.Scope.KEY: "{t}.api_key_id = %(subject)s",
    Budget.Scope.END_CUSTOMER: "{t}.end_customer_id = %(subject)s",
    Budget.Scope.RUN: "{t}.run_id = %(subject)s",
}


def _subject(budget: Budget) -> Any:
    return {
        Budget.Scope.ORGANIZATION: None, Budget.Scope.PROJECT: budget.project_id, Budget.Scope.MEMBER: budget.member_id,
        Budget.Scope.KEY: budget.api_key_id, Budget.Scope.END_CUSTOMER: budget.end_customer_id,
        Budget.Scope.RUN: budget.run_id,
    }[Budget.Scope(budget.scope)]


def mid_life(budget: Budget, start: datetime) -> bool:
    """Created or reconfigured after its period began: in-flight requests may lack its hold."""
    return budget.version_at is not None and budget.version_at > start


def create_windows(*, budgets: Sequence[Budget], bounds: Bounds) -> None:
    """Create each budget's window for its period (INSERT .. ON CONFLICT DO NOTHING: racing
    first requests agree on one row), seeded with the period's truth for its scope."""
    plain = [b for b in budgets if not mid_life(b, bounds[b.id][0])]
    carried = [b for b in budgets if mid_life(b, bounds[b.id][0])]
    with transaction.atomic():
        for b in plain:
            _create(b, bounds[b.id], carry=False)
    if carried:
        with transaction.atomic():
            # Run budgets are created by their run's own first call, before it admits: no
            # request of the run can hold a stale list, so they skip the table lock.
            if CARRY_HOLDS and any(b.scope != Budget.Scope.RUN for b in carried):
                with connection.cursor() as cursor:
                    cursor.execute("LOCK TABLE budgets_reservation IN SHARE ROW EXCLUSIVE MODE")
            for b in carried:
                _create(b, bounds[b.id], carry=CARRY_HOLDS)


def _create(budget: Budget, bounds: tuple[datetime, datetime | None], *, carry: bool) -> None:
    start, end = bounds
    params: dict[str, Any] = {"org": budget.organization_id, "subject": _subject(budget), "start": start, "end": end,
              "budget": budget.id, "version": budget.version, "block": budget.mode == Budget.Mode.BLOCK}
    scope = Budget.Scope(budget.scope)
    in_period = "{t}.{col} >= %(start)s AND (%(end)s::timestamptz IS NULL OR {t}.{col} < %(end)s)"
    live = (
        f"SELECT r.id, r.amount_nano FROM budgets_reservation r WHERE r.organization_id = %(org)s"
        f" AND {_SCOPE_SQL[scope].format(t='r')} AND {in_period.format(t='r', col='created_at')}"
    ) if carry else "SELECT NULL::uuid AS id, 0::bigint AS amount_nano WHERE false"
    sql = f"""
    WITH live AS ({live}),
    seed AS (
        SELECT coalesce(sum(u.cost_nano), 0) AS spent
          FROM usage_usagerecord u
         WHERE u.organization_id = %(org)s AND {_SCOPE_SQL[scope].format(t='u')}
           AND {in_period.format(t='u', col='admitted_at')}
           AND (u.reservation_id IS NULL OR u.reservation_id NOT IN (SELECT id FROM live))
    ), win AS (
        INSERT INTO budgets_window (budget_id, budget_version, period_start, period_end, spent_nano,
                                    reserved_nano, seed_spent_nano, touched_at)
        SELECT %(budget)s, %(version)s, %(start)s, %(end)s, seed.spent,
               CASE WHEN %(block)s THEN (SELECT coalesce(sum(amount_nano), 0) FROM live) ELSE 0 END,
               seed.spent, now()
          FROM seed
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
