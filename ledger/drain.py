"""The drain: apply unapplied usage records to the budget windows, in batches.

Safe to run concurrently with itself (each run takes its records FOR UPDATE SKIP LOCKED, so two
drains never take the same record) and with admissions (windows are locked in ascending id
order everywhere). A hot ceiling takes one lock per batch, not one per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

from django.db import connection, transaction
from django.utils import timezone

from ledger.locks import WINDOW_LOCK_STRENGTH
from ledger.signals import send_after_commit

# One statement, one round trip: the ORM version cost ~10 statements and several ms
# of Python per batch, on the thread pool every request's admission shares (docs/performance.md).
# Run as one simple query after SET LOCAL, so it is one implicit transaction with a relaxed
# commit (ledger/locks.py relaxed_commit: a drain lost in a crash is simply redone); an error
# anywhere rolls all of it back. Each CTE that must finish before the next reads its RETURNING
# count, so the window row locks are taken last, in ascending id order, and held only for the
# final UPDATE and the commit.
_DRAIN_SQL = """
SET LOCAL synchronous_commit = off;
WITH batch AS MATERIALIZED (
    SELECT id, reservation_id, cost_nano FROM usage_usagerecord
     WHERE NOT applied {only}
     ORDER BY id
     LIMIT %(limit)s
       FOR UPDATE {skip}
), held AS MATERIALIZED (
    SELECT b.id AS record_id, h.window_id, h.amount_nano, b.cost_nano
      FROM batch b JOIN budgets_hold h ON h.reservation_id = b.reservation_id
), per_record AS MATERIALIZED (
    SELECT b.id, coalesce(array_agg(h.window_id ORDER BY h.window_id) FILTER (WHERE h.window_id IS NOT NULL),
                          '{{}}'::bigint[]) AS window_ids
      FROM batch b LEFT JOIN held h ON h.record_id = b.id
     GROUP BY b.id
), gone_holds AS (
    DELETE FROM budgets_hold h USING batch b WHERE h.reservation_id = b.reservation_id RETURNING 1
), gone_reservations AS (
    DELETE FROM budgets_reservation r USING batch b WHERE r.id = b.reservation_id RETURNING 1
), marked AS (
    UPDATE usage_usagerecord u
       SET applied = true, applied_at = %(now)s, window_ids = p.window_ids
      FROM per_record p
     WHERE u.id = p.id
    RETURNING 1
), done AS MATERIALIZED (
    SELECT (SELECT count(*) FROM marked) AS records, (SELECT count(*) FROM gone_holds) AS holds,
           (SELECT count(*) FROM gone_reservations) AS reservations
     WHERE {delay}
), deltas AS MATERIALIZED (
    SELECT held.window_id AS id, sum(held.cost_nano) AS spent, sum(held.amount_nano) AS released
      FROM held, done
     WHERE done.records >= 0 AND done.holds >= 0 AND done.reservations >= 0
     GROUP BY held.window_id
), locked AS MATERIALIZED (
    SELECT w.id FROM budgets_window w
     WHERE w.id IN (SELECT id FROM deltas)
     ORDER BY w.id
       {lock}
), applied AS (
    UPDATE budgets_window w
       SET spent_nano = w.spent_nano + d.spent, reserved_nano = w.reserved_nano - d.released, touched_at = now()
      FROM deltas d, (SELECT count(*) AS n FROM locked) l
     WHERE w.id = d.id AND l.n > 0
    RETURNING w.id, w.budget_id, w.spent_nano, d.spent
)
SELECT done.records,
       (SELECT coalesce(json_agg(json_build_array(a.id, a.spent_nano, b.amount_nano, b.thresholds) ORDER BY a.id),
                        '[]'::json)
          FROM applied a JOIN budgets_budget b ON b.id = a.budget_id
         WHERE a.spent > 0)
  FROM done
"""

# Race tests only: > 0 sleeps after the records and holds are read, before the windows are
# locked, so concurrent drains overlap the way a missing guard would need every time.
RACE_DELAY_SECONDS = 0.0


def drain(
    *,
    limit: int = 500,
    request_ids: Sequence[str] | None = None,
    window_ids: Sequence[int] | None = None,
    wait: bool = False,
) -> int:
    """Apply up to `limit` unapplied records; return how many were applied.

    1. Take unapplied records (oldest first), skipping those another drain holds — or, with
       `wait`, waiting for that drain to commit (admission's refusal path, ledger/admission.py
       `settle_finished`: once it returns, every record committed before it started is applied,
       by it or by the other drain). With `window_ids`, only the records holding on one of those
       windows.
    2. Per window, their reservations' holds come out of `reserved` and each record's cost goes
       into `spent` (alert windows have zero holds and get the cost too); each record keeps the
       windows it was charged to (`window_ids`).
    3. Delete the reservations and their holds, mark the records applied.
    4. Last, lock those windows in id order and apply all deltas in one UPDATE; commit.
    Then tell the apps above which windows were charged (ledger.signals.windows_changed, after
    commit: outside the window locks, and a receiver that fails cannot undo the drain).
    """
    params: dict = {"limit": limit, "now": timezone.now()}
    only = ""
    if request_ids is not None:
        only = "AND request_id = ANY(%(request_ids)s::varchar[])"
        params["request_ids"] = list(request_ids)
    if window_ids is not None:
        only += (
            " AND EXISTS (SELECT 1 FROM budgets_hold h WHERE h.reservation_id = usage_usagerecord.reservation_id"
            " AND h.window_id = ANY(%(window_ids)s::bigint[]))"
        )
        params["window_ids"] = list(window_ids)
    delay = f"pg_sleep({float(RACE_DELAY_SECONDS)})::text = ''" if RACE_DELAY_SECONDS else "true"
    skip = "" if wait else "SKIP LOCKED"
    sql = _DRAIN_SQL.format(only=only, delay=delay, lock=WINDOW_LOCK_STRENGTH, skip=skip)
    nested = connection.in_atomic_block
    # Inside a caller's transaction (release, tests) a savepoint keeps a failed drain from
    # aborting it; SET LOCAL then applies to that transaction, as relaxed_commit documents.
    with transaction.atomic() if nested else nullcontext(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.cursor.nextset()  # past the SET's empty result
        count, charged = cursor.fetchone()
    if charged:
        # With where each window's spend now stands, so a receiver can skip the windows that
        # cannot need it (usage's threshold check skips those below every threshold: most).
        send_after_commit(
            window_ids=[row[0] for row in charged],  # at once outside a transaction
            windows={
                wid: {"spent_nano": spent, "amount_nano": amount, "thresholds": thresholds or []}
                for wid, spent, amount, thresholds in charged
            },
        )
    return int(count)


def drain_all(*, batch: int = 500) -> int:
    """Drain until the outbox is empty (or only rows held by other drains remain)."""
    total = 0
    while n := drain(limit=batch):
        total += n
    return total
