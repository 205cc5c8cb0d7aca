"""How long the audit's runs and the alert events are kept (core/retention.py does the deleting).

An audit run is kept AUDIT_RUN_RETENTION_DAYS, except the latest finished run and the latest
with a sample cursor: the next incremental audit starts from them (alerts/audit.py).

An alert event is kept ALERT_EVENT_RETENTION_DAYS, and always while its window is current (its
period not ended, or a lifetime window) or its delivery is still under way: the event's row is
what stops a threshold crossed again in the same window from being emailed twice."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from core.retention import delete_expired

_LATEST_AUDITS = """
    t.finished_at IS NULL
    OR t.id = (SELECT id FROM usage_auditrun WHERE finished_at IS NOT NULL ORDER BY started_at DESC LIMIT 1)
    OR t.id = (SELECT id FROM usage_auditrun WHERE finished_at IS NOT NULL AND sample_after_id IS NOT NULL
               ORDER BY started_at DESC LIMIT 1)
"""

_CURRENT_EVENTS = """
    t.status IN ('pending', 'sending')
    OR EXISTS (SELECT 1 FROM budgets_window w WHERE w.id = t.window_id AND w.retired_at IS NULL
               AND (w.period_end IS NULL OR w.period_end > %s))
"""


def prune_audit_runs() -> int:
    days = settings.CAPGATE["AUDIT_RUN_RETENTION_DAYS"]
    if not days:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    return delete_expired(table="usage_auditrun", age_column="started_at", cutoff=cutoff, keep=_LATEST_AUDITS)


def prune_alert_events() -> int:
    days = settings.CAPGATE["ALERT_EVENT_RETENTION_DAYS"]
    if not days:
        return 0
    now = timezone.now()
    return delete_expired(
        table="usage_alertevent",
        age_column="created_at",
        cutoff=now - timedelta(days=days),
        keep=_CURRENT_EVENTS,
        params=[now],
        dependents=[("usage_alertdelivery", "event_id")],
    )
