"""A narrower budget created while other processes hold slices: the new window carries each live
slice's whole row, unused part included. The owners are told at the budget's commit and give
their unused parts back at once, and a refusal those parts would have covered waits for them
(bounded) instead of answering 402 for room the ceiling has. Each guard is shown necessary by
removing it."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from django.db import connection

from alerts.audit import audit_counters
from budgets.services import create_budget
from gateway.upstream import runtime
from ledger import carving, slices
from ledger.admission import matching_budgets
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.models import Reservation, Window
from ledger.recording import Outcome, record_many
from ledger.slices import Book
from tenants.audit import Actor
from tests.conftest import usd

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("slices_on")]

WORST = usd("0.01")
ADMIN = Actor(label="test", operator=True)


class Listener(threading.Thread):
    """Another gateway process's LISTEN loop (gateway/upstream/runtime.py), `delay` slower than usual:
    on each notification its book retires what it names and gives the unused parts back."""

    def __init__(self, book: Book, delay: float) -> None:
        super().__init__(daemon=True)
        self.book, self.delay = book, delay
        self.ready, self.stop = threading.Event(), threading.Event()
        self.heard: list[str] = []

    def run(self) -> None:
        try:
            # The gateway's own choice of LISTEN connection (direct behind a transaction pooler).
            with psycopg.connect(runtime.conninfo(), autocommit=True) as conn:
                conn.execute(f"LISTEN {carving.NOTIFY_CHANNEL}")
                self.ready.set()
                while not self.stop.is_set():
                    for note in conn.notifies(timeout=0.05):
                        self.heard.append(note.payload)
                        time.sleep(self.delay)
                        if self.book.on_notification(note.payload):
                            self.book.give_back_pending()
        finally:
            connection.close()


def _request(tenant, owner: int, key=None):
    from tests.conftest import _ids  # noqa: PLC0415  (the cast's request ids)

    return tenant.request(
        f"recall-{next(_ids)}", worst_nano=WORST, owner_id=owner, key=key, budgets=matching_budgets(tenant.subject(key))
    )


def _other_process_holds_a_slice(tenant):
    """Process A: a $1 organization cap, a slice of 20 worst cases taken, one request in flight
    from it (and its first request, admitted alone, in flight too)."""
    tenant.budget(amount="1")
    book_a, owner_a = Book(), register().id
    alone = book_a.admit(_request(tenant, owner_a))
    from_slice = book_a.admit(_request(tenant, owner_a))
    assert from_slice.reservation.slice_id is not None
    return book_a, owner_a, [alone, from_slice]


def _narrower_budget(tenant):
    return create_budget(
        organization=tenant.org,
        actor=ADMIN,
        scope="key",
        api_key=tenant.key,
        amount_nano=usd("0.10"),
        period="month",
        mode="block",
        thresholds=[],
    )


def _finish(book_a, in_flight, extra=()):
    items = [(a.reservation, Outcome(status="served", cost_nano=WORST)) for a in [*in_flight, *extra]]
    assert not [r for r in record_many(items=items) if isinstance(r, Exception)]
    for a in in_flight:
        book_a.settled(a.reservation)
    book_a.retire_all()
    book_a.give_back_pending()
    drain_all()


def _run(tenant, *, delay: float):
    # given: process A holds a slice on the organization's window, and listens (slowly)
    book_a, _owner_a, in_flight = _other_process_holds_a_slice(tenant)
    listener = Listener(book_a, delay=delay)
    listener.start()
    assert listener.ready.wait(5)
    # when: a $0.10 key budget is created (its window will carry A's $0.20 slice row) and
    # process B admits a request under it at once
    budget = _narrower_budget(tenant)
    book_b, owner_b = Book(), register().id
    started = time.monotonic()
    try:
        admitted = book_b.admit(_request(tenant, owner_b))
        outcome: object = admitted
    except BudgetExceeded as exc:
        outcome = exc
    waited = time.monotonic() - started
    listener.stop.set()
    listener.join(5)
    return book_a, in_flight, budget, outcome, waited, listener


def test_a_request_under_a_new_narrower_budget_waits_for_the_slices_it_carried_and_is_admitted(acme, monkeypatch):
    # a bound this busy machine always meets: the rule is the wait, not its length
    monkeypatch.setattr(slices, "RECALL_WAIT_SECONDS", 5.0)
    book_a, in_flight, budget, outcome, waited, listener = _run(acme, delay=0.2)
    # then: A was told of the change, gave its unused part back, and B was admitted after it
    assert {"org": acme.org.id, "column": "api_key_id", "value": acme.key.id} in [json.loads(p) for p in listener.heard]
    assert not isinstance(outcome, BudgetExceeded), outcome
    assert waited < slices.RECALL_WAIT_SECONDS + 0.5
    window = Window.objects.get(budget=budget)
    assert window.reserved_nano == 3 * WORST  # A's two in flight and B's: nothing idle
    _finish(book_a, in_flight, extra=[outcome])
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


def test_without_waiting_for_the_recall_the_same_request_is_refused_with_room_left(acme, monkeypatch):
    monkeypatch.setattr(slices.GUARDS, "wait_for_recall", False)
    book_a, in_flight, budget, outcome, _waited, _listener = _run(acme, delay=2.0)
    # then: refused, though the key's requests hold only $0.02 of its $0.10
    assert isinstance(outcome, BudgetExceeded)
    assert outcome.code == "key_budget"
    _finish(book_a, in_flight)
    assert not Reservation.objects.exists()


def test_without_the_budget_change_notice_the_carried_slice_is_never_recalled(acme, monkeypatch):
    # the slice's window ids do not include the new window, so a refusal there does not recall it
    import budgets.services

    monkeypatch.setattr(budgets.services, "notify_budgets_changed", lambda **_: None)
    book_a, in_flight, budget, outcome, waited, _listener = _run(acme, delay=0.0)
    assert isinstance(outcome, BudgetExceeded)
    assert waited >= slices.RECALL_WAIT_SECONDS  # it waited, and nothing came back
    _finish(book_a, in_flight)
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("one_snapshot", [True, False], ids=["room-with-holds", "removed"])
def test_a_give_back_between_the_refusal_and_the_wait_check_still_admits(acme, monkeypatch, one_snapshot):
    """A's listener gives its part back in the instant between B's refusal and B's check of
    whether waiting is worth it. The room moved from the slices' holds into the window: read
    together it is still there; the refusal's older room plus the holds read afterwards miss it."""
    monkeypatch.setattr(slices.GUARDS, "read_room_with_holds", one_snapshot)
    monkeypatch.setattr(slices, "RECALL_WAIT_SECONDS", 5.0)
    book_a, _owner_a, in_flight = _other_process_holds_a_slice(acme)
    _narrower_budget(acme)
    book_b, owner_b = Book(), register().id
    note = json.dumps({"org": acme.org.id, "column": "api_key_id", "value": acme.key.id})
    own_give_back = book_b.give_back_pending

    def give_back_pending():  # B's wait check starts here; A's listener lands just before it
        if book_a.on_notification(note):
            book_a.give_back_pending()
        return own_give_back()

    monkeypatch.setattr(book_b, "give_back_pending", give_back_pending)
    try:
        outcome: object = book_b.admit(_request(acme, owner_b))
    except BudgetExceeded as exc:
        outcome = exc
    if one_snapshot:
        assert not isinstance(outcome, BudgetExceeded), outcome
        _finish(book_a, in_flight, extra=[outcome])
        assert audit_counters(record=False).ok
    else:
        # refused, though A's part is back and the key's requests hold $0.02 of its $0.10
        assert isinstance(outcome, BudgetExceeded)
        assert outcome.code == "key_budget"
        _finish(book_a, in_flight)
    assert not Reservation.objects.exists()


def test_a_refusal_for_room_requests_really_hold_does_not_wait(acme):
    # given: a $0.03 cap with three requests in flight, admitted alone (no slice holds anything)
    acme.budget(amount="0.03")
    book = Book()
    owner = register().id
    in_flight = [slices.admit(request=_request(acme, owner)) for _ in range(3)]
    # when
    started = time.monotonic()
    with pytest.raises(BudgetExceeded):
        book.admit(_request(acme, owner))
    # then: refused at once
    assert time.monotonic() - started < 0.5
    _finish(book, in_flight)


def test_a_budget_change_retires_only_the_slices_of_its_subject(acme):
    # given: slices of two keys of one organization
    from ledger.carving import parse_notification

    other = acme.add_key("other")
    acme.budget(amount="10")
    book, owner = Book(), register().id
    for key in (acme.key, other):
        book.admit(_request(acme, owner, key=key))
        assert book.admit(_request(acme, owner, key=key)).reservation.slice_id is not None
    # when: a budget of the first key changes
    budget = _narrower_budget(acme)
    [changed] = parse_notification(
        json.dumps({"org": acme.org.id, "column": "api_key_id", "value": budget.api_key_id})
    )[1]
    # then: only that key's slice is retired
    assert book.recall_subject(changed) == 1
    assert book.stats()["admitting"] == 1
    assert book.on_notification(json.dumps({"org": acme.org.id, "column": None, "value": None})) == 1
    assert parse_notification("not json {") == ([], [])
    assert parse_notification('{"org": "x"}') == ([], [])
    book.retire_all()
    book.give_back_pending()
