"""The scheduled audit is incremental and runs one at a time: it checks the windows changed since
its previous run plus a rolling sample of the rest (so drift anywhere is found within one cycle of
samples), reads each window's own records through its scope's index, and a second run while one
holds the lease does nothing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from alerts import audit as audit_module
from alerts.audit import audit_counters, scheduled_audit
from alerts.models import AuditRun
from ledger.drain import drain_all
from ledger.models import Window
from ledger.recording import Outcome, record
from tenants.models import EndCustomer, Member
from tests.conftest import open_window, usd, window_of

WORST = usd("0.01")
COST = usd("0.004")


@pytest.fixture
def quiet(settings):
    """No overlap and a sample of two: 'changed since the last run' means changed."""
    settings.CAPGATE = {**settings.CAPGATE, "AUDIT_OVERLAP": timedelta(0), "AUDIT_SAMPLE": 2}


def _charge(acme, subject=None, cost=COST):
    admitted = acme.admit(worst_nano=WORST, subject=subject or acme.subject())
    record(reservation=admitted.reservation, outcome=Outcome(status="served", cost_nano=cost))
    drain_all()


def _key_budgets(acme, n: int):
    """n keys, each with its own cap and window, quiet for a minute."""
    keys = [acme.add_key(f"k{i}") for i in range(n)]
    budgets = [acme.budget(amount="5", scope="key", api_key=k) for k in keys]
    for b in budgets:
        open_window(b)
    Window.objects.update(touched_at=timezone.now() - timedelta(minutes=1))
    return keys, budgets


# Transactional: a window's touched_at is the drain transaction's now(), which one outer test
# transaction would freeze at the test's start.
@pytest.mark.django_db(transaction=True)
def test_an_incremental_run_checks_what_changed_and_a_sample(acme, quiet):
    # given: six quiet windows and a full run behind them; then the last key is charged
    keys, budgets = _key_budgets(acme, 6)
    assert audit_counters().windows_checked == 6
    _charge(acme, subject=acme.subject(keys[5]))
    # when: three incremental runs follow
    runs = [{c.budget_id for c in audit_counters(incremental=True).checks} for _ in range(3)]
    # then: the first checks the charged window and the first sample of two, the next ones the
    # following samples (the charge is behind them), and together they cover every window
    ids = [b.id for b in budgets]
    assert runs == [{ids[5], ids[0], ids[1]}, {ids[2], ids[3]}, {ids[4], ids[5]}]
    assert AuditRun.objects.filter(incremental=True).count() == 3


@pytest.mark.django_db(transaction=True)
def test_drift_in_an_untouched_window_is_found_within_one_cycle(acme, quiet):
    # given: six quiet windows after a full run, then one counter changed behind the rows' back
    keys, budgets = _key_budgets(acme, 6)
    audit_counters()
    Window.objects.filter(budget=budgets[4]).update(spent_nano=usd("1"))
    # when: as many incremental runs as a cycle of samples takes
    reports = [audit_counters(incremental=True) for _ in range(3)]
    # then: the third finds it, and only the window that drifts
    assert [r.ok for r in reports] == [True, True, False]
    assert {d.window_id for d in reports[2].drifts} == {window_of(budgets[4]).id}


@pytest.mark.django_db
def test_every_scope_reads_its_own_records(acme, alice):
    # given: one window of each scope, each charged through its own subject
    member = Member.objects.create(organization=acme.org, user=alice, role="member")
    customer = EndCustomer.objects.create(project=acme.project, external_id="c1")
    subject = acme.subject(member_id=member.id, end_customer_id=customer.id, run_id="run-1")
    budgets = [
        acme.budget(amount="5"),
        acme.budget(amount="5", scope="project", project=acme.project),
        acme.budget(amount="5", scope="member", member=member),
        acme.budget(amount="5", scope="key", api_key=acme.key, period="lifetime"),
        acme.budget(amount="5", scope="end_customer", end_customer=customer, period="day"),
        acme.budget(amount="5", scope="run", run_id="run-1", period="lifetime"),
    ]
    for cost in (usd("0.001"), usd("0.002")):
        _charge(acme, subject=subject, cost=cost)
    _charge(acme)  # another subject's record, charged to the organization's and project's windows only
    # when / then: every window agrees with its own records
    report = audit_counters(record=False)
    assert report.ok, report.drifts
    assert {c.budget_id for c in report.checks} == {b.id for b in budgets}
    # and a counter off by one nano in any scope is found
    for b in budgets:
        Window.objects.filter(budget=b).update(spent_nano=window_of(b).spent_nano + 1)
    assert {d.budget_id for d in audit_counters(record=False).drifts} == {b.id for b in budgets}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("guard", [True, False], ids=["lease", "without-lease"])
def test_two_scheduled_audits_never_run_at_once(acme, monkeypatch, guard):
    monkeypatch.setattr(audit_module.GUARDS, "one_at_a_time", guard)
    acme.budget(amount="5")
    _charge(acme)
    # given: one scheduled audit running on its own thread and connection, held inside its check
    inside, release, entered, first = threading.Event(), threading.Event(), [], {}
    real = audit_module.audit_counters

    def held(**kw):
        entered.append(threading.get_ident())
        if len(entered) == 1:
            inside.set()
            release.wait(30)
        return real(**kw)

    def run_first():
        try:
            first["report"] = scheduled_audit()
        finally:
            connection.close()

    monkeypatch.setattr(audit_module, "audit_counters", held)
    thread = threading.Thread(target=run_first)
    thread.start()
    assert inside.wait(10)
    # when: the next tick starts another while the first is inside
    second = scheduled_audit()
    release.set()
    thread.join(30)
    # then: with the lease the second does nothing and the first finishes; without it both run
    assert first["report"] is not None and first["report"].ok
    if guard:
        assert second is None and len(entered) == 1
        assert not AuditRun.objects.filter(running=True).exists()
        assert scheduled_audit() is not None  # the lease is free again
    else:
        assert second is not None and len(entered) == 2


@pytest.mark.django_db
def test_a_lease_left_by_a_dead_worker_is_closed(acme):
    # given: a running audit row from a worker killed two hours ago
    stale = AuditRun.objects.create(started_at=timezone.now() - timedelta(hours=2), running=True)
    acme.budget(amount="5")
    # when
    report = scheduled_audit()
    # then: this run went ahead and the dead one is closed
    stale.refresh_from_db()
    assert report is not None and report.ok
    assert stale.running is None and stale.finished_at is not None
