"""Alerts: threshold crossings and first refusals become AlertEvents, and each
event is emailed once (the sending: alerts/alert_delivery.py).

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
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from alerts import webhooks
from alerts.models import AlertEvent, AlertSettings
from ledger.models import Budget, UsageRecord, Window

log = logging.getLogger(__name__)

Kind = AlertEvent.Kind
Delivery = AlertEvent.Delivery

# A new event's first catch-up time (its next_attempt_at). The queued task normally sends
# within seconds; the catch-up (alerts/alert_delivery.py send_pending) waits this long before it
# assumes the task was lost (broker down when it was queued, worker killed).
CATCHUP_AFTER = timedelta(seconds=60)

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
        log.exception("alerts: checking thresholds of windows %s failed; the drain is unaffected", window_ids)


def note_refusal(*, window_id: int, tipped_by: dict | None = None, now: datetime | None = None) -> None:
    """A blocking ceiling refused a request. The first refusal in a window in each hour becomes
    a `refusal` event (naming the refused request) and is sent; later ones that hour only add
    to its count. Called by the gateway after a 402. Never raises.

    The count is kept in this process and written with the next refusal at least
    REFUSAL_FLUSH later: a hot ceiling refusing hundreds of requests a second costs one UPDATE
    per window per interval, not one per request. A process that stops loses its unwritten
    part of the count (the alert is what matters, the count is for reading).
    """
    bucket = refusal_bucket(now or timezone.now())
    key = (window_id, bucket)
    pending = _refusals_pending.get(key)
    if pending is not None:
        pending[0] += 1
        if time.monotonic() - pending[1] < REFUSAL_FLUSH.total_seconds():
            return
    try:
        count = int(pending[0]) if pending is not None else 1
        with transaction.atomic():
            created = _insert_refusal(window_id, bucket=bucket, count=count, tipped_by=tipped_by or {})
        _note_cached(key)
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
# process counts the rest in memory: (window, hour) -> [refusals not yet written, last write].
# Bounded: cleared when it grows.
_refusals_pending: dict[tuple[int, int], list[float]] = {}
REFUSAL_FLUSH = timedelta(seconds=10)


def refusal_bucket(at: datetime) -> int:
    """The hour a refusal falls in (hours since the epoch): one refusal alert per window per hour."""
    return int(at.timestamp()) // 3600


def _note_cached(key: tuple[int, int]) -> None:
    if len(_refusals_pending) > 10_000:
        _refusals_pending.clear()
    _refusals_pending[key] = [0, time.monotonic()]


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
    """Of the thresholds a window newly crossed at once, only the highest is sent; the lower
    ones are recorded as `skipped` (so they never fire later). That is what a budget created
    or lowered mid-period, or one large request, needs: one email saying where spend is, not
    10%, 50% and 100% in the same minute. Run budgets alert only if the organization opted in."""
    windows = list(Window.objects.select_related("budget").filter(id__in=window_ids).order_by("id"))
    windows = [w for w in windows if w.budget.scope != Budget.Scope.RUN or _alerts_runs(w.budget.organization_id)]
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
    new = sorted(key for key in wanted if key not in have)
    highest = {wid: t for wid, t in new}  # sorted: the last threshold per window wins
    rows = []
    for wid, t in new:
        w = wanted[(wid, t)]
        if t == highest[wid]:
            rows.append(_row(w, Kind.THRESHOLD, t, tipped_by=_last_charge(w)))
        else:
            rows.append(
                _row(
                    w,
                    Kind.THRESHOLD,
                    t,
                    status=Delivery.SKIPPED,
                    detail=f"superseded by {highest[wid]}%, crossed at the same time",
                )
            )
    return _insert_events(rows)


def _alerts_runs(organization_id: int) -> bool:
    return AlertSettings.objects.filter(organization_id=organization_id, alert_run_budgets=True).exists()


def _last_charge(window: Window) -> dict:
    """The request that tipped a threshold: the latest applied usage record charged to the
    window (in a drain batch, the last of the batch)."""
    record = (
        UsageRecord.objects.filter(
            organization_id=window.budget.organization_id,
            admitted_at__gte=window.period_start,
            applied=True,
            window_ids__contains=[window.id],
        )
        .select_related("api_key", "end_customer")
        .order_by("-applied_at", "-id")
        .first()
    )
    if record is None:
        return {}
    return {
        "request_id": record.request_id,
        "key": str(record.api_key) if record.api_key else "",
        "customer": record.end_customer.external_id if record.end_customer else "",
        "run": record.run_id or "",
        "model": record.model,
    }


def _alerted(window_ids: set[int]) -> set[tuple[int, int]]:
    """(window, threshold) pairs already alerted. Most drains find every crossed threshold
    here and skip the insert; this read is only that shortcut — the unique constraint, not
    this read, decides races (tests stub it out to prove that)."""
    return set(
        AlertEvent.objects.filter(window_id__in=window_ids, kind=Kind.THRESHOLD).values_list("window_id", "threshold")
    )


def _row(
    window: Window,
    kind: str,
    threshold: int,
    *,
    detail: str = "",
    status: str = Delivery.PENDING,
    tipped_by: dict | None = None,
) -> dict:
    budget: Budget = window.budget
    return {
        "status": status,
        "tipped_by": Jsonb(tipped_by or {}),
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
    "tipped_by",
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
    one = "(" + ", ".join(["%s"] * (len(_COLUMNS) + 5)) + ", '[]'::jsonb, 0, 0)"
    sql = (
        f"INSERT INTO {AlertEvent._meta.db_table} ({', '.join(_COLUMNS)}, "
        "created_at, status, attempts, last_error, next_attempt_at, recipients, bucket, refusals) "
        f"VALUES {', '.join([one] * len(rows))} ON CONFLICT DO NOTHING RETURNING id"
    )
    params: list = []
    for row in rows:
        params += [row[c] for c in _COLUMNS] + [now, row.get("status", Delivery.PENDING), 0, "", now + CATCHUP_AFTER]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        created = [r[0] for r in cursor.fetchall()]
    # RETURNING does not promise VALUES order: read back which of ours are to be sent.
    sent = list(AlertEvent.objects.filter(id__in=created, status=Delivery.PENDING).values_list("id", flat=True))
    webhooks.create_deliveries(event_ids=sent)
    return sent


def _insert_refusal(window_id: int, *, bucket: int, count: int, tipped_by: dict) -> list[int]:
    """One statement: the hour's refusal event for the window, or `count` more on it. The
    window's budget must be blocking (an alert budget never refuses), and a run budget alerts
    only if its organization opted in. Returns the id only if this call created the event."""
    now = timezone.now()
    sql = f"""
        INSERT INTO {AlertEvent._meta.db_table} ({", ".join(_COLUMNS)},
               created_at, status, attempts, last_error, next_attempt_at, recipients, bucket, refusals)
        SELECT %s, b.organization_id, b.id, w.id, %s, 0, w.spent_nano, w.reserved_nano, b.amount_nano, '',
               %s, %s, 0, '', %s, '[]'::jsonb, %s, %s
          FROM {Window._meta.db_table} w JOIN {Budget._meta.db_table} b ON b.id = w.budget_id
         WHERE w.id = %s AND b.mode = %s
           AND (b.scope <> %s OR EXISTS (SELECT 1 FROM {AlertSettings._meta.db_table} s
                                          WHERE s.organization_id = b.organization_id AND s.alert_run_budgets))
        ON CONFLICT (window_id, kind, threshold, bucket)
        DO UPDATE SET refusals = {AlertEvent._meta.db_table}.refusals + EXCLUDED.refusals
        RETURNING id, (xmax = 0)
    """
    with connection.cursor() as cursor:
        params: list = [
            Jsonb(tipped_by),
            Kind.REFUSAL,
            now,
            Delivery.PENDING,
            now + CATCHUP_AFTER,
            bucket,
            count,
            window_id,
            Budget.Mode.BLOCK,
            Budget.Scope.RUN,
        ]
        cursor.execute(sql, params)
        created = [r[0] for r in cursor.fetchall() if r[1]]
    webhooks.create_deliveries(event_ids=created)
    return created


def _queue_email(event_id: int) -> None:
    """Queue the email task. If the broker is down the event stays `pending` and
    `send_pending_alerts` sends it once the broker is back: log, never raise."""
    from alerts.tasks import send_alert_email  # tasks import this module (through drain and audit)

    try:
        # Fail fast rather than hold the drain while Redis is unreachable: by default kombu
        # retries the connection for seconds (retry=False only stops the publish retries).
        # A fresh connection per email is cheap: events are a few per window per period.
        with send_alert_email.app.connection_for_write(transport_options={"max_retries": 0}) as conn:
            send_alert_email.apply_async((event_id,), retry=False, connection=conn)
    except Exception:
        log.warning(
            "alerts: could not queue the email of event %s (broker down?); the catch-up will send it",
            event_id,
            exc_info=True,
        )
