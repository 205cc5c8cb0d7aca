"""A headroom slice charged whole by expiry while its process still used it (the process was taken
for dead): its estimate (`slice-...`, `estimated`, the slice's remaining amount at worst case)
covers every request admitted from it, so their late records carve nothing and charge no window.

The first late record that finds the slice gone makes the process stop admitting from it
(`Book.charged`, ledger/slices.py), and the estimate is corrected like any estimate a true report
corrects (ledger/recording.py `correct_estimate`), here by difference:

- each late record of a request from it replaces that request's worst case with its true cost
  (once: only a record this call inserted corrects; a second report of it is not new);
- the part of the slice the process never gave to a request (its book knows it) is taken off.

What remains charged is the true cost of every request recorded late plus the worst case of those
never recorded: the safe direction, and exact once every request has reported.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from django.db import transaction
from django.db.models import F

from core.guards import Guards
from ledger.locks import lock_windows, record_for_update
from ledger.models import Reservation, UsageRecord, Window

log = logging.getLogger(__name__)

# Removal test: tests/ledger/test_slice_charged.py.
GUARDS = Guards(
    correct="late records of a lapsed slice's requests correct its worst-case charge to their true costs",
)


def settle_charged_slices(*, carved: Sequence[Reservation], costs: dict[str, int], inserted: Sequence[str]) -> None:
    """After a group insert whose carve fell short: for each slice of `carved` whose row is gone,
    stop the book admitting from it and correct its estimate by the records this insert added
    (`inserted`, request ids; `costs`, each record's cost)."""
    from ledger import slices  # ledger/slices.py imports the admission this module's callers use

    ids = {r.slice_id for r in carved if r.slice_id is not None}
    present = set(Reservation.objects.filter(id__in=ids).values_list("id", flat=True))
    gone = [i for i in ids if i not in present]
    if not gone:
        return
    unused = slices.book.charged(gone)
    if not GUARDS.correct:
        return
    fresh = set(inserted)
    for slice_id in gone:
        delta = -unused.get(slice_id, 0) + sum(
            costs[r.request_id] - r.amount_nano for r in carved if r.slice_id == slice_id and r.request_id in fresh
        )
        if delta:
            _correct(slice_id=slice_id, delta=delta)


def _correct(*, slice_id: uuid.UUID, delta: int) -> None:
    """Add `delta` (never more than it holds off) to the slice's estimate and the windows it was
    charged to: the record locked, then its windows in id order (ledger/locks.py)."""
    estimate = UsageRecord.objects.filter(reservation_id=slice_id, status=UsageRecord.Status.ESTIMATED).first()
    if estimate is None:
        return  # gone another way (closed, or not yet charged): nothing was estimated
    with transaction.atomic():
        rec = record_for_update(estimate.pk)
        if rec.status != UsageRecord.Status.ESTIMATED:
            return
        delta = max(delta, -rec.cost_nano)
        if rec.applied and rec.window_ids:
            lock_windows(rec.window_ids)
            Window.objects.filter(id__in=rec.window_ids).update(spent_nano=F("spent_nano") + delta)
        UsageRecord.objects.filter(pk=rec.pk).update(cost_nano=rec.cost_nano + delta)
    log.info("slice %s charged by expiry: its estimate corrected by %d nano-USD", slice_id, delta)
