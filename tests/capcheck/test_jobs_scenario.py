"""`manage.py capcheck --scenario jobs`: 40 one-line batches submitted at once against a $0.30
cap worth 8 of their worst cases (and 25 of their bills) — each admitted at submission or refused
with 402, every admitted one held by its job and settled by the poll from echo's usage; the four
properties hold. Without the admission at submission they do not."""

from __future__ import annotations

import pytest

from alerts.audit import audit_counters
from jobs import service
from jobs.models import Job
from ledger.models import Reservation, UsageRecord

from .test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)


def test_jobs_scenario_holds_the_four_properties(gateway):
    out, error = capcheck(gateway, "--scenario", "jobs", "--concurrency", "40", "--cap-usd", "0.30")
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    served = UsageRecord.objects.filter(status="served")
    assert served.count() == 8 and served.count() == Job.objects.filter(state="settled").count()
    assert all(r.job_id for r in served)
    assert not Reservation.objects.exists()
    report = audit_counters(record=False)
    assert report.drifts == [] and report.request_drifts == []


def test_jobs_scenario_fails_without_admission_at_submission(gateway, monkeypatch):
    monkeypatch.setattr(service.GUARDS, "admit_at_submission", False)
    out, error = capcheck(gateway, "--scenario", "jobs", "--concurrency", "40", "--cap-usd", "0.30")
    assert error is not None
    assert "-> FAIL" in out and "P1" in out
