"""Celery tasks of tenants; the schedule and its reason are in config/celery.py."""

from __future__ import annotations

from core.celery import app
from tenants.audit import prune_audit_log


@app.task
def prune_audit_history() -> int:
    """Retention: audit log entries past AUDIT_LOG_RETENTION_DAYS (0, the default: kept for good)."""
    return prune_audit_log()
