"""A database restart does not make live gateway processes dead: a process's silence is counted
from the database's last start (no process can heartbeat while it is down), and a reservation
made within the grace proves its owner was alive then. A process that really stopped is still
charged a grace after the database came back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ledger.instances import LONGEST_OUTAGE, alive_ids, database_started_at, dead_ids
from ledger.models import GatewayInstance, Reservation, UsageRecord
from ledger.recording import expire
from tests.conftest import usd

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
GRACE = timedelta(seconds=3)


def test_a_process_silent_through_a_restart_is_alive_for_a_grace_after_the_database_started(db):
    # given: a process whose last heartbeat was 25 s ago, just before a 24 s outage
    silent = GatewayInstance.objects.create(name="through-the-outage", heartbeat_at=NOW - timedelta(seconds=25))
    # then: a second after the database started, it is alive; a grace later it is judged
    assert alive_ids(grace=GRACE, now=NOW, started_at=NOW - timedelta(seconds=1)) == [silent.id]
    assert alive_ids(grace=GRACE, now=NOW, started_at=NOW - GRACE - timedelta(seconds=1)) == []


def test_removal_with_the_silence_counted_from_the_last_heartbeat_it_is_dead_at_once(db):
    # given: the same process, judged as if the database had been up all along
    GatewayInstance.objects.create(name="through-the-outage", heartbeat_at=NOW - timedelta(seconds=25))
    # then: it is dead the moment the database is back, and beat would charge all it holds
    assert alive_ids(grace=GRACE, now=NOW, started_at=NOW - timedelta(days=1)) == []


def test_a_process_stopped_or_long_dead_before_the_restart_is_not_revived(db):
    GatewayInstance.objects.create(name="stopped", heartbeat_at=NOW - timedelta(seconds=5), stopped_at=NOW)
    GatewayInstance.objects.create(name="ancient", heartbeat_at=NOW - LONGEST_OUTAGE - timedelta(seconds=2))
    assert alive_ids(grace=GRACE, now=NOW, started_at=NOW - timedelta(seconds=1)) == []


def test_the_database_start_time_is_read_from_the_server(db):
    started = database_started_at()
    assert started.tzinfo is not None and started <= datetime.now(UTC)


def test_a_reservation_made_within_the_grace_is_not_charged_for_its_owners_silence(acme):
    # given: a process judged dead on a stale heartbeat that admitted a request a second ago,
    # and an older request of the same process
    acme.budget(amount="1", period="lifetime")
    stale = GatewayInstance.objects.create(name="stale", heartbeat_at=NOW - timedelta(seconds=30))
    recent = acme.admit(worst_nano=usd("0.1"), now=NOW - timedelta(seconds=1), owner_id=stale.id).reservation
    old = acme.admit(worst_nano=usd("0.2"), now=NOW - timedelta(seconds=10), owner_id=stale.id).reservation
    dead = dead_ids(alive=alive_ids(grace=GRACE, now=NOW, started_at=NOW - timedelta(days=1)))
    assert dead == [stale.id]
    # when: beat expires what dead owners hold, only what they made before the grace
    assert expire(now=NOW, dead_owner_ids=dead, dead_owner_seen_before=NOW - GRACE) == 1
    # then: the older request is charged at worst case; the recent one is kept
    assert list(UsageRecord.objects.values_list("request_id", "status")) == [(old.request_id, "estimated")]
    assert list(Reservation.objects.values_list("pk", flat=True)) == [recent.pk]


def test_removal_without_the_admission_time_both_are_charged(acme):
    acme.budget(amount="1", period="lifetime")
    stale = GatewayInstance.objects.create(name="stale", heartbeat_at=NOW - timedelta(seconds=30))
    acme.admit(worst_nano=usd("0.1"), now=NOW - timedelta(seconds=1), owner_id=stale.id)
    acme.admit(worst_nano=usd("0.2"), now=NOW - timedelta(seconds=10), owner_id=stale.id)
    assert expire(now=NOW, dead_owner_ids=[stale.id]) == 2
