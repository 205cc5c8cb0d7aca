"""Alerts (DESIGN §9): threshold crossings and first refusals become AlertEvents, and each
event is emailed once.

Two rules shape this module:
- Alerts never break what called them. The drain and the gateway call in here after their own
  transaction committed; anything that goes wrong is logged and left for the catch-up.
- One email per event, however many workers race. Events are inserted with ON CONFLICT DO
  NOTHING on (window, kind, threshold), and only the inserter queues the email; delivery is
  claimed by compare-and-set on the event's status, so retries and the catch-up cannot send a
  `sent` event again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from budgets.models import Budget, Window
from usage import emails
from usage.models import AlertEvent

log = logging.getLogger(__name__)

Kind = AlertEvent.Kind
Delivery = AlertEvent.Delivery

# Delivery attempts (task retries and catch-up runs together) before an event is `failed`.
# With the backoff below that is about three hours of an unreachable mail server.
MAX_ATTEMPTS = 10
# The queued task normally sends within seconds; the catch-up waits this long before it
# assumes the task was lost (broker down when it was queued, worker killed).
CATCHUP_AFTER = timedelta(seconds=60)
# A `sending` claim older than this belongs to a worker that died mid-send (SMTP calls time out
# after emails.DEFAULT_SMTP_TIMEOUT): it may be claimed again. At worst that sends twice —
# preferred to never.
CLAIM_TTL = timedelta(minutes=5)
RETRY_BACKOFF = 30  # seconds, doubled per attempt (the task's retry_backoff matches)
RETRY_BACKOFF_MAX = 3600


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(RETRY_BACKOFF * 2 ** max(attempts - 1, 0), RETRY_BACKOFF_MAX))


# --- creating events ------------------------------------------------------------------------


def on_windows_changed(*, window_ids: list[int]) -> None:
    """Create the threshold events the windows' spend has crossed, and queue their emails.

    1. Read the windows and their budgets (after the caller's commit: no lock is held).
    2. For each threshold crossed (spent >= threshold% of amount) that has no event yet,
       INSERT .. ON CONFLICT DO NOTHING RETURNING id: only the worker whose insert won gets an
       id back, so only it queues the email.
    Thresholds are on `spent`, not spent + reserved: an email says what was spent.
    Never raises.
    """
    try:
        with transaction.atomic():  # a savepoint if the caller is in a transaction
            created = _create_threshold_events(sorted(set(window_ids)))
        for event_id in created:
            transaction.on_commit(partial(_queue_email, event_id), robust=True)
    except Exception:
        log.exception(
            "alerts: checking thresholds of windows %s failed; the drain is unaffected", window_ids
        )


def note_refusal(*, window_id: int) -> None:
    """The first refusal by a blocking ceiling in its window becomes a `refusal` event (once
    per window) and queues its email. Called by the gateway after a 402. Never raises."""
    if window_id in _refusals_noted:
        return
    try:
        with transaction.atomic():
            created = _insert_refusal(window_id)
        transaction.on_commit(partial(_note_cached, window_id), robust=True)
        for event_id in created:
            transaction.on_commit(partial(_queue_email, event_id), robust=True)
    except Exception:
        log.exception("alerts: recording the refusal on window %s failed", window_id)


def note_drift(*, window_id: int, detail: str) -> None:
    """An audit found this window's counters drifting: one `audit_drift` event per window,
    emailed like the others. Never raises."""
    try:
        with transaction.atomic():
            window = Window.objects.select_related("budget").get(pk=window_id)
            created = _insert_events([_row(window, Kind.AUDIT_DRIFT, 0, detail=detail)])
        for event_id in created:
            transaction.on_commit(partial(_queue_email, event_id), robust=True)
    except Exception:
        log.exception("alerts: recording drift on window %s failed", window_id)


# A hot ceiling refuses hundreds of requests a second once full; after the first one this
# process remembers the window so the rest cost no query. Bounded: cleared when it grows.
_refusals_noted: set[int] = set()


def _note_cached(window_id: int) -> None:
    if len(_refusals_noted) > 10_000:
        _refusals_noted.clear()
    _refusals_noted.add(window_id)


def crossed_thresholds(*, spent_nano: int, amount_nano: int, thresholds: Iterable) -> list[int]:
    """The thresholds (percent of the amount) that `spent` has reached. Nothing is crossed
    before anything is spent, even on a zero budget."""
    if spent_nano <= 0:
        return []
    valid = set()
    for t in thresholds:  # user-edited JSON: ignore what is not a whole percent
        if isinstance(t, float) and t.is_integer():
            t = int(t)
        if isinstance(t, int) and not isinstance(t, bool) and 0 < t <= 10_000:
            valid.add(t)
    return sorted(t for t in valid if spent_nano * 100 >= t * amount_nano)


def _create_threshold_events(window_ids: list[int]) -> list[int]:
    windows = list(Window.objects.select_related("budget").filter(id__in=window_ids).order_by("id"))
    wanted = {
        (w.id, t): w
        for w in windows
        for t in crossed_thresholds(
            spent_nano=w.spent_nano,
            amount_nano=w.budget.amount_nano,
            thresholds=w.budget.thresholds or [],
        )
    }
    if not wanted:
        return []
    have = _alerted({wid for wid, _ in wanted})
    rows = [
        _row(w, Kind.THRESHOLD, t) for (wid, t), w in sorted(wanted.items()) if (wid, t) not in have
    ]
    return _insert_events(rows)


def _alerted(window_ids: set[int]) -> set[tuple[int, int]]:
    """(window, threshold) pairs already alerted. Most drains find every crossed threshold
    here and skip the insert; this read is only that shortcut — the unique constraint, not
    this read, decides races (tests stub it out to prove that)."""
    return set(
        AlertEvent.objects.filter(window_id__in=window_ids, kind=Kind.THRESHOLD).values_list(
            "window_id", "threshold"
        )
    )


def _row(window: Window, kind: str, threshold: int, *, detail: str = "") -> dict:
    budget: Budget = window.budget
    return {
        "organization_id": budget.organization_id,
        "budget_id": budget.id,
        "window_id": window.id,
        "kind": kind,
        "threshold": threshold,
        "spent_nano": window.spent_nano,
        "reserved_nano": window.reserved_nano,
        "amount_nano": budget.amount_nano,
        "detail": detail,
    }


_COLUMNS = [
    "organization_id",
    "budget_id",
    "window_id",
    "kind",
    "threshold",
    "spent_nano",
    "reserved_nano",
    "amount_nano",
    "detail",
]


def _insert_events(rows: list[dict]) -> list[int]:
    """INSERT .. ON CONFLICT DO NOTHING RETURNING id: the ids of the events this call created.
    (Django's bulk_create(ignore_conflicts=True) cannot say which rows it inserted.)"""
    if not rows:
        return []
    now = timezone.now()
    one = "(" + ", ".join(["%s"] * (len(_COLUMNS) + 5)) + ", '[]'::jsonb)"
    sql = (
        f"INSERT INTO {AlertEvent._meta.db_table} ({', '.join(_COLUMNS)}, "
        "created_at, status, attempts, last_error, next_attempt_at, recipients) "
        f"VALUES {', '.join([one] * len(rows))} ON CONFLICT DO NOTHING RETURNING id"
    )
    params: list = []
    for row in rows:
        params += [row[c] for c in _COLUMNS] + [now, Delivery.PENDING, 0, "", now + CATCHUP_AFTER]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [r[0] for r in cursor.fetchall()]


def _insert_refusal(window_id: int) -> list[int]:
    # One statement: the window's budget must be blocking (an alert budget never refuses).
    now = timezone.now()
    sql = f"""
        INSERT INTO {AlertEvent._meta.db_table} ({", ".join(_COLUMNS)},
               created_at, status, attempts, last_error, next_attempt_at, recipients)
        SELECT b.organization_id, b.id, w.id, %s, 0, w.spent_nano, w.reserved_nano, b.amount_nano, '',
               %s, %s, 0, '', %s, '[]'::jsonb
          FROM {Window._meta.db_table} w JOIN {Budget._meta.db_table} b ON b.id = w.budget_id
         WHERE w.id = %s AND b.mode = %s
        ON CONFLICT DO NOTHING RETURNING id
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                Kind.REFUSAL,
                now,
                Delivery.PENDING,
                now + CATCHUP_AFTER,
                window_id,
                Budget.Mode.BLOCK,
            ],
        )
        return [r[0] for r in cursor.fetchall()]


def _queue_email(event_id: int) -> None:
    """Queue the email task. If the broker is down the event stays `pending` and
    `send_pending_alerts` sends it once the broker is back: log, never raise."""
    from usage.tasks import send_alert_email  # tasks import this module

    try:
        # Fail fast rather than hold the drain while Redis is unreachable: by default kombu
        # retries the connection for seconds (retry=False only stops the publish retries).
        # A fresh connection per email is cheap: events are a few per window per period.
        with send_alert_email.app.connection_for_write(
            transport_options={"max_retries": 0}
        ) as conn:
            send_alert_email.apply_async((event_id,), retry=False, connection=conn)
    except Exception:
        log.warning(
            "alerts: could not queue the email of event %s (broker down?); the catch-up will send it",
            event_id,
            exc_info=True,
        )


# --- delivering events ----------------------------------------------------------------------


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
    claimable = Q(status=Delivery.PENDING) | Q(
        status=Delivery.SENDING, claimed_at__lt=now - CLAIM_TTL
    )
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
        mine.update(
            status=Delivery.PENDING, last_error=error, next_attempt_at=now + backoff(event.attempts)
        )
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
