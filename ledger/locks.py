"""Every row lock the ledger takes, in one place, and the one order they are taken in.

The order (a writer that needs several of these takes them top to bottom, never back up):

1. the budget row (`budget_for_update`): edits and deletions of a budget;
2. usage records (`records_for_drain`, `record_for_update`) and lapsed reservations
   (`claim_lapsed`), each skipping or waiting on its own rows only;
3. holds are deleted (the drain, `ledger.windows.release_budget`) before any window is locked;
4. windows last, always in ascending id order (`windows_for_update`, `lock_windows`,
   `windows_for_delete`, and the admission statement's `ADMIT_WINDOW_LOCK` after its
   `ORDER BY w.id`), held for as few statements as possible before commit.

Ascending window ids are the one global order, so two writers whose window sets overlap queue
instead of deadlocking. The admission statement (ledger/admission.py) is a single SQL statement,
so its lock is a clause in that SQL rather than a queryset; it is defined here so that the
strength and order are written once.

Window creation under a live period takes a table lock instead (`lock_reservations_table`,
ledger/windows.py says why); the mode conflicts with itself, so two such creations queue.

`relaxed_commit` is the one transaction mode the ledger changes: which writes may commit before
their WAL reaches disk.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Q, QuerySet

from ledger.models import Budget, Reservation, UsageRecord, Window

# FOR NO KEY UPDATE, not FOR UPDATE: counter writes never change the key, so NO KEY UPDATE is the
# exact strength needed, and it leaves FOR KEY SHARE (a foreign key check on a window, e.g. from
# window creation) free. Holds do not reference windows by a database constraint any more
# (ledger.models.Hold says why), so inserting a hold takes no lock on its window.
WINDOW_LOCK_STRENGTH = "FOR NO KEY UPDATE"
# The admission statement's lock on its `ceilings` CTE (alias `w`), which orders by w.id first.
ADMIT_WINDOW_LOCK = f"{WINDOW_LOCK_STRENGTH} OF w"


def windows_for_update(ids: Sequence[int]) -> QuerySet[Window]:
    """The windows `ids`, locked FOR NO KEY UPDATE in ascending id order when evaluated."""
    return Window.objects.select_for_update(no_key=True, of=("self",)).filter(id__in=ids).order_by("id")


def lock_windows(ids: Sequence[int]) -> list[int]:
    """Lock the windows `ids` now (ascending id order); return the ids that exist."""
    return list(windows_for_update(ids).values_list("id", flat=True))


def windows_for_delete(ids: Sequence[int]) -> list[int]:
    """Lock windows about to be deleted (FOR UPDATE: the key goes too), ascending id order."""
    return list(
        Window.objects.select_for_update(of=("self",)).filter(id__in=ids).order_by("id").values_list("id", flat=True)
    )


def budget_for_update(pk: int) -> Budget | None:
    """Lock one budget row (FOR UPDATE): a window being created for it finishes first, or is not
    created (window creation reads the budget FOR SHARE)."""
    return Budget.objects.select_for_update().filter(pk=pk).first()


def records_for_drain(*, request_ids: Sequence[str] | None, limit: int) -> list[UsageRecord]:
    """Unapplied usage records, oldest first, skipping those another drain holds."""
    qs = UsageRecord.objects.select_for_update(skip_locked=True).filter(applied=False)
    if request_ids is not None:
        qs = qs.filter(request_id__in=list(request_ids))
    return list(qs.order_by("id")[:limit])


def record_for_update(pk: int) -> UsageRecord:
    """One usage record, locked (waits for a drain that holds it)."""
    return UsageRecord.objects.select_for_update().get(pk=pk)


def claim_lapsed(condition: Q, *, limit: int) -> list[Reservation]:
    """Lock lapsed reservations for this expiry run, skipping those another run holds."""
    return list(
        Reservation.objects.select_for_update(skip_locked=True).filter(condition).order_by("expires_at")[:limit]
    )


def lock_reservations_table() -> None:
    """SHARE ROW EXCLUSIVE on budgets_reservation: waits for every admission and drain in
    progress to commit and holds new ones off (ledger/windows.py, mid-life windows)."""
    with connection.cursor() as cursor:
        cursor.execute("LOCK TABLE budgets_reservation IN SHARE ROW EXCLUSIVE MODE")


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
