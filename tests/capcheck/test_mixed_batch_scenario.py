"""`manage.py capcheck --scenario mixed-model-batch`: 20 two-line batches (a line on the run's
model and one on a model at three times its price, one echo connection) submitted at once on a
$0.60 cap worth four of their worst cases. The admitted ones are recorded at echo's bill, line by
line, and the four properties hold, slices off and on. Priced at the first line's model, the books
find every batch recorded below what the provider billed."""

from __future__ import annotations

import pytest

from alerts.audit import audit_counters
from capcheck.jobs import MIXED_PRICE
from capcheck.plan import Plan, Tokens
from jobs import settle
from jobs.models import Job
from ledger.models import Reservation, UsageRecord

from .test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)
ARGS = ("--scenario", "mixed-model-batch", "--concurrency", "20", "--cap-usd", "0.60")


def test_mixed_model_batches_are_recorded_at_the_providers_bill(gateway, slices_setting):
    out, error = capcheck(gateway, *ARGS)
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    served = list(UsageRecord.objects.filter(status="served"))
    assert len(served) == 4 == Job.objects.filter(state="settled").count()
    billed = Tokens.for_plan(Plan(url=gateway.url)).actual_nano * (1 + MIXED_PRICE)
    assert all(r.job_id and r.cost_nano == billed and r.excess_nano == 0 for r in served)
    assert all(len(j.line_models) == 2 for j in Job.objects.all())
    assert not Reservation.objects.exists()
    report = audit_counters(record=False)
    assert report.drifts == [] and report.request_drifts == []


def test_priced_at_the_first_lines_model_the_books_fail(gateway, monkeypatch):
    monkeypatch.setattr(settle.GUARDS, "price_each_line", False)
    out, error = capcheck(gateway, *ARGS)
    assert error is not None
    assert "-> FAIL" in out and "the provider billed" in out
