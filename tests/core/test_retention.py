"""History past its retention is deleted in short batches, and what the gateway, the audit and
alerting still need is kept: each conversation's latest stored response, the latest audit runs,
a current window's alert events (their rows stop a second email), a process that still owns a
reservation. Every table's retention runs hourly from beat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from alerts.alert_models import AlertChannel, AlertDelivery
from alerts.models import AlertEvent, AuditRun
from alerts.retention import prune_alert_events, prune_audit_runs
from core.retention import delete_expired
from gateway.models import StoredResponse
from gateway.retention import prune_stored_responses
from ledger.instances import prune_instances
from ledger.models import GatewayInstance, Reservation, Window
from tenants.audit import prune_audit_log
from tenants.models import AuditLogEntry
from tests.conftest import Tenant, open_window

pytestmark = pytest.mark.django_db


def days_ago(days: float):
    return timezone.now() - timedelta(days=days)


def backdate(model, pk, **fields) -> None:
    """auto_now_add ignores a value given at create; set the age afterwards."""
    model.objects.filter(pk=pk).update(**fields)


def stored(acme: Tenant, response_id: str, age: float, conversation: str | None = None) -> StoredResponse:
    row = StoredResponse.objects.create(
        organization=acme.org, response_id=response_id, conversation_id=conversation, context_tokens=10
    )
    backdate(StoredResponse, row.pk, created_at=days_ago(age))
    return row


def test_stored_responses_past_retention_go_but_each_conversations_latest_stays(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "STORED_RESPONSE_RETENTION_DAYS": 30}
    stored(acme, "resp_old", 31)
    stored(acme, "resp_new", 29)
    stored(acme, "resp_conv_1", 40, conversation="conv_a")
    stored(acme, "resp_conv_2", 35, conversation="conv_a")  # the conversation's latest: its next turn's bound
    assert prune_stored_responses() == 2
    assert set(StoredResponse.objects.values_list("response_id", flat=True)) == {"resp_new", "resp_conv_2"}


def test_zero_days_keeps_history_for_good(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "STORED_RESPONSE_RETENTION_DAYS": 0, "AUDIT_LOG_RETENTION_DAYS": 0}
    stored(acme, "resp_ancient", 5000)
    entry = AuditLogEntry.objects.create(organization=acme.org, actor="a", action="create", object_type="x")
    backdate(AuditLogEntry, entry.pk, created_at=days_ago(5000))
    assert prune_stored_responses() == 0 and prune_audit_log() == 0
    assert StoredResponse.objects.count() == 1 and AuditLogEntry.objects.filter(pk=entry.pk).exists()


def test_audit_log_retention_when_an_operator_sets_it(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "AUDIT_LOG_RETENTION_DAYS": 365}
    old = AuditLogEntry.objects.create(organization=acme.org, actor="a", action="create", object_type="x")
    new = AuditLogEntry.objects.create(organization=acme.org, actor="a", action="update", object_type="x")
    backdate(AuditLogEntry, old.pk, created_at=days_ago(366))
    assert prune_audit_log() == 1
    assert list(AuditLogEntry.objects.values_list("pk", flat=True)) == [new.pk]


def test_old_audit_runs_go_but_the_latest_finished_and_the_latest_cursor_stay(settings):
    settings.CAPGATE = {**settings.CAPGATE, "AUDIT_RUN_RETENTION_DAYS": 30}
    ancient = AuditRun.objects.create(started_at=days_ago(90), finished_at=days_ago(90))
    cursor = AuditRun.objects.create(started_at=days_ago(60), finished_at=days_ago(60), sample_after_id=7)
    latest = AuditRun.objects.create(started_at=days_ago(40), finished_at=days_ago(40))  # no cursor: full audit
    recent = AuditRun.objects.create(started_at=days_ago(1), finished_at=days_ago(1))
    # the newest finished run is `recent`; `cursor` is the newest with a sample cursor: both stay
    assert prune_audit_runs() == 2
    assert set(AuditRun.objects.values_list("pk", flat=True)) == {cursor.pk, recent.pk}
    assert not AuditRun.objects.filter(pk__in=[ancient.pk, latest.pk]).exists()


def event(acme: Tenant, window: Window, *, threshold: int, age: float, status: str = "sent") -> AlertEvent:
    row = AlertEvent.objects.create(
        organization=acme.org,
        budget=window.budget,
        window=window,
        kind="threshold",
        threshold=threshold,
        status=status,
        created_at=days_ago(age),
    )
    return row


def test_alert_events_of_ended_windows_go_with_their_deliveries(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "ALERT_EVENT_RETENTION_DAYS": 400}
    ended = open_window(acme.budget(amount="10", period="day"))
    Window.objects.filter(pk=ended.pk).update(period_start=days_ago(402), period_end=days_ago(401))
    current = open_window(acme.budget(amount="10", period="lifetime"))
    gone = event(acme, ended, threshold=50, age=401)
    channel = AlertChannel.objects.create(organization=acme.org, name="ops", kind="email", emails=["a@example.com"])
    AlertDelivery.objects.create(event=gone, channel=channel, organization=acme.org, status="sent")
    undelivered = event(acme, ended, threshold=80, age=401, status="pending")
    still_current = event(acme, current, threshold=50, age=500)  # its row stops a second 50% email
    young = event(acme, ended, threshold=100, age=10)
    assert prune_alert_events() == 1
    assert set(AlertEvent.objects.values_list("pk", flat=True)) == {undelivered.pk, still_current.pk, young.pk}
    assert not AlertDelivery.objects.exists()


def test_gateway_process_rows_go_unless_they_own_a_reservation(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "INSTANCE_RETENTION_DAYS": 7}
    dead = GatewayInstance.objects.create(name="dead", heartbeat_at=days_ago(8), stopped_at=days_ago(8))
    owner = GatewayInstance.objects.create(name="owner", heartbeat_at=days_ago(8))
    alive = GatewayInstance.objects.create(name="alive", heartbeat_at=timezone.now())
    now = timezone.now()
    Reservation.objects.create(
        request_id="r-owned", organization=acme.org, amount_nano=1, owner=owner,
        created_at=now, expires_at=now, deadline_at=now,
    )  # fmt: skip
    assert prune_instances() == 1
    assert set(GatewayInstance.objects.values_list("pk", flat=True)) == {owner.pk, alive.pk}
    assert not GatewayInstance.objects.filter(pk=dead.pk).exists()


def test_a_backlog_goes_in_short_statements_over_runs(acme: Tenant, settings):
    settings.CAPGATE = {**settings.CAPGATE, "STORED_RESPONSE_RETENTION_DAYS": 30}
    for i in range(5):
        stored(acme, f"resp_{i}", 40 + i)
    with CaptureQueriesContext(connection) as queries:
        first = delete_expired(
            table="gateway_storedresponse", age_column="created_at", cutoff=days_ago(30), batch=2, max_batches=2
        )
    assert first == 4 and sum("DELETE FROM gateway_storedresponse" in q["sql"] for q in queries.captured_queries) == 2
    # the oldest went first; the next run takes the rest
    assert list(StoredResponse.objects.values_list("response_id", flat=True)) == ["resp_0"]
    assert prune_stored_responses() == 1


def test_every_tables_retention_runs_hourly_from_beat():
    from config.celery import app

    tasks = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    for task in (
        "gateway.tasks.prune_gateway_history",
        "alerts.tasks.prune_alert_history",
        "ledger.tasks.prune_ledger_history",
        "tenants.tasks.prune_audit_history",
        "requestlog.tasks.purge_request_log",
    ):
        assert tasks[task] == 3600.0, task
