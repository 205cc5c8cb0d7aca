"""Celery tasks of the gateway; the schedule and its reason are in config/celery.py."""

from __future__ import annotations

from core.celery import app
from gateway.retention import prune_stored_responses


@app.task
def prune_gateway_history() -> int:
    """Retention: stored responses past STORED_RESPONSE_RETENTION_DAYS (each conversation's latest stays)."""
    return prune_stored_responses()
