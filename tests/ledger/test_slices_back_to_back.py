"""One process's calls of one subject, each sent as the previous one finished (its record, and the
carve out of its slice, committed): each is admitted while the true remaining (the cap less the
recorded spend; nothing of the subject is in flight) covers its worst case, with headroom slices
on and off, and when a finished call's record reached the database through the spool; and agents
calling so at once stop only at the cap. The drain never runs on its own here: only what admission
settles counts."""

from __future__ import annotations

import itertools

import pytest

from alerts.audit import audit_counters
from ledger import admission
from ledger.admission import matching_budgets
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.models import UsageRecord
from ledger.recording import Outcome, record_many
from ledger.slices import Book
from ledger.spool import append, replay
from tests.concurrency import race
from tests.conftest import usd, window_of

pytestmark = pytest.mark.django_db(transaction=True)

WORST = usd("0.01")
COST = usd("0.002")
_ids = itertools.count()


@pytest.fixture(params=[False, True], ids=["slices-off", "slices-on"])
def slices(request, settings, slices_on) -> bool:
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": request.param}
    return request.param


def _recorded() -> int:
    return sum(UsageRecord.objects.values_list("cost_nano", flat=True))


def _calls_until_refused(acme, *, limit: int, spooled_every: int = 0) -> list[tuple[bool, int]]:
    """(admitted, true remaining before it) of each call, back to back, until the first refusal.
    With `spooled_every`, every such call's record goes to the spool (the database was down as it
    finished) and is replayed before the next call."""
    owner = register().id
    book = Book()
    calls: list[tuple[bool, int]] = []
    for i in range(200):
        remaining = limit - _recorded()
        request = acme.request(
            f"b2b-{next(_ids)}", worst_nano=WORST, owner_id=owner, budgets=matching_budgets(acme.subject())
        )
        try:
            admitted = book.admit(request)
        except BudgetExceeded:
            calls.append((False, remaining))
            return calls
        calls.append((True, remaining))
        outcome = Outcome(status="served", cost_nano=COST)
        if spooled_every and i % spooled_every == 0:
            append(reservation=admitted.reservation, outcome=outcome)
            assert replay() == 1
        else:
            (result,) = record_many(items=[(admitted.reservation, outcome)])
            assert isinstance(result, UsageRecord)
        book.settled(admitted.reservation)  # the process learns its record is written
    raise AssertionError("never refused")


def _check(calls: list[tuple[bool, int]]) -> None:
    falsely = [(i, remaining) for i, (ok, remaining) in enumerate(calls) if not ok and remaining >= WORST]
    assert not falsely
    overdrawn = [(i, remaining) for i, (ok, remaining) in enumerate(calls) if ok and remaining < WORST]
    assert not overdrawn
    assert not calls[-1][0]


def test_back_to_back_calls_are_admitted_while_the_true_remaining_covers_them(acme, slices):
    budget = acme.budget(amount="0.1")
    calls = _calls_until_refused(acme, limit=usd("0.1"))
    _check(calls)
    assert len(calls) == (usd("0.1") - WORST) // COST + 2  # every call that fits, then the refusal
    w = window_of(budget)
    assert w.spent_nano + w.reserved_nano <= budget.amount_nano


def test_calls_whose_records_were_spooled_and_replayed_do_not_refuse_the_next(acme, slices, tmp_path, settings):
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": str(tmp_path)}
    budget = acme.budget(amount="0.1")
    calls = _calls_until_refused(acme, limit=usd("0.1"), spooled_every=3)
    _check(calls)
    w = window_of(budget)
    assert w.spent_nano + w.reserved_nano <= budget.amount_nano


AGENTS = 6


def _agents(acme, budget) -> int:
    """AGENTS threads (one process's book, each thread its own connection, released by a
    barrier), each sending its next call as its previous one finished, until refused: the cap
    holds, and when the last one stops the room left is less than one worst case per agent (a
    refusal counts only the calls in flight beside it). Returns the calls served."""
    owner = register().id
    book = Book()
    budgets = matching_budgets(acme.subject())

    def agent(i: int) -> int:
        served = 0
        for _ in range(200):
            request = acme.request(f"agent-{i}-{next(_ids)}", worst_nano=WORST, owner_id=owner, budgets=budgets)
            try:
                admitted = book.admit(request)
            except BudgetExceeded:
                return served
            (result,) = record_many(items=[(admitted.reservation, Outcome(status="served", cost_nano=COST))])
            assert isinstance(result, UsageRecord)
            book.settled(admitted.reservation)
            served += 1
        raise AssertionError("never refused")

    served = sum(race(AGENTS, agent))
    book.retire_all()
    book.give_back_pending()
    drain_all()
    return served


def test_agents_calling_back_to_back_at_once_stop_only_at_the_cap(acme, slices):
    # given: a $0.3 cap; calls holding $0.01 and costing $0.002
    budget = acme.budget(amount="0.3")
    # when
    served = _agents(acme, budget)
    # then
    w = window_of(budget)
    assert w.spent_nano == served * COST <= budget.amount_nano
    assert budget.amount_nano - w.spent_nano < AGENTS * WORST
    assert w.reserved_nano == 0
    assert audit_counters(record=False).ok


def test_without_settling_finished_calls_agents_stop_far_from_the_cap(acme, slices, monkeypatch):
    """Guard removal: refusals that count finished calls' holds stop the agents with room left."""
    monkeypatch.setattr(admission.GUARDS, "settle_finished", False)
    budget = acme.budget(amount="0.3")
    served = _agents(acme, budget)
    assert budget.amount_nano - served * COST >= AGENTS * WORST
