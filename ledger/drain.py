"""The drain: apply unapplied usage records to the budget windows, in batches.

Safe to run concurrently with itself (each run takes its records FOR UPDATE SKIP LOCKED, so two
drains never take the same record) and with admissions (windows are locked in ascending id
order everywhere). A hot ceiling takes one lock per batch, not one per request.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from django.db import connection, transaction
from django.utils import timezone

from budgets.models import Hold, Reservation
from ledger.locks import lock_windows, records_for_drain, relaxed_commit
from ledger.signals import send_after_commit
from usage.models import UsageRecord


def drain(*, limit: int = 500, request_ids: Sequence[str] | None = None) -> int:
    """Apply up to `limit` unapplied records; return how many were applied.

    1. Take unapplied records, skipping those another drain holds.
    2. Collect their reservations' holds: per window, the holds come out of `reserved` and each
       record's cost goes into `spent` (alert windows have zero holds and get the cost too).
    3. Delete the reservations and their holds, mark the records applied.
    4. Last, lock those windows in id order and apply all deltas in one UPDATE; commit.
    """
    with transaction.atomic():
        relaxed_commit()  # a drain lost in a crash is simply redone (see relaxed_commit)
        records = records_for_drain(request_ids=request_ids, limit=limit)
        if not records:
            return 0
        reservation_ids = [r.reservation_id for r in records if r.reservation_id is not None]
        holds_of: dict = defaultdict(list)
        for reservation_id, window_id, amount in Hold.objects.filter(
            reservation_id__in=reservation_ids
        ).values_list("reservation_id", "window_id", "amount_nano"):
            holds_of[reservation_id].append((window_id, amount))

        spent: dict[int, int] = defaultdict(int)
        released: dict[int, int] = defaultdict(int)
        for rec in records:
            holds = holds_of.get(rec.reservation_id, [])
            rec.window_ids = sorted(window_id for window_id, _ in holds)
            for window_id, amount in holds:
                spent[window_id] += rec.cost_nano
                released[window_id] += amount

        if reservation_ids:
            Hold.objects.filter(reservation_id__in=reservation_ids).delete()
            Reservation.objects.filter(id__in=reservation_ids).delete()
        now = timezone.now()
        for rec in records:
            rec.applied = True
            rec.applied_at = now
        UsageRecord.objects.bulk_update(records, ["applied", "applied_at", "window_ids"])

        # The windows last, just before commit: admissions wait on these row locks, so they are
        # held for two statements, not across the whole batch's writes.
        window_ids = sorted(spent)
        if window_ids:
            lock_windows(window_ids)
            _apply_deltas([(wid, spent[wid], released[wid]) for wid in window_ids])
            # Thresholds are checked after commit (usage connects to windows_changed): outside
            # the window locks, and an alert that fails cannot undo the drain.
            charged = [wid for wid in window_ids if spent[wid] > 0]
            if charged:
                send_after_commit(window_ids=charged)
        return len(records)


def _apply_deltas(rows: list[tuple[int, int, int]]) -> None:
    """One UPDATE for every window of the batch: (window id, +spent, -reserved)."""
    values = ", ".join(["(%s::bigint, %s::bigint, %s::bigint)"] * len(rows))
    params = [x for row in rows for x in row]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE budgets_window AS w
               SET spent_nano = w.spent_nano + d.spent, reserved_nano = w.reserved_nano - d.released,
                   touched_at = now()
              FROM (VALUES {values}) AS d(id, spent, released)
             WHERE w.id = d.id
            """,
            params,
        )


def drain_all(*, batch: int = 500) -> int:
    """Drain until the outbox is empty (or only rows held by other drains remain)."""
    total = 0
    while n := drain(limit=batch):
        total += n
    return total
