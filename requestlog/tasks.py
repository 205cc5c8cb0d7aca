"""Celery tasks of the request log; the schedule and its reason are in config/celery.py."""

from __future__ import annotations

from core.celery import app
from requestlog.services import purge_expired


@app.task
def purge_request_log() -> int:
    """Retention: delete refusal rows past REQUEST_LOG_RETENTION_DAYS, in batches."""
    return purge_expired()
