"""Headroom slices (ledger/slices.py): a process admits from a slice in memory, carves each request
out of it when recording, gives back what it did not use — and the cap holds throughout, under
real concurrency, with each of the slice's guards shown necessary by removing it."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.db.models import Sum

from alerts.audit import audit_counters
from ledger import slices
from ledger.admission import AdmissionRequest
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.models import Hold, Reservation, SliceClaim, UsageRecord, Window
from ledger.recording import Outcome, expire, record_many
from ledger.slices import Book
from tests.concurrency import race
from tests.conftest import usd, window_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("slices_on")]

WORST = usd("0.01")
_ids = itertools.count()


def _request(tenant, owner_id: int, budgets, worst: int = WORST) -> AdmissionRequest:
    return tenant.request(f"req-{next(_ids)}", worst_nano=worst, owner_id=owner_id, budgets=budgets)


def _matching(tenant):
    from ledger.admission import matching_budgets

    return matching_budgets(tenant.subject())


def _settle(book: Book, admitted, cost: int, *, strict: bool = True) -> None:
    results = record_many(items=[(a.reservation, Outcome(status="served", cost_nano=cost)) for a in admitted])
    if strict:
        assert not [r for r in results if isinstance(r, Exception)]
    for a in admitted:
        book.settled(a.reservation)


def _slice_rows():
    return Reservation.objects.filter(origin=Reservation.Origin.SLICE)


def test_second_request_takes_a_slice_and_later_ones_cost_the_window_nothing(acme):
    # given: a $10 cap, one process
    budget = acme.budget(amount="10")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    # when: the first request is admitted alone (the key's room is unknown) ...
    first = book.admit(_request(acme, owner, budgets))
    assert first.reservation.slice_id is None
    assert window_of(budget).reserved_nano == WORST
    # ... the second takes a slice: min(half the room, 20 worst cases) = 20 worst cases
    second = book.admit(_request(acme, owner, budgets))
    assert second.reservation.slice_id is not None
    (slice_row,) = _slice_rows()
    assert slice_row.amount_nano == 20 * WORST
    assert window_of(budget).reserved_nano == 21 * WORST
    # ... and the next 19 come from it without touching the window
    more = [book.admit(_request(acme, owner, budgets)) for _ in range(19)]
    assert {a.reservation.slice_id for a in more} == {second.reservation.slice_id}
    assert window_of(budget).reserved_nano == 21 * WORST
    # then: recording carves each out of the slice; the drain settles them like any request
    _settle(book, [second, *more], cost=usd("0.004"))
    assert not _slice_rows().exists()  # its last nano-dollar carved: the slice is gone
    assert Reservation.objects.filter(origin=Reservation.Origin.GATEWAY).count() == 21  # first + 20 carved
    drain_all()
    w = window_of(budget)
    assert w.spent_nano == 20 * usd("0.004")
    assert w.reserved_nano == WORST  # the first request, still in flight
    assert audit_counters(record=False).ok


def test_unused_part_goes_back_and_the_slice_closes_when_nothing_is_in_flight(acme):
    budget = acme.budget(amount="10")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))  # alone
    taken = [book.admit(_request(acme, owner, budgets)) for _ in range(3)]  # a slice of 20, 3 used
    assert window_of(budget).reserved_nano == 21 * WORST
    # when: the slice retires with 3 requests in flight
    book.retire_all()
    assert book.give_back_pending() == 1
    # then: its 17 unused worst cases are back; the 3 in flight stay held
    assert window_of(budget).reserved_nano == 4 * WORST
    assert _slice_rows().get().amount_nano == 3 * WORST
    assert (
        Hold.objects.filter(reservation__origin=Reservation.Origin.SLICE).aggregate(s=Sum("amount_nano"))["s"]
        == 3 * WORST
    )
    # when: they finish, the last carve takes the slice to zero and deletes it
    _settle(book, taken, cost=0)
    assert not _slice_rows().exists()
    book.give_back_pending()  # the close finds nothing left to do
    drain_all()
    assert window_of(budget).reserved_nano == WORST
    assert audit_counters(record=False).ok


def test_a_subject_without_blocking_budgets_is_sliced_at_once_and_alert_windows_are_charged(acme):
    alert = acme.budget(amount="1", mode="alert")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    admitted = [book.admit(_request(acme, owner, budgets)) for _ in range(5)]
    assert all(a.reservation.slice_id is not None for a in admitted)
    assert _slice_rows().count() == 1
    _settle(book, admitted, cost=usd("0.003"))
    drain_all()
    assert window_of(alert).spent_nano == 5 * usd("0.003")
    book.retire_all()
    book.give_back_pending()
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


def test_a_budget_edit_moves_the_next_request_to_a_new_slice(acme):
    # an amount edit keeps the budget's version: the slice key holds the amount too
    budget = acme.budget(amount="10")
    owner = register().id
    book = Book()
    book.admit(_request(acme, owner, _matching(acme)))
    old = book.admit(_request(acme, owner, _matching(acme)))
    # when: the budget is lowered (a new version)
    from budgets.services import update_budget
    from tenants.audit import Actor

    update_budget(budget=budget, actor=Actor(label="test", operator=True), amount_nano=usd("5"))
    after = book.admit(_request(acme, owner, _matching(acme)))
    # then: the old slice is not used for the new version
    assert after.reservation.slice_id != old.reservation.slice_id


def _exhaust(tenant, budget, books, owners, n_threads: int, per_thread: int, strict: bool = True):
    """n_threads threads, spread over the books (processes), each admitting up to per_thread
    requests of WORST as fast as it can; every admission is settled at its worst case."""
    budgets = _matching(tenant)

    def work(i: int) -> int:
        book, owner = books[i % len(books)], owners[i % len(books)]
        count = 0
        for _ in range(per_thread):
            try:
                a = book.admit(_request(tenant, owner, budgets))
            except BudgetExceeded:
                continue
            count += 1
            _settle(book, [a], cost=WORST, strict=strict)
        return count

    admitted = sum(race(n_threads, work))
    for book in books:
        book.retire_all()
        book.give_back_pending()
    drain_all()
    return admitted


def test_concurrent_processes_never_admit_past_the_cap(acme):
    # given: a cap worth exactly 100 worst cases, 3 processes, 12 threads asking for 240
    budget = acme.budget(amount="1")
    owners = [register().id for _ in range(3)]
    books = [Book() for _ in owners]
    for book in books:
        book.processes = 3
    # when
    admitted = _exhaust(acme, budget, books, owners, n_threads=12, per_thread=20)
    # then: never more than the cap; slices were used; nothing left behind
    w = window_of(budget)
    assert admitted <= 100
    assert w.spent_nano == admitted * WORST <= usd(1)
    assert w.reserved_nano == 0
    assert sum(b.admitted_from_slices for b in books) > 0
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


def test_without_the_slice_check_the_cap_leaks(acme, monkeypatch):
    # given: a slice admits whatever it is asked, not only what it holds
    monkeypatch.setattr(slices.GUARDS, "check_available", False)
    budget = acme.budget(amount="1")
    owners = [register().id for _ in range(3)]
    books = [Book() for _ in owners]
    # (the carve's CHECK constraint then refuses the overdrawn records: not strict)
    admitted = _exhaust(acme, budget, books, owners, n_threads=12, per_thread=20, strict=False)
    # then: the check of the test above fails: more requests admitted than the cap affords
    assert admitted > 100


def test_without_the_books_lock_concurrent_takes_overdraw_a_slice(acme, monkeypatch):
    # given: one process whose slice is checked and decremented without its lock, the gap widened
    monkeypatch.setattr(slices.GUARDS, "locked", False)
    monkeypatch.setattr(slices, "RACE_DELAY_SECONDS", 0.05)
    acme.budget(amount="1")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))  # alone: now the room is known
    seed = book.admit(_request(acme, owner, budgets))  # takes the slice: 20 worst cases, 1 used
    assert seed.reservation.slice_id is not None
    # when: 40 threads take from it at once
    results = race(40, lambda i: book.admit(_request(acme, owner, budgets)))
    from_slice = [r for r in results if r.reservation.slice_id == seed.reservation.slice_id]
    # then: more than the 19 left were handed out of a 20-worst-case slice
    assert len(from_slice) > 19


def test_with_the_race_widened_but_the_lock_in_place_a_slice_is_never_overdrawn(acme, monkeypatch):
    # the control for the test above
    monkeypatch.setattr(slices, "RACE_DELAY_SECONDS", 0.05)
    acme.budget(amount="1")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))
    seed = book.admit(_request(acme, owner, budgets))
    results = race(40, lambda i: book.admit(_request(acme, owner, budgets)))
    from_slice = [r for r in results if r.reservation.slice_id == seed.reservation.slice_id]
    assert len(from_slice) == 19


def test_a_crashed_process_is_charged_only_its_requests_in_flight(acme):
    # given: a process with a slice of 20 worst cases and 5 requests from it in flight, 2 of them
    # recorded (and the request admitted alone, recorded)
    budget = acme.budget(amount="10")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    alone = book.admit(_request(acme, owner, budgets))
    taken = [book.admit(_request(acme, owner, budgets)) for _ in range(5)]
    _settle(book, [alone, *taken[:2]], cost=usd("0.002"))
    assert SliceClaim.objects.count() == 5  # each request from the slice, before its provider call
    # when: it dies; expiry settles its slice
    expire(dead_owner_ids=[owner])
    drain_all()
    # then: the 3 recorded are charged their cost, the 3 still in flight their worst case each under
    # their own ids; the slice's 15 unused worst cases went back to the window
    w = window_of(budget)
    assert w.spent_nano == 3 * usd("0.002") + 3 * WORST
    assert w.reserved_nano == 0
    assert not Reservation.objects.exists() and not SliceClaim.objects.exists()
    estimated = UsageRecord.objects.filter(status="estimated")
    assert {(r.request_id, r.cost_nano) for r in estimated} == {(a.reservation.request_id, WORST) for a in taken[2:]}
    # a late record of a request in flight corrects its own estimate, once
    _settle(book, taken[2:3], cost=usd("0.002"))
    _settle(book, taken[2:3], cost=usd("0.002"))
    drain_all()
    assert window_of(budget).spent_nano == w.spent_nano - (WORST - usd("0.002"))
    assert UsageRecord.objects.get(request_id=taken[2].reservation.request_id).status == "served"
    assert audit_counters(record=False).ok


def test_a_refusal_recalls_this_process_slices_and_notifies_the_others(acme):
    acme.budget(amount="1")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))
    held = book.admit(_request(acme, owner, budgets))
    assert held.reservation.slice_id is not None
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {slices.NOTIFY_CHANNEL}")
    # when: a request larger than all the room left is refused
    with pytest.raises(BudgetExceeded) as refused:
        book.admit(_request(acme, owner, budgets, worst=usd("2")))
    # then: this process's slice on that window retired, and a notification names the window
    assert book.stats()["admitting"] == 0
    notes = list(connection.connection.notifies(timeout=2, stop_after=1))
    assert notes and notes[0].payload == str(refused.value.window_id)


def test_a_failed_give_back_keeps_it_and_every_later_one_in_order(acme, monkeypatch):
    book = Book()
    order: list[str] = []

    def flaky(*, slice_id, amount_nano, close):
        order.append(slice_id)
        if slice_id == "a" and order.count("a") == 1:
            raise RuntimeError("database went away")
        return True

    monkeypatch.setattr(slices, "give_back", flaky)
    book._returns = [slices._Return("a", 1, False), slices._Return("b", 2, False)]
    with pytest.raises(RuntimeError):
        book.give_back_pending()
    assert [r.slice_id for r in book._returns] == ["a", "b"]
    assert book.give_back_pending() == 2
    assert order == ["a", "a", "b"]


def test_a_close_takes_the_queued_return_of_the_same_slice_with_it(acme):
    # given: a slice retired with a request in flight (its unused part queued), then closed
    acme.budget(amount="10")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))
    taken = book.admit(_request(acme, owner, budgets))
    book.retire_all()
    assert [r.close for r in book._returns] == [False]
    _settle(book, [taken], cost=0)
    # then: one close carrying the unused part; written, it deletes the slice row
    assert [(r.close, r.amount_nano) for r in book._returns] == [(True, 19 * WORST)]
    book.give_back_pending()
    assert not _slice_rows().exists()


def _in_flight_then_capped(tenant, *, switch: bool):
    """Five requests in flight from a slice of no blocking ceiling, then a blocking cap worth three
    of them appears (created, or an alert budget switched to block)."""
    alert = tenant.budget(amount="1", mode="alert")
    owner = register().id
    book = Book()
    budgets = _matching(tenant)
    in_flight = [book.admit(_request(tenant, owner, budgets)) for _ in range(5)]
    assert all(a.reservation.slice_id is not None for a in in_flight)
    if switch:
        from budgets.services import update_budget
        from tenants.audit import Actor

        update_budget(budget=alert, actor=Actor(label="test", operator=True), mode="block", amount_nano=3 * WORST)
        cap = alert
    else:
        cap = tenant.budget(amount="0.03")
    return book, owner, cap, in_flight


@pytest.mark.parametrize("switch", [False, True], ids=["created", "switched-to-block"])
def test_a_cap_that_appears_mid_flight_counts_requests_admitted_from_a_zero_slice(acme, switch):
    # given: five requests in flight under no blocking budget, then a cap worth three of them
    book, owner, cap, in_flight = _in_flight_then_capped(acme, switch=switch)
    # when: more requests come, read with the new budget
    with pytest.raises(BudgetExceeded):
        book.admit(_request(acme, owner, _matching(acme)))
    # then: the new window carried all five in flight, so nothing more fits
    w = Window.objects.filter(budget=cap).order_by("-budget_version").first()
    assert w is not None
    assert w.reserved_nano == w.seed_reserved_nano == 5 * WORST
    # and the in-flight five settle onto it, leaving nothing held
    _settle(book, in_flight, cost=WORST)
    drain_all()
    w.refresh_from_db()
    assert (w.spent_nano, w.reserved_nano) == (5 * WORST, 0)
    book.retire_all()
    book.give_back_pending()
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


def test_a_request_reading_budgets_before_a_cap_committed_is_admitted_afresh(acme):
    # given: a zero slice taken under an alert budget, and the request's budgets read before a cap
    acme.budget(amount="1", mode="alert")
    owner = register().id
    book = Book()
    stale = _matching(acme)
    first = book.admit(_request(acme, owner, stale))
    cap = acme.budget(amount="0.025")  # room for one worst case besides the first in flight
    # when: a request admitted with the stale read (no blocking budget known)
    second = book.admit(_request(acme, owner, stale))
    # then: its row was refused, it was admitted afresh against the cap, and a third is refused
    assert second.reservation.slice_id is None
    with pytest.raises(BudgetExceeded):
        book.admit(_request(acme, owner, _matching(acme)))
    assert window_of(cap).reserved_nano == 2 * WORST
    _settle(book, [first, second], cost=WORST)
    drain_all()
    book.retire_all()
    book.give_back_pending()
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


def test_without_their_rows_requests_of_a_zero_slice_escape_a_cap_created_mid_flight(acme, monkeypatch):
    # the guard removed: requests of a zero slice have no row until recorded
    monkeypatch.setattr(slices.GUARDS, "write_unblocked", False)
    book, owner, cap, in_flight = _in_flight_then_capped(acme, switch=False)
    # then: the new window starts empty and admits past the cap
    admitted = book.admit(_request(acme, owner, _matching(acme)))
    assert window_of(cap).reserved_nano < 5 * WORST
    _settle(book, [*in_flight, admitted], cost=WORST)
    drain_all()
    book.retire_all()
    book.give_back_pending()


def test_a_request_from_a_slice_has_every_field_the_orm_would_give_it(acme):
    # given: a request admitted from a slice in memory (its instance built without Model.__init__)
    acme.budget(amount="10")
    owner = register().id
    book = Book()
    budgets = _matching(acme)
    book.admit(_request(acme, owner, budgets))
    request = _request(acme, owner, budgets)
    taken = book.admit(request).reservation
    assert taken.slice_id is not None
    # then: every concrete field is set (none left to a deferred load from a row that does not
    # exist yet), and an ORM-built instance from the same values agrees on each
    fields = [f.attname for f in Reservation._meta.concrete_fields]
    assert set(fields) <= set(taken.__dict__)
    same = Reservation(**{name: getattr(taken, name) for name in fields})
    assert [getattr(same, n) for n in fields] == [getattr(taken, n) for n in fields]
    assert taken.request_id == request.request_id and taken.amount_nano == WORST and taken.owner_id == owner
    assert taken.origin == Reservation.Origin.GATEWAY and taken.job_id is None
    assert not taken._state.adding and taken._state.db == "default"
    book.settled(taken)
