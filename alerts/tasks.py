"""Celery tasks of alerts and the audit: each takes ids (or nothing) and calls one service. The
schedule, and why each interval, is in config/celery.py; the ledger's own tasks (renewal,
expiry, drain, spool replay) are in ledger/tasks.py.

Every periodic task here is safe when two runs overlap (a slow run and the next tick, or two
workers): alert delivery claims each event by compare-and-set, and the audit runs one at a time
under its lease (alerts/audit.py, `scheduled_audit`).
"""

from __future__ import annotations

from smtplib import SMTPException

from alerts import alert_delivery, webhooks
from alerts.audit import scheduled_audit
from alerts.retention import prune_alert_events, prune_audit_runs
from core.celery import app


@app.task
def audit_counters() -> dict[str, int] | None:
    """The incremental audit; None when another run still holds the audit's lease."""
    report = scheduled_audit()
    if report is None:
        return None
    return {"windows_checked": report.windows_checked, "drifts": len(report.drifts) + len(report.request_drifts)}


@app.task
def send_pending_alerts() -> int:
    return alert_delivery.send_pending() + webhooks.send_pending()


@app.task(
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


@app.task(
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


@app.task
def prune_alert_history() -> dict[str, int]:
    """Retention: audit runs and alert events past their days (alerts/retention.py)."""
    return {"audit_runs": prune_audit_runs(), "alert_events": prune_alert_events()}
