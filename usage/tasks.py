"""Celery tasks: each takes ids (or nothing) and calls one service. The schedule, and why each
interval, is in config/celery.py.

Every periodic task here is safe when two runs overlap (a slow run and the next tick, or two
workers): renewals are one idempotent UPDATE, expiry inserts with ON CONFLICT DO NOTHING on
the unique request id and settles through the drain, the drain takes its records FOR UPDATE
SKIP LOCKED, and alert delivery claims each event by compare-and-set.
"""

from __future__ import annotations

import logging
from smtplib import SMTPException

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from budgets.instances import alive_ids, dead_ids
from ledger import spool
from ledger.admission import renew
from ledger.drain import drain_all
from ledger.recording import expire
from usage import alert_delivery, webhooks
from usage.audit import audit_counters as run_audit

log = logging.getLogger(__name__)


@shared_task
def renew_and_expire() -> dict[str, int]:
    """Extend the leases of reservations whose gateway process still heartbeats, then charge
    the lapsed ones (owner dead past the grace, or hard deadline passed) at worst case.

    Renewal goes first so a live owner's reservation that lapsed a moment ago (a slow beat) is
    rescued rather than charged at worst case. A process's silence is counted from the
    database's last start (budgets/instances.py), so an outage does not make live processes
    dead; and a reservation made within the grace is never charged for its owner's silence.
    """
    grace = settings.CAPGATE["HEARTBEAT_GRACE"]
    now = timezone.now()
    alive = alive_ids(grace=grace, now=now)
    renewed = renew(owner_ids=alive, now=now)
    expired = expire(now=now, dead_owner_ids=dead_ids(alive=alive), dead_owner_seen_before=now - grace)
    if expired:
        log.info(
            "renew_and_expire: %s leases renewed, %s reservations expired at worst case",
            renewed,
            expired,
        )
    return {"renewed": renewed, "expired": expired}


@shared_task
def drain_usage() -> int:
    """Apply whatever the gateway processes left in the outbox (a dead process's records,
    replayed spool records)."""
    return drain_all()


@shared_task
def replay_spool() -> int:
    """Move records spooled while the database was down into the outbox (this host's spool;
    each gateway process also replays its own)."""
    return spool.replay()


@shared_task
def audit_counters() -> dict[str, int]:
    report = run_audit()
    return {"windows_checked": report.windows_checked, "drifts": len(report.drifts) + len(report.request_drifts)}


@shared_task
def send_pending_alerts() -> int:
    return alert_delivery.send_pending() + webhooks.send_pending()


@shared_task(
    autoretry_for=(webhooks.WebhookFailed,),
    max_retries=5,
    retry_backoff=webhooks.RETRY_BACKOFF,  # 30 s, 60 s, ... like webhooks.backoff()
    retry_backoff_max=webhooks.RETRY_BACKOFF_MAX,
    retry_jitter=False,
)
def send_alert_webhook(delivery_id: int) -> str:
    """POST one signed alert to one webhook channel. Idempotent: a delivery already sent (or
    claimed) is skipped; after the retries `send_pending_alerts` keeps trying until
    webhooks.MAX_ATTEMPTS."""
    return webhooks.deliver(delivery_id=delivery_id)


@shared_task(
    autoretry_for=(SMTPException, OSError),  # SMTPException is an OSError; named for the reader
    max_retries=5,
    retry_backoff=alert_delivery.RETRY_BACKOFF,  # 30 s, 60 s, 120 s, ... like alert_delivery.backoff()
    retry_backoff_max=alert_delivery.RETRY_BACKOFF_MAX,
    retry_jitter=False,
)
def send_alert_email(event_id: int) -> str:
    """Email one AlertEvent. Idempotent: an event already sent (or claimed) is skipped. After
    the retries, the event stays `pending` and `send_pending_alerts` keeps trying until
    alert_delivery.MAX_ATTEMPTS."""
    return alert_delivery.deliver(event_id=event_id)
