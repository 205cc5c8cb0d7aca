"""The ledger's Celery tasks: each takes nothing and calls one ledger service. The schedule,
and why each interval, is in config/celery.py.

Every task here is safe when two runs overlap (a slow run and the next tick, or two workers):
renewals are one idempotent UPDATE, expiry inserts with ON CONFLICT DO NOTHING on the unique
request id and settles through the drain, and the drain takes its records FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from core.celery import app
from ledger import spool
from ledger.admission import renew
from ledger.drain import drain_all
from ledger.instances import alive_ids, dead_ids, prune_instances
from ledger.recording import expire
from ledger.slice_claims import delete_orphan_claims

log = logging.getLogger(__name__)


@app.task
def renew_and_expire() -> dict[str, int]:
    """Extend the leases of reservations whose gateway process still heartbeats, then charge
    the lapsed ones (owner dead past the grace, or hard deadline passed) at worst case.

    Renewal goes first so a live owner's reservation that lapsed a moment ago (a slow beat) is
    rescued rather than charged at worst case. A process's silence is counted from the
    database's last start (ledger/instances.py), so an outage does not make live processes
    dead; and a reservation made within the grace is never charged for its owner's silence.
    """
    grace = settings.CAPGATE["HEARTBEAT_GRACE"]
    now = timezone.now()
    alive = alive_ids(grace=grace, now=now)
    renewed = renew(owner_ids=alive, now=now)
    expired = expire(now=now, dead_owner_ids=dead_ids(alive=alive), dead_owner_seen_before=now - grace)
    delete_orphan_claims()
    if expired:
        log.info(
            "renew_and_expire: %s leases renewed, %s reservations expired at worst case",
            renewed,
            expired,
        )
    return {"renewed": renewed, "expired": expired}


@app.task
def drain_usage() -> int:
    """Apply whatever the gateway processes left in the outbox (a dead process's records,
    replayed spool records)."""
    return drain_all()


@app.task
def replay_spool() -> int:
    """Move records spooled while the database was down into the outbox (this host's spool;
    each gateway process also replays its own)."""
    return spool.replay()


@app.task
def prune_ledger_history() -> int:
    """Retention: rows of gateway processes gone for INSTANCE_RETENTION_DAYS (ledger/instances.py)."""
    return prune_instances()
