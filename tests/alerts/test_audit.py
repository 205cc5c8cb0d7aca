"""The counter audit: every live window's counters equal the rows behind them, under traffic;
a counter changed behind the rows' back is reported, stored, alerted, and fails `audit`."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone

from alerts import audit as audit_module
from alerts.audit import audit_counters
from alerts.models import AlertEvent, AuditRun
from alerts.tasks import send_alert_email
from core.env import BASE_DIR
from ledger.drain import drain, drain_all
from ledger.errors import BudgetExceeded
from ledger.models import Hold, Window
from ledger.recording import Outcome, expire, record, release
from tenants.models import Member
from tests.concurrency import race
from tests.conftest import usd, window_of
from tests.ledger.test_tasks import _database_url

WORST = usd("0.037")


@pytest.fixture(autouse=True)
def no_published_emails(monkeypatch):
    monkeypatch.setattr(send_alert_email, "apply_async", lambda args, **kw: None)


def busy_history(acme):
    """Every way money reaches a window: served, released, expired at worst case then
    corrected by a late report, overbilled; plus an undrained record and a live reservation;
    over stacked blocking and alert budgets of several periods."""
    key = acme.add_key("batch")
    budgets = [
        acme.budget(amount="10"),
        acme.budget(amount="50", mode="alert", period="day"),
        acme.budget(amount="2", scope="key", api_key=key, period="lifetime"),
        acme.budget(amount="5", scope="project", project=acme.project, period="week"),
    ]
    for i in range(6):
        r = acme.admit(worst_nano=WORST, key=key if i % 2 else None)
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.012") + i))
    drain_all()
    release(reservation=acme.admit(worst_nano=WORST).reservation)
    lapsed = acme.admit(worst_nano=WORST, lease=timedelta(microseconds=1), key=key).reservation
    expire()
    record(reservation=lapsed, outcome=Outcome(status="served", cost_nano=usd("0.010")))  # late report
    over = acme.admit(worst_nano=WORST).reservation
    record(reservation=over, outcome=Outcome(status="served", cost_nano=3 * WORST))
    drain_all()
    undrained = acme.admit(worst_nano=WORST).reservation
    record(reservation=undrained, outcome=Outcome(status="served", cost_nano=usd("0.02")))
    acme.admit(worst_nano=WORST, key=key)  # in flight
    return budgets


@pytest.mark.django_db
def test_a_clean_history_passes(acme):
    # given
    budgets = busy_history(acme)
    # when
    report = audit_counters()
    # then: every window is checked and agrees
    assert report.ok, report.drifts
    assert report.windows_checked == len(budgets)
    run = AuditRun.objects.get()
    assert (run.windows_checked, run.drift_count, run.ok) == (len(budgets), 0, True)
    assert not AlertEvent.objects.filter(kind="audit_drift").exists()
    # and the command prints one row per window and exits normally
    out = StringIO()
    call_command("audit", stdout=out)
    assert out.getvalue().count("  ok") == len(budgets)
    assert f"{len(budgets)} live windows checked, 0 drifting" in out.getvalue()


@pytest.mark.django_db
def test_a_counter_bumped_by_hand_is_drift_that_is_stored_alerted_and_fails_the_command(acme, caplog):
    # given: a clean history, then one nano-USD added to a counter behind the rows' back
    budget = busy_history(acme)[0]
    window = window_of(budget)
    Window.objects.filter(pk=window.pk).update(spent_nano=F("spent_nano") + 1)
    # when
    with caplog.at_level(logging.ERROR, logger="alerts.audit"):
        report = audit_counters()
    # then
    assert not report.ok
    [drift] = report.drifts
    assert (drift.window_id, drift.counter, drift.delta_nano) == (window.pk, "spent", 1)
    assert drift.actual_nano == window.spent_nano + 1
    assert f"window {window.pk}" in caplog.text and "drift +1 nano" in caplog.text
    run = AuditRun.objects.get()
    assert run.drift_count == 1 and run.drifts[0]["counter"] == "spent"
    event = AlertEvent.objects.get(kind="audit_drift")
    assert event.window_id == window.pk and "spent: counter" in event.detail
    # emailed like any alert (test settings: the locmem backend)
    owner = get_user_model().objects.create_user("olga", "olga@acme.example", "pw")
    Member.objects.create(organization=acme.org, user=owner, role=Member.Role.OWNER)
    assert send_alert_email(event.id) == "sent"
    assert mail.outbox[0].subject == "[capgate] Acme: counter drift on organization budget"
    assert "/o/acme/audit/" in mail.outbox[0].body and "spent: counter" in mail.outbox[0].body
    # and the command shows it and fails; the alert is not repeated
    out = StringIO()
    with pytest.raises(CommandError, match="counter drift in 1 of 4 live windows"):
        call_command("audit", "--drift-only", stdout=out)
    assert "DRIFT" in out.getvalue() and out.getvalue().count("  ok") == 0
    assert AlertEvent.objects.filter(kind="audit_drift").count() == 1
    assert AuditRun.objects.count() == 2


@pytest.mark.django_db
def test_a_hold_lost_behind_the_counters_back_is_reserved_drift(acme):
    budget = acme.budget(amount="1")
    acme.admit(worst_nano=WORST)
    Hold.objects.filter(window=window_of(budget)).delete()
    [drift] = audit_counters(record=False).drifts
    assert (drift.counter, drift.expected_nano, drift.actual_nano) == ("reserved", 0, WORST)
    assert not AuditRun.objects.exists()  # record=False: a dry look


@pytest.mark.django_db
def test_windows_whose_period_is_over_and_hold_nothing_are_not_live(acme):
    budget = acme.budget(amount="1", period="day")
    r = acme.admit(worst_nano=WORST, now=timezone.now() - timedelta(days=2))
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=1))
    drain_all()
    Window.objects.filter(budget=budget).update(spent_nano=F("spent_nano") + 1)
    report = audit_counters()
    assert report.ok and report.windows_checked == 0


@pytest.mark.django_db
def test_a_window_created_mid_period_starts_from_its_seed(acme):
    # given: spend recorded before the budget existed; its first window is seeded with it
    for _ in range(3):
        r = acme.admit(worst_nano=WORST)
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.01")))
    drain_all()
    acme.budget(amount="1")
    acme.admit(worst_nano=WORST)
    # then: the seed is not drift
    assert audit_counters().ok


# --- under traffic ---------------------------------------------------------------------------


def _traffic_with_audits(acme, rounds: int = 8, clients: int = 12):
    """`clients` threads admit, record and drain (some refused, some released) while one
    thread audits again and again. Returns every audit report."""
    acme.budget(amount="1")
    acme.budget(amount="3", mode="alert", period="day")
    done = threading.Event()
    finished = []
    reports = []

    def client(i):
        if i == 0:
            while not done.is_set():
                reports.append(audit_counters(record=False))
            return
        for n in range(rounds):
            try:
                r = acme.admit(worst_nano=WORST)
            except BudgetExceeded:
                continue
            if n % 4 == 0:
                release(reservation=r.reservation)
            else:
                record(
                    reservation=r.reservation,
                    outcome=Outcome(status="served", cost_nano=usd("0.002")),
                )
                drain(limit=10)
        finished.append(i)
        if len(finished) == clients:
            done.set()

    race(clients + 1, client)
    drain_all()
    reports.append(audit_counters(record=False))
    return reports


@pytest.mark.django_db(transaction=True)
def test_audits_during_traffic_never_see_drift(acme):
    reports = _traffic_with_audits(acme)
    assert len(reports) > 3
    assert all(r.ok for r in reports), [r.drifts for r in reports if not r.ok][:3]


@pytest.mark.django_db(transaction=True)
def test_without_the_snapshot_audits_during_traffic_see_drift_that_is_not_there(acme, monkeypatch):
    # given: the guard removed — each read sees whatever committed by then — and the gap
    # between reading the counters and summing the rows widened
    monkeypatch.setattr(audit_module, "_snapshot", lambda: None)
    real_sum = audit_module._applied_spend

    def slow_sum(ids):
        time.sleep(0.05)
        return real_sum(ids)

    monkeypatch.setattr(audit_module, "_applied_spend", slow_sum)
    # when
    reports = _traffic_with_audits(acme)
    # then: some audit mistook traffic for drift; the final one (quiet) is clean
    assert any(not r.ok for r in reports[:-1])
    assert reports[-1].ok


# --- the command as a process ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_manage_py_audit_exits_1_on_drift(acme):
    budget = acme.budget(amount="1")
    acme.admit(worst_nano=WORST)
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "CELERY_BROKER_URL": "memory://",
    }  # its drift alert is queued nowhere shared

    def audit():
        return subprocess.run(
            [sys.executable, "manage.py", "audit"],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    clean = audit()
    assert clean.returncode == 0, clean.stderr
    Window.objects.filter(budget=budget).update(reserved_nano=F("reserved_nano") + 5)
    drifted = audit()
    assert drifted.returncode == 1
    assert "DRIFT" in drifted.stdout and "counter drift in 1 of 1 live windows" in drifted.stderr
