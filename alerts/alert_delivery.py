"""Alert delivery: each AlertEvent emailed at most once, however many workers race.

Delivery is claimed by compare-and-set on the event's status, so retries and the catch-up
cannot send a `sent` event again. Events are created in alerts/alerts.py; the task that sends
one and the catch-up are in alerts/tasks.py.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import F, Q
from django.utils import timezone

from alerts import emails
from alerts.models import AlertEvent

log = logging.getLogger(__name__)

Delivery = AlertEvent.Delivery

# Delivery attempts (task retries and catch-up runs together) before an event is `failed`.
# With the backoff below that is about three hours of an unreachable mail server.
MAX_ATTEMPTS = 10
# A `sending` claim older than this belongs to a worker that died mid-send (SMTP calls time out
# after emails.DEFAULT_SMTP_TIMEOUT): it may be claimed again. At worst that sends twice —
# preferred to never.
CLAIM_TTL = timedelta(minutes=5)
RETRY_BACKOFF = 30  # seconds, doubled per attempt (the task's retry_backoff matches)
RETRY_BACKOFF_MAX = 3600


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(RETRY_BACKOFF * 2 ** max(attempts - 1, 0), RETRY_BACKOFF_MAX))


def deliver(*, event_id: int, now: datetime | None = None) -> str:
    """Send one event's email, at most once. Returns the event's delivery status after this
    call, or "skipped" if it was not ours to send (already sent, failed, or claimed).

    1. Claim: UPDATE status pending -> sending (or take over a claim older than CLAIM_TTL),
       counting the attempt. Only the caller whose UPDATE changed the row goes on.
    2. Send to the budget's recipients, outside any transaction.
    3. Record the outcome on the claimed row: sent; or pending with the error and the next
       attempt time, re-raising so the task retries with backoff; or failed once attempts run
       out (not raised: retrying would not help).
    """
    now = now or timezone.now()
    claimable = Q(status=Delivery.PENDING) | Q(status=Delivery.SENDING, claimed_at__lt=now - CLAIM_TTL)
    claimed = AlertEvent.objects.filter(claimable, pk=event_id).update(
        status=Delivery.SENDING, claimed_at=now, attempts=F("attempts") + 1
    )
    if not claimed:
        return "skipped"
    event = AlertEvent.objects.select_related(
        "budget__organization",
        "budget__project",
        "budget__member__user",
        "budget__api_key",
        "budget__end_customer",
        "window",
    ).get(pk=event_id)
    mine = AlertEvent.objects.filter(pk=event_id, status=Delivery.SENDING, claimed_at=now)
    try:
        recipients = emails.recipients_for(event.budget)
        if not recipients:
            mine.update(
                status=Delivery.FAILED,
                last_error="no recipients: the budget names none and "
                "the organization has no owner with an email address",
            )
            log.error("alerts: event %s has no one to send to", event_id)
            return Delivery.FAILED
        emails.send_alert(event=event, recipients=recipients)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        if event.attempts >= MAX_ATTEMPTS:
            mine.update(status=Delivery.FAILED, last_error=error)
            log.error(
                "alerts: giving up on event %s after %s attempts: %s",
                event_id,
                event.attempts,
                error,
            )
            return Delivery.FAILED
        mine.update(status=Delivery.PENDING, last_error=error, next_attempt_at=now + backoff(event.attempts))
        log.warning(
            "alerts: sending event %s failed (attempt %s), will retry: %s",
            event_id,
            event.attempts,
            error,
        )
        raise
    mine.update(status=Delivery.SENT, sent_at=timezone.now(), recipients=recipients, last_error="")
    return Delivery.SENT


def send_pending(*, now: datetime | None = None, limit: int = 100) -> int:
    """The catch-up: send events whose queued task was lost (broker down, worker killed) or
    whose retry is due. Safe to run alongside the tasks and itself: `deliver` claims each
    event. Returns how many were sent."""
    now = now or timezone.now()
    due = (
        AlertEvent.objects.filter(
            Q(status=Delivery.PENDING, next_attempt_at__lte=now)
            | Q(status=Delivery.SENDING, claimed_at__lt=now - CLAIM_TTL)
        )
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    sent = 0
    for event_id in list(due):
        try:
            sent += deliver(event_id=event_id, now=now) == Delivery.SENT
        except Exception:
            pass  # recorded on the event and logged by deliver; the next run retries
    return sent
