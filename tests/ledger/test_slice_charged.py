"""A slice charged whole by expiry while its process still uses it (its hard deadline passed):
the first record that finds it charged makes the process stop admitting from it at once. (A slice
of a process taken for dead keeps only its requests in flight: tests/ledger/test_slice_claims.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from alerts.audit import audit_counters
from ledger import recording, slices
from ledger.drain import drain_all
from ledger.instances import register
from ledger.models import UsageRecord
from ledger.recording import Outcome, expire, record_many
from ledger.slices import Book
from tests.conftest import usd, window_of
from tests.ledger.test_slices import WORST, _matching, _request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("slices_on")]


@pytest.fixture
def book(monkeypatch) -> Book:
    """This process's book, fresh (the recording hook reaches it as `slices.book`)."""
    fresh = Book()
    monkeypatch.setattr(slices, "book", fresh)
    return fresh


def _charged_under_a_live_process(acme, book: Book):
    budget = acme.budget(amount="10")
    owner = register().id
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))  # alone: the key's room is unknown
    taken = book.admit(_request(acme, owner, budgets))
    assert taken.reservation.slice_id is not None
    # when: beat finds the slice past its hard deadline and charges it whole
    expire(now=timezone.now() + settings.CAPGATE["MAX_REQUEST_LIFETIME"] + timedelta(seconds=1))
    drain_all()
    # and: the request from it finishes; its record finds the slice charged
    (result,) = record_many(items=[(taken.reservation, Outcome(status="served", cost_nano=usd("0.002")))])
    assert not isinstance(result, Exception)
    book.settled(taken.reservation)
    return budget, owner, budgets, taken


def test_a_slice_charged_by_expiry_admits_nothing_more(acme, book):
    budget, owner, budgets, taken = _charged_under_a_live_process(acme, book)
    # then: the next request is not admitted from the charged slice
    after = book.admit(_request(acme, owner, budgets))
    assert after.reservation.slice_id != taken.reservation.slice_id
    assert book.stats()["slices"] <= 1  # only a new slice, if any
    drain_all()
    assert audit_counters(record=False).ok
    assert window_of(budget).spent_nano <= budget.amount_nano


def test_removal_without_the_hook_the_process_admits_from_the_charged_slice(acme, book, monkeypatch):
    from ledger import slice_claims

    monkeypatch.setattr(recording, "settle_charged_slices", lambda **kw: None)
    # The claim's read of its slice (gone once its charge is drained) stops it too: off as well.
    monkeypatch.setattr(slice_claims.GUARDS, "read_fence", False)
    _, owner, budgets, taken = _charged_under_a_live_process(acme, book)
    after = book.admit(_request(acme, owner, budgets))
    assert after.reservation.slice_id == taken.reservation.slice_id  # admitted against room already charged


def _slice_estimate():
    return UsageRecord.objects.get(request_id__startswith="slice-")


def test_the_late_record_corrects_the_slice_estimate_to_its_true_cost_once(acme, book):
    # given: the slice charged whole (20 worst cases), one request from it in flight
    budget, owner, budgets, taken = _charged_under_a_live_process(acme, book)
    drain_all()
    # then: the estimate now holds that request's true cost only (the rest was never given out),
    # and the window its charge, beside the request admitted alone (charged at its worst case)
    assert _slice_estimate().cost_nano == usd("0.002")
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (WORST + usd("0.002"), 0)
    assert audit_counters(record=False).ok
    # when: the same request reports again (a replay): nothing changes
    record_many(items=[(taken.reservation, Outcome(status="served", cost_nano=usd("0.002")))])
    drain_all()
    assert window_of(budget).spent_nano == w.spent_nano
    assert _slice_estimate().cost_nano == usd("0.002")


def test_removal_without_the_correction_the_slice_stays_charged_whole(acme, book, monkeypatch):
    from ledger import charged_slices

    monkeypatch.setattr(charged_slices.GUARDS, "correct", False)
    budget, *_ = _charged_under_a_live_process(acme, book)
    drain_all()
    assert _slice_estimate().cost_nano == 20 * WORST
    assert window_of(budget).spent_nano == WORST + 20 * WORST
