"""What the audit checks: finished runs' lifetime windows leave the live set after an idle time
(they stay in the database), and a drain's charge brings one back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.audit import audit_counters
from ledger.drain import drain
from ledger.models import Window
from ledger.recording import Outcome, record

pytestmark = pytest.mark.django_db(transaction=True)


def test_idle_lifetime_windows_leave_the_live_set_and_return_when_charged(acme, settings):
    settings.CAPGATE = {**settings.CAPGATE, "AUDIT_IDLE_LIFETIME": timedelta(hours=1)}
    # given: a finished run (lifetime budget, no holds) idle for two hours, and a live month cap
    run = acme.budget(amount="1", scope="run", period="lifetime", run_id="run-1")
    month = acme.budget(amount="1")
    admitted = acme.admit(worst_nano=10, subject=acme.subject(run_id="run-1"))
    record(reservation=admitted.reservation, outcome=Outcome(status="served", cost_nano=7))
    drain()
    Window.objects.filter(budget=run).update(touched_at=timezone.now() - timedelta(hours=2))
    # when / then: only the month window is checked; the run's stays in history
    checked = {c.budget_id for c in audit_counters(record=False).checks}
    assert checked == {month.id}
    assert Window.objects.filter(budget=run).exists()
    # a new charge to the run brings its window back into the live set
    again = acme.admit(worst_nano=10, subject=acme.subject(run_id="run-1"))
    record(reservation=again.reservation, outcome=Outcome(status="served", cost_nano=3))
    drain()
    report = audit_counters(record=False)
    assert {c.budget_id for c in report.checks} == {month.id, run.id} and report.ok
