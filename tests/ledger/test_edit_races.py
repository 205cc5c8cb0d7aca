"""Budget edits racing admissions: a request with room is admitted whatever edits race it. An
admission that read a budget an edit has since changed reads it again, for as long as the edits
keep changing it (bounded), instead of answering 503 after a fixed number of tries. The bound is
shown necessary by removing it."""

from __future__ import annotations

import threading

import pytest

from alerts.audit import audit_counters
from budgets.services import update_budget
from ledger import admission
from ledger.admission import admit
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded, BudgetUnavailable
from ledger.models import Budget
from ledger.recording import Outcome, record
from tenants.audit import Actor
from tests.concurrency import race
from tests.conftest import usd

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = Actor(label="test", operator=True)
ZONES = ["Pacific/Kiritimati", "UTC"]


def _edits_during_admissions(tenant, *, edits: int, admitters: int, each: int) -> tuple[int, int, int]:
    """One thread edits the cap's timezone back and forth (each edit a new version: its windows
    are retired and a new one carries the requests in flight); the others admit and settle."""
    cap = tenant.budget(amount="1000")
    stop = threading.Event()

    def work(i: int) -> tuple[int, int, int]:
        if i == 0:
            for n in range(edits):
                update_budget(budget=Budget.objects.get(pk=cap.pk), actor=ADMIN, timezone=ZONES[n % 2])
            stop.set()
            return 0, 0, 0
        admitted = unavailable = refused = 0
        for _ in range(each):
            try:
                a = admit(request=tenant.request(worst_nano=usd("0.01")))
            except BudgetUnavailable:
                unavailable += 1
                continue
            except BudgetExceeded:
                refused += 1
                continue
            record(reservation=a.reservation, outcome=Outcome(status="served", cost_nano=usd("0.01")))
            admitted += 1
        return admitted, unavailable, refused

    results = race(admitters + 1, work)
    drain_all()
    return tuple(sum(r[k] for r in results) for k in range(3))  # type: ignore[return-value]


def test_admissions_racing_a_burst_of_edits_are_all_admitted(acme):
    admitted, unavailable, refused = _edits_during_admissions(acme, edits=40, admitters=8, each=25)
    assert (admitted, unavailable, refused) == (200, 0, 0)
    assert audit_counters(record=False).ok


def test_without_the_retry_bound_the_same_race_answers_503(acme, monkeypatch):
    # two immediate attempts and no more, as if the edits could not be waited out
    monkeypatch.setattr(admission, "ADMIT_RETRY_SECONDS", 0.0)
    _admitted, unavailable, refused = _edits_during_admissions(acme, edits=40, admitters=8, each=25)
    assert unavailable > 0
    assert refused == 0
