"""What a dead process's headroom slice is charged: the worst cases of its requests in flight, not
its unused room.

A request admitted in memory from a slice of a blocking ceiling writes a claim (ledger.models.
SliceClaim: its id, request id, model, worst case and admission time) before its provider call,
then reads that its slice's row is still its process's (`claim`). Both are plain statements on
rows no other request touches: no lock. When beat takes a process for dead:

1. `fence_dead_slices` takes its lapsed slices from it (owner NULL, lease ended now) and commits.
2. `settle_fenced_slices` then, for each ownerless slice: carves out every claim that has no
   usage record (the carve of ledger/carving.py, so each becomes a reservation of its own at its
   worst case, with its holds), gives what is left back to the windows, and deletes the claims.
   Expiry then charges those reservations at worst case as `estimated` under the requests' own
   ids, and a late true report corrects each like any estimate. A request recorded before is
   not claimed again: its record carved it, and the drain settles it.

Why a claim written after the fence cannot be lost: a request writes its claim (committed), then
reads its slice's owner; the fence writes the owner (committed), then reads the claims. One of
the two reads sees the other's write. If the request sees its slice fenced (`unclaim`), it takes
its claim back: deleted, it was not carved and the request is admitted afresh; already gone,
expiry carved it and it stands on its own reservation.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction

from core.guards import Guards
from ledger.carving import CARVE_CTES, SLICE, give_back
from ledger.models import Reservation, SliceClaim

log = logging.getLogger(__name__)

# Removal tests: tests/ledger/test_slice_claims.py.
GUARDS = Guards(
    charge_in_flight="a dead process's slice is charged the worst cases of its requests in flight",
    read_fence="a request from a slice is sent only once its claim is written and its slice is still its process's",
)

_CLAIM = SliceClaim._meta.db_table
_INSERT_SQL = f"""
INSERT INTO {_CLAIM} (id, slice_id, request_id, model, amount_nano, created_at)
VALUES (%s, %s, %s, %s, %s, %s)
"""
_OWNED_SQL = f"""
SELECT EXISTS (SELECT 1 FROM budgets_reservation WHERE id = %s AND owner_id = %s AND origin = '{SLICE}')
"""


def claim(*, reservation: Reservation) -> bool:
    """Write the claim of a request admitted from a slice (its `slice_id` set), then read that the
    slice is still its owner's. True: the request may go to its provider. False: the slice was
    fenced for its owner's death; the caller calls `unclaim`."""
    assert reservation.slice_id is not None
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT_SQL,
            [
                reservation.id,
                reservation.slice_id,
                reservation.request_id,
                reservation.model,
                reservation.amount_nano,
                reservation.created_at,
            ],
        )
        if not GUARDS.read_fence:
            return True
        cursor.execute(_OWNED_SQL, [reservation.slice_id, reservation.owner_id])
        return bool(cursor.fetchone()[0])


def unclaim(*, reservation: Reservation) -> bool:
    """Take back the claim of a request whose slice was fenced. True: expiry carved it first, so it
    has its own reservation (held at its worst case) and may go on. False: it was not carved and
    now cannot be; the caller admits it afresh."""
    with connection.cursor() as cursor:
        # Waits for an expiry holding the claim: after that it is deleted (carved) or still here.
        cursor.execute(f"DELETE FROM {_CLAIM} WHERE id = %s RETURNING 1", [reservation.id])
        if cursor.fetchone() is not None:
            return False
        cursor.execute("SELECT EXISTS (SELECT 1 FROM budgets_reservation WHERE id = %s)", [reservation.id])
        return bool(cursor.fetchone()[0])


# A dead owner's slices that expiry would charge (lapsed, or taken before the owner's silence
# counted): no owner from now on, so no renewal and no admission. Their lease ends just before
# `now`, which the requests carved from them inherit, so the same expiry charges those.
_FENCE_SQL = f"""
UPDATE budgets_reservation r
   SET owner_id = NULL, expires_at = least(r.expires_at, %(now)s - interval '1 microsecond')
 WHERE r.origin = '{SLICE}' AND r.owner_id = ANY(%(dead)s)
   AND (r.expires_at < %(now)s OR r.deadline_at < %(now)s OR r.created_at < %(seen_before)s)
   AND NOT EXISTS (SELECT 1 FROM usage_usagerecord u WHERE u.request_id = r.request_id)
"""


def fence_dead_slices(*, dead_owner_ids: Sequence[int], now: datetime, seen_before: datetime | None) -> int:
    """Step 1: take the lapsed slices of dead owners from them, in a transaction of its own (it
    must commit before `settle_fenced_slices` reads their claims). Returns how many."""
    if not dead_owner_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_FENCE_SQL, {"dead": list(dead_owner_ids), "now": now, "seen_before": seen_before or now})
        return cursor.rowcount


# Carve a fenced slice's claims that have no record (CARVE_CTES skips a request recorded, or
# with a reservation, already), claims locked after their slices (the caller locked them).
_CARVE_CLAIMS_SQL = f"""
WITH item AS MATERIALIZED (
    SELECT c.id, c.request_id, c.slice_id, c.amount_nano, c.model, c.created_at
      FROM {_CLAIM} c
     WHERE c.slice_id = ANY(%s::uuid[])
     ORDER BY c.id
       FOR UPDATE
), {CARVE_CTES}
SELECT count(*), coalesce(sum(amount_nano), 0) FROM carved
"""


def settle_fenced_slices(*, limit: int = 100) -> tuple[int, int]:
    """Step 2, one transaction: each ownerless slice keeps only its claims' worst cases (as
    reservations of their own) and gives the rest back. Returns (requests carved, nano-USD given
    back)."""
    carved = returned = 0
    with transaction.atomic():
        # Slices first, then their claims: the order `give_back`'s close takes them in.
        fenced = list(
            Reservation.objects.select_for_update(skip_locked=True)
            .filter(origin=SLICE, owner_id__isnull=True)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        if not fenced:
            return 0, 0
        if GUARDS.charge_in_flight:
            with connection.cursor() as cursor:
                cursor.execute(_CARVE_CLAIMS_SQL, [fenced])
                carved, _amount = cursor.fetchone()
        for slice_id, left in Reservation.objects.filter(id__in=fenced).values_list("id", "amount_nano"):
            if give_back(slice_id=slice_id, amount_nano=left, close=True):
                returned += left
        SliceClaim.objects.filter(slice_id__in=fenced).delete()
    if carved or returned:
        log.info("dead processes' slices: %d calls in flight kept, %d nano-USD given back", carved, returned)
    return int(carved), returned


def delete_orphan_claims(*, slice_ids: Sequence[uuid.UUID] | None = None) -> int:
    """Delete claims whose slice is gone (carved to zero, or charged and drained)."""
    qs = SliceClaim.objects.exclude(slice_id__in=Reservation.objects.values("id"))
    if slice_ids is not None:
        qs = qs.filter(slice_id__in=list(slice_ids))
    return qs.delete()[0]
