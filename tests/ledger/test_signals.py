"""The ledger calls nothing above it: it sends signals, and the apps above connect to them.

Each connection is a guard: without usage's receiver no threshold alert is raised, and without
the ledger's receiver a deleted project's name is lost from its usage records.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from alerts.models import AlertEvent
from ledger.drain import drain_all
from ledger.models import UsageRecord
from ledger.recording import Outcome, record
from ledger.signals import windows_changed
from tenants.audit import APPLY
from tenants.services import delete_project
from tenants.signals import subject_deleting
from tests.conftest import usd, window_of

NOV = datetime(2026, 11, 15, 12, tzinfo=UTC)


def spend(tenant, cost_nano: int) -> None:
    r = tenant.admit(worst_nano=cost_nano, now=NOV)
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=cost_nano))
    drain_all()


@pytest.mark.django_db
def test_the_drain_sends_windows_changed_after_commit_with_the_charged_windows(
    acme, django_capture_on_commit_callbacks
):
    # given: a receiver, and a $1 cap
    seen: list[list[int]] = []

    def receiver(sender, *, window_ids, **kwargs):
        seen.append(window_ids)

    windows_changed.connect(receiver)
    budget = acme.budget(amount="1")
    try:
        # when: a drain applies spend inside the test's transaction
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            spend(acme, usd("0.60"))
        # then: nothing is sent before commit; at commit, the charged window
        assert seen == []
        for callback in callbacks:
            callback()
        assert seen == [[window_of(budget).id]]
    finally:
        windows_changed.disconnect(receiver)


@pytest.mark.django_db
def test_usage_connects_the_threshold_check_to_windows_changed(acme, django_capture_on_commit_callbacks, monkeypatch):
    monkeypatch.setattr("alerts.alerts._queue_email", lambda event_id: None)  # no broker here
    budget = acme.budget(amount="1")
    with django_capture_on_commit_callbacks(execute=True):
        spend(acme, usd("0.60"))
    assert list(AlertEvent.objects.filter(window=window_of(budget)).values_list("threshold", flat=True)) == [50]


@pytest.mark.django_db
def test_without_usage_s_receiver_the_drain_raises_no_alert(acme, django_capture_on_commit_callbacks, monkeypatch):
    # given: the connection made in alerts/apps.py removed
    monkeypatch.setattr("alerts.alerts._queue_email", lambda event_id: None)
    assert windows_changed.disconnect(dispatch_uid="alerts.alerts.on_windows_changed")
    try:
        budget = acme.budget(amount="1")
        # when
        with django_capture_on_commit_callbacks(execute=True):
            spend(acme, usd("0.60"))
        # then: the threshold was crossed, and nobody heard
        assert window_of(budget).spent_nano == usd("0.60")
        assert not AlertEvent.objects.exists()
    finally:
        from alerts.apps import _check_thresholds

        windows_changed.connect(_check_thresholds, dispatch_uid="alerts.alerts.on_windows_changed")


def _deleted_project_subject(acme) -> tuple[int, dict]:
    pk = acme.project.pk
    spend(acme, usd("0.01"))
    delete_project(project=acme.project, actor=APPLY)
    return pk, UsageRecord.objects.get().subject


@pytest.mark.django_db
def test_a_deleted_project_s_name_is_frozen_on_its_usage_records_by_the_ledger(acme):
    pk, subject = _deleted_project_subject(acme)
    assert subject["project"] == {"id": pk, "name": "Main"}


@pytest.mark.django_db
def test_without_the_ledger_s_receiver_the_deleted_project_s_name_is_lost(acme):
    # given: the connection made in ledger/apps.py removed
    assert subject_deleting.disconnect(dispatch_uid="ledger.recording.freeze_subject_name")
    try:
        # then: only the id the record was written with is left
        pk, subject = _deleted_project_subject(acme)
        assert subject["project"] == {"id": pk}
    finally:
        from ledger.recording import freeze_subject_name

        subject_deleting.connect(freeze_subject_name, dispatch_uid="ledger.recording.freeze_subject_name")
