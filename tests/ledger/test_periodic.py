"""When beat's periodic tasks last ran (ledger/periodic.py), and which have stopped: a task is
stale a whole interval, and at least 30 s, past its due time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection
from django.utils import timezone

from ledger.models import PeriodicRun
from ledger.periodic import record_success, register_schedule, staleness
from tests.concurrency import race

T0 = timezone.now().replace(microsecond=0)


def by_task(now):
    return {row.task: row for row in staleness(now=now)}


@pytest.mark.django_db
def test_a_task_is_stale_once_a_whole_interval_and_30_s_past_due():
    # given: a 5 s task and an hourly one, each just run
    record_success(task="drain", interval_seconds=5.0, now=T0)
    record_success(task="purge", interval_seconds=3600.0, now=T0)
    # then: the 5 s task is stale after 35 s (30 s past due), the hourly one after 2 h
    assert [by_task(T0 + timedelta(seconds=s))["drain"].stale for s in (5, 35, 35.5)] == [False, False, True]
    assert [by_task(T0 + timedelta(hours=h))["purge"].stale for h in (1.5, 2, 2.01)] == [False, False, True]
    assert by_task(T0 + timedelta(seconds=12))["drain"].age_seconds == 12.0
    # when: it runs again, it is fresh again
    record_success(task="drain", interval_seconds=5.0, now=T0 + timedelta(seconds=40))
    assert not by_task(T0 + timedelta(seconds=41))["drain"].stale


@pytest.mark.django_db
def test_a_task_that_never_ran_counts_from_when_beat_registered_it():
    # given: beat started with a task that has run before and one that never has
    record_success(task="drain", interval_seconds=5.0, now=T0)
    register_schedule(intervals={"drain": 10.0, "audit": 300.0}, now=T0 + timedelta(seconds=20))
    rows = by_task(T0 + timedelta(seconds=50))
    # then: the one that ran keeps its last success (and takes the new interval); the other
    # counts from registration, stale only 600 s later
    assert (rows["drain"].interval_seconds, rows["drain"].age_seconds, rows["drain"].stale) == (10.0, 50.0, True)
    assert (rows["audit"].age_seconds, rows["audit"].stale) == (30.0, False)
    assert by_task(T0 + timedelta(seconds=621))["audit"].stale


@pytest.mark.django_db(transaction=True)
def test_workers_recording_the_same_task_at_once_all_succeed():
    """Two workers finish the same periodic task together (a slow run and the next tick): the
    record is one upsert, so neither fails on the other's insert."""
    now = timezone.now()
    race(8, lambda i: record_success(task="renew", interval_seconds=15.0, now=now + timedelta(milliseconds=i)))
    assert PeriodicRun.objects.count() == 1
    assert PeriodicRun.objects.get().last_success_at >= now


@pytest.mark.django_db(transaction=True)
def test_without_the_upsert_workers_recording_the_same_task_at_once_collide():
    """The guard above, removed: look for the row, then insert it. Both threads find none (the
    barrier sits between the read and the write) and the second insert fails."""
    now = timezone.now()
    barrier = threading.Barrier(2, timeout=30)

    def naive(i: int) -> str:
        exists = PeriodicRun.objects.filter(task="renew").exists()
        barrier.wait()
        try:
            if not exists:
                PeriodicRun.objects.create(
                    task="renew", interval_seconds=15.0, scheduled_since=now, last_success_at=now
                )
            return "ok"
        except IntegrityError:
            return "collided"
        finally:
            connection.close()

    assert sorted(race(2, naive)) == ["collided", "ok"]
