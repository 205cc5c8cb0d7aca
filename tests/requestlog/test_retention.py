"""Retention: refusal rows older than REQUEST_LOG_RETENTION_DAYS go, in batches; newer rows and
usage records (the book of record) stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import UsageRecord
from requestlog.models import Refusal
from requestlog.services import purge_expired
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db


def make(acme: Tenant, request_id: str, days_ago: float) -> None:
    at = timezone.now() - timedelta(days=days_ago)
    Refusal.objects.create(
        request_id=request_id,
        organization=acme.org,
        status="refused",
        code="organization_budget",
        http_status=402,
        created_at=at,
    )
    UsageRecord.objects.create(
        request_id=f"u-{request_id}", organization=acme.org, status="served", admitted_at=at, applied=True
    )


def test_purge_deletes_only_expired_refusals_in_batches(acme: Tenant, settings):
    # given: 90 days' retention; five refusals past it, one just inside it
    settings.CAPGATE = {**settings.CAPGATE, "REQUEST_LOG_RETENTION_DAYS": 90}
    for i in range(5):
        make(acme, f"old-{i}", 90 + i + 0.01)
    make(acme, "recent", 89.9)
    # when: two rows per statement
    with CaptureQueriesContext(connection) as queries:
        deleted = purge_expired(batch=2)
    # then: 5 deleted in 3 statements (2, 2, 1); the recent refusal and every usage record stay
    assert deleted == 5
    assert sum("DELETE FROM requestlog_refusal" in q["sql"] for q in queries.captured_queries) == 3
    assert list(Refusal.objects.values_list("request_id", flat=True)) == ["recent"]
    assert UsageRecord.objects.count() == 6


def test_purge_stops_after_its_batch_budget_and_the_next_run_continues(acme: Tenant):
    for i in range(5):
        make(acme, f"old-{i}", 200)
    assert purge_expired(batch=2, max_batches=1) == 2
    assert purge_expired(batch=2, max_batches=10) == 3
    assert not Refusal.objects.exists()


def test_retention_runs_hourly_from_beat():
    from config.celery import app

    entry = app.conf.beat_schedule["purge-request-log"]
    assert entry["task"] == "requestlog.tasks.purge_request_log" and entry["schedule"] == 3600.0
