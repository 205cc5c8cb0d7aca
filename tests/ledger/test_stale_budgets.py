"""An admission that read its budgets before a blocking budget was created reads them again
(ledger/admission.py GUARDS.check_stale_budgets): the new budget's window holds the request, so a
cap created while a request was being admitted carries it."""

from __future__ import annotations

import pytest

from ledger import admission
from ledger.admission import matching_budgets
from ledger.errors import BudgetExceeded
from ledger.models import Hold, Reservation
from tests.conftest import usd, window_of


def _admit_with_a_read_from_before_the_cap(acme):
    # given: the request's budgets read while the subject had none
    stale = matching_budgets(acme.subject())
    assert stale == []
    # and: a $0.10 blocking cap created before its admission statement runs
    budget = acme.budget(amount="0.10")
    # when: a $0.50 request is admitted with the read from before the cap
    return budget, acme.request(worst_nano=usd("0.50"), budgets=stale)


@pytest.mark.django_db
def test_a_read_from_before_a_new_cap_is_read_again_and_refused(acme):
    budget, request = _admit_with_a_read_from_before_the_cap(acme)
    with pytest.raises(BudgetExceeded) as refused:
        admission.admit(request=request)
    # then: the new cap refuses it, and nothing is reserved
    assert refused.value.code == "organization_budget"
    assert not Reservation.objects.exists()
    assert window_of(budget).reserved_nano == 0


@pytest.mark.django_db
def test_without_the_stale_check_the_new_cap_does_not_hold_the_request(acme, monkeypatch):
    monkeypatch.setattr(admission.GUARDS, "check_stale_budgets", False)
    budget, request = _admit_with_a_read_from_before_the_cap(acme)
    admission.admit(request=request)
    # then: $0.50 is reserved under a $0.10 cap and held on none of its windows
    reservation = Reservation.objects.get()
    assert reservation.amount_nano == usd("0.50")
    assert not Hold.objects.filter(reservation=reservation, window__budget=budget).exists()
