"""Gateway process registry: each gateway process registers and heartbeats; beat renews the
leases of live processes' reservations and expires the rest (DESIGN §7)."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from django.utils import timezone

from budgets.models import GatewayInstance, Reservation


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


def alive_ids(*, grace: timedelta, now: datetime | None = None) -> list[int]:
    """Instances that heartbeated within `grace` and have not stopped."""
    now = now or timezone.now()
    return list(
        GatewayInstance.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=now - grace).values_list(
            "id", flat=True
        )
    )


def dead_ids(*, alive: list[int]) -> list[int]:
    """Instances that own reservations but are not alive: crashed, killed, or stopped."""
    living = set(alive)
    owners = Reservation.objects.filter(owner_id__isnull=False).values_list("owner_id", flat=True).distinct()
    return [owner for owner in owners if owner not in living]
