"""When beat's periodic tasks last ran, and which have stopped running.

Beat registers its schedule when it starts, and a worker records each periodic task's success
(both wired in config/celery.py); /metrics reads `staleness` at scrape time
(gateway/http/metrics.py). A task is stale when it has not succeeded for more than one whole
interval past its due time, and at least 30 s past it: late enough that a slow run or a
scrape between two runs is not stale, early enough that a stopped beat or worker shows within
one interval (within 35 s for the 5 s tasks, 2 h for the hourly one). A task never run counts
from when beat registered it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ledger.models import PeriodicRun

MIN_SLACK = timedelta(seconds=30)


@dataclass(frozen=True)
class Staleness:
    task: str
    interval_seconds: float
    age_seconds: float  # since its last success, or since beat registered it if it never ran
    stale: bool


def stale_after(interval_seconds: float) -> timedelta:
    interval = timedelta(seconds=interval_seconds)
    return interval + max(interval, MIN_SLACK)


def register_schedule(*, intervals: dict[str, float], now: datetime) -> None:
    """Beat's schedule (task name -> seconds between runs): new tasks are added, known ones get
    the interval they have now; their last success is kept."""
    PeriodicRun.objects.bulk_create(
        [PeriodicRun(task=task, interval_seconds=seconds, scheduled_since=now) for task, seconds in intervals.items()],
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["interval_seconds"],
    )


def record_success(*, task: str, interval_seconds: float, now: datetime) -> None:
    PeriodicRun.objects.bulk_create(
        [PeriodicRun(task=task, interval_seconds=interval_seconds, scheduled_since=now, last_success_at=now)],
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["interval_seconds", "last_success_at"],
    )


def staleness(*, now: datetime) -> list[Staleness]:
    rows = []
    for run in PeriodicRun.objects.order_by("task"):
        age = now - (run.last_success_at or run.scheduled_since)
        rows.append(
            Staleness(
                task=run.task,
                interval_seconds=run.interval_seconds,
                age_seconds=max(age.total_seconds(), 0.0),
                stale=age > stale_after(run.interval_seconds),
            )
        )
    return rows
