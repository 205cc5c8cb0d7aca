"""Celery's entry point (`celery -A config worker|beat`): the project's app (core/celery.py),
each app's tasks.py, and every beat entry in one place.

Every periodic task is safe to run twice at once (ledger/tasks.py and alerts/tasks.py say how),
so a slow run overlapping the next tick, or two beats during a deploy, double no money. Each entry expires
after its own interval: if workers were down, the queued copies of a periodic task are
superseded by the next tick instead of piling up.

Beat registers this schedule in the database when it starts, and a worker records each
periodic task's success (the signals at the end; ledger/periodic.py), so /metrics says when a
task has not run for longer than it should.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

from celery.signals import beat_embedded_init, beat_init, task_success  # noqa: E402

from core.celery import app  # noqa: E402  (after the settings module is named)

app.autodiscover_tasks()

app.conf.beat_schedule = {
    # Leases (CAPGATE["LEASE"], 120 s) are renewed while their owner heartbeats (every ~10 s,
    # dead after HEARTBEAT_GRACE, 30 s). Every 15 s keeps a live stream's lease several renewals
    # from lapsing, and charges a crashed process's reservations within 15 s of their lapse.
    "renew-and-expire": {
        "task": "ledger.tasks.renew_and_expire",
        "schedule": 15.0,
        "options": {"expires": 15},
    },
    # Gateways drain their own records every ~50 ms; this catches what a dead process left. Its
    # holds keep room reserved until then, so every few seconds bounds how long a crash keeps
    # a cap tighter than it needs to be.
    "drain-usage": {
        "task": "ledger.tasks.drain_usage",
        "schedule": 5.0,
        "options": {"expires": 5},
    },
    # Spooled records are real spend the windows do not show yet; 10 s after the database
    # returns they are in the outbox (and then drained within 5 s).
    "replay-spool": {
        "task": "ledger.tasks.replay_spool",
        "schedule": 10.0,
        "options": {"expires": 10},
    },
    # Sends alert emails and webhook deliveries whose task was lost (Redis down when queued,
    # worker killed) or whose
    # retry is due. A minute late is fine for an email; the queued task is the fast path.
    "send-pending-alerts": {
        "task": "alerts.tasks.send_pending_alerts",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    # Provider jobs (jobs/poll.py): each due job is asked about with backoff (5 s, doubling, up to
    # 5 min), its hold renewed (JOB_LEASE, 15 min) while alive, settled from the final report. Every
    # 5 s keeps a fresh job's first polls on time; each run takes at most JOB_POLL_PER_RUN jobs.
    "poll-jobs": {
        "task": "jobs.tasks.poll_jobs",
        "schedule": 5.0,
        "options": {"expires": 5},
    },
    # Request log retention (REQUEST_LOG_RETENTION_DAYS, 90): rows expire by the day, so hourly
    # keeps the log within an hour of its limit, and each run deletes only an hour's worth of
    # refusals in short batches instead of a day's in one long sweep.
    "purge-request-log": {
        "task": "requestlog.tasks.purge_request_log",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # The rest of history's retention (core/retention.py; *_RETENTION_DAYS): hourly, like the
    # request log's, so each run deletes about an hour's worth in short batches.
    "prune-gateway-history": {
        "task": "gateway.tasks.prune_gateway_history",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    "prune-alert-history": {
        "task": "alerts.tasks.prune_alert_history",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    "prune-ledger-history": {
        "task": "ledger.tasks.prune_ledger_history",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    "prune-audit-history": {
        "task": "tenants.tasks.prune_audit_history",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # The incremental audit (the windows changed since its last run and a rolling sample): drift
    # is a bug to find within minutes, not a cap to keep (admission does). One run at a time.
    "audit-counters": {
        "task": "alerts.tasks.audit_counters",
        "schedule": 300.0,
        "options": {"expires": 300},
    },
}


# --- when each periodic task last ran (ledger/periodic.py; /metrics reports the stale ones) ----


def _intervals() -> dict[str, float]:
    """Seconds between runs, by task name, for every beat entry."""
    return {
        entry["task"]: float(entry["schedule"])
        for entry in app.conf.beat_schedule.values()
        if isinstance(entry.get("schedule"), int | float)
    }


@beat_init.connect
@beat_embedded_init.connect
def _register_schedule(sender=None, **kwargs) -> None:
    from django.utils import timezone

    from ledger.periodic import register_schedule  # Django's apps are ready only once beat runs

    register_schedule(intervals=_intervals(), now=timezone.now())


@task_success.connect
def _record_periodic_success(sender=None, **kwargs) -> None:
    interval = _intervals().get(getattr(sender, "name", ""))
    if interval is None:
        return
    from django.utils import timezone

    from ledger.periodic import record_success  # Django's apps are ready only once a task runs

    record_success(task=sender.name, interval_seconds=interval, now=timezone.now())
