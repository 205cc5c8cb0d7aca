"""Gateway process registry: each gateway process registers and heartbeats; beat renews the
leases of live processes' reservations and expires the rest."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from core.retention import delete_expired
from ledger.models import GatewayInstance, Reservation


def register(*, name: str | None = None) -> GatewayInstance:
    now = timezone.now()
    return GatewayInstance.objects.create(name=name or f"{socket.gethostname()}:{os.getpid()}", heartbeat_at=now)


def heartbeat(*, instance_id: int) -> bool:
    """Returns False if the instance row is gone or was marked stopped (then re-register)."""
    return bool(
        GatewayInstance.objects.filter(pk=instance_id, stopped_at__isnull=True).update(heartbeat_at=timezone.now())
    )


def stop(*, instance_id: int) -> None:
    GatewayInstance.objects.filter(pk=instance_id).update(stopped_at=timezone.now())


# Instances silent for longer than this before the database's restart are not given the
# benefit of the doubt afterwards: no outage lasts that long while a process waits it out.
LONGEST_OUTAGE = timedelta(hours=1)


def database_started_at() -> datetime:
    """When the database server last started (it was unreachable before then)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def alive_ids(*, grace: timedelta, now: datetime | None = None, started_at: datetime | None = None) -> list[int]:
    """Instances that have not stopped and heartbeated within `grace`, where a silence is
    measured from the database's last start: a process cannot heartbeat while the database is
    down, so for `grace` after a restart every process that heartbeated before it (within
    LONGEST_OUTAGE) still counts as alive; one that really died is judged a grace later."""
    now = now or timezone.now()
    started_at = started_at or database_started_at()
    heard = Q(heartbeat_at__gte=now - grace)
    if now - started_at < grace:
        heard |= Q(heartbeat_at__gte=started_at - LONGEST_OUTAGE)
    return list(GatewayInstance.objects.filter(heard, stopped_at__isnull=True).values_list("id", flat=True))


def dead_ids(*, alive: list[int]) -> list[int]:
    """Instances that own reservations but are not alive: crashed, killed, or stopped."""
    living = set(alive)
    owners = Reservation.objects.filter(owner_id__isnull=False).values_list("owner_id", flat=True).distinct()
    return [owner for owner in owners if owner not in living]


def prune_instances() -> int:
    """Retention: rows of processes silent for INSTANCE_RETENTION_DAYS (stopped or dead long ago),
    except any that still owns a reservation (expiry charges those by owner)."""
    days = settings.CAPGATE["INSTANCE_RETENTION_DAYS"]
    if not days:
        return 0
    return delete_expired(
        table="budgets_gatewayinstance",
        age_column="heartbeat_at",
        cutoff=timezone.now() - timedelta(days=days),
        keep="EXISTS (SELECT 1 FROM budgets_reservation r WHERE r.owner_id = t.id)",
    )
