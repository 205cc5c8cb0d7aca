"""A refusal counts recorded spend and the holds of calls still in flight, nothing else: an
admission about to refuse first applies the records of calls that finished (committed, not yet
drained) on its ceilings, and checks again. Real concurrency: threads with their own
connections, one barrier."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.db.models import Sum

from ledger import admission
from ledger import drain as drain_module
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded
from ledger.models import Hold, Reservation, UsageRecord
from ledger.recording import Outcome, record
from ledger.spool import append, replay
from tests.concurrency import race
from tests.conftest import usd, window_of

pytestmark = pytest.mark.django_db(transaction=True)

WORST = usd("0.037")
COST = usd("0.001")


def _try_admit(tenant, **kw):
    try:
        return tenant.admit(**kw)
    except BudgetExceeded as refusal:
        return refusal


def _finished_calls(acme, n: int) -> list[Reservation]:
    """n calls admitted at WORST and recorded at COST, their records not yet drained."""
    calls = [acme.admit(worst_nano=WORST).reservation for _ in range(n)]
    for r in calls:
        record(reservation=r, outcome=Outcome(status="served", cost_nano=COST))
    return calls


def test_a_finished_calls_hold_does_not_refuse_the_next_call(acme):
    # given: a cap with room for one worst case after the first call's cost, not beside its hold
    budget = acme.budget(amount="0.06")
    _finished_calls(acme, 1)
    assert window_of(budget).reserved_nano == WORST  # the record is not drained yet
    # when
    admitted = acme.admit(worst_nano=WORST)
    # then: admitted, the first call counted at its cost
    w = window_of(budget)
    assert admitted.reservation.amount_nano == WORST
    assert (w.spent_nano, w.reserved_nano) == (COST, WORST)
    assert UsageRecord.objects.get().applied


def test_a_refusal_after_settling_states_the_true_remaining(acme):
    budget = acme.budget(amount="0.0375")  # after the first call's cost, $0.0365 remains
    _finished_calls(acme, 1)
    with pytest.raises(BudgetExceeded) as refused:
        acme.admit(worst_nano=WORST)
    assert refused.value.remaining_nano == usd("0.0375") - COST
    assert window_of(budget).spent_nano == COST


def test_without_settling_finished_calls_their_holds_refuse(acme, monkeypatch):
    monkeypatch.setattr(admission.GUARDS, "settle_finished", False)
    acme.budget(amount="0.06")
    _finished_calls(acme, 1)
    with pytest.raises(BudgetExceeded) as refused:
        acme.admit(worst_nano=WORST)
    assert refused.value.remaining_nano == usd("0.06") - WORST  # the finished call's hold, counted


def test_a_record_replayed_from_the_spool_does_not_refuse_the_next_call(acme, tmp_path, settings):
    # given: a call whose record was spooled (database down at its end), then replayed
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": str(tmp_path)}
    budget = acme.budget(amount="0.06")
    r = acme.admit(worst_nano=WORST).reservation
    append(reservation=r, outcome=Outcome(status="served", cost_nano=COST))
    assert replay() == 1
    # when / then
    acme.admit(worst_nano=WORST)
    assert window_of(budget).spent_nano == COST


def _exact_fit_after_finished(acme, n: int = 60) -> tuple[list, object]:
    # given: a $1 cap, 27 calls admitted at $0.037 (all of it) and finished at $0.001 each,
    # undrained: once applied, room for exactly 26 more worst cases (1 - 0.027 = 0.973)
    budget = acme.budget(amount="1")
    _finished_calls(acme, 27)
    # when: n admissions race, and one thread drains as the gateway's own drain would
    results = race(n, lambda i: drain_all() if i == 0 else _try_admit(acme, worst_nano=WORST))
    return [r for r in results[1:] if not isinstance(r, BudgetExceeded)], budget


def test_racing_admissions_that_settle_finished_calls_admit_exactly_the_fit(acme):
    admitted, budget = _exact_fit_after_finished(acme)
    # then: exactly the fit, each finished record applied once, the counters match the rows
    assert len(admitted) == 26
    w = window_of(budget)
    assert w.spent_nano == 27 * COST
    assert w.reserved_nano == 26 * WORST == Hold.objects.filter(window=w).aggregate(s=Sum("amount_nano"))["s"]
    assert w.spent_nano + w.reserved_nano <= usd(1)
    assert not UsageRecord.objects.filter(applied=False).exists()


def test_without_settling_the_racers_are_refused_for_room_that_is_free(acme, monkeypatch):
    monkeypatch.setattr(admission.GUARDS, "settle_finished", False)
    monkeypatch.setattr(drain_module, "RACE_DELAY_SECONDS", 0.5)  # the drain thread lands last
    admitted, _ = _exact_fit_after_finished(acme, n=30)
    assert len(admitted) < 26


def _settle_beside_a_drain(acme) -> object:
    """Another drain has applied the finished call's record and not yet committed (it commits
    HOLD_SECONDS later) when an admission that needs that room arrives; returns what the
    admission got."""
    acme.budget(amount="0.06")
    _finished_calls(acme, 1)
    applied = threading.Event()

    def other_drain() -> None:
        try:
            with transaction.atomic():
                assert drain_all() == 1
                applied.set()
                time.sleep(HOLD_SECONDS)
        finally:
            connection.close()

    thread = threading.Thread(target=other_drain)
    thread.start()
    try:
        assert applied.wait(timeout=10)
        return _try_admit(acme, worst_nano=WORST)
    finally:
        thread.join()


HOLD_SECONDS = 0.5


def test_settling_waits_for_a_drain_applying_the_same_records(acme):
    assert not isinstance(_settle_beside_a_drain(acme), BudgetExceeded)


def test_settling_that_skips_another_drains_records_refuses(acme, monkeypatch):
    monkeypatch.setattr(admission.GUARDS, "wait_for_drains", False)
    assert isinstance(_settle_beside_a_drain(acme), BudgetExceeded)
