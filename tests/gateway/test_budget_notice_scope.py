"""A budget write's cache notice names the subject the budget covers
(ledger/migrations/0006_budget_notice_subject.py), and a gateway process drops only the cached
budgets of subjects that budget can cover (ledger/budget_cache.py): a run's budget, created on
the run's first call, leaves every other subject's cached budgets and slices in place, while
the entries of the subject it covers are stale at once.

The listener is the gateway's own (tests/gateway/test_cache_notices.py `listener`), on real
notices from the writing transactions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from budgets.services import create_budget
from core.invalidation import CHANNEL
from gateway.admission.subjects import founding, payer
from gateway.upstream.runtime import conninfo
from ledger import budget_cache, slices
from ledger.admission import AdmissionRequest, Subject
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.models import Budget
from ledger.scopes import SCOPES
from ledger.slices import Book
from tenants.audit import Actor
from tenants.models import EndCustomer, Member
from tests.conftest import usd
from tests.gateway.test_cache_notices import WORST, _caught_up, _wait_for, listener  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slices_on", "db_threads"),
]

ADMIN = Actor(label="test admin")


@contextmanager
def heard() -> Iterator[list[str]]:
    """The budget notices delivered while the block ran (its writes commit as they go)."""
    notes: list[str] = []
    with psycopg.connect(conninfo(), autocommit=True) as listening:
        listening.execute(f"LISTEN {CHANNEL}")
        yield notes
        notes.extend(n.payload for n in listening.notifies(timeout=0.5) if n.payload.startswith("budgets:"))


def test_each_scopes_notice_names_its_subject(acme, alice):
    # given: a subject of every scope
    member = Member.objects.create(organization=acme.org, user=alice)
    customer = EndCustomer.objects.create(project=acme.project, external_id="c-1")
    subjects = {
        "organization": {},
        "project": {"project": acme.project},
        "member": {"member": member},
        "key": {"api_key": acme.key},
        "end_customer": {"end_customer": customer},
        "run": {"run_id": "run:with:colons"},
    }
    assert set(subjects) == {s.name for s in SCOPES}  # a new scope needs its line in the trigger
    org = acme.org.id
    expected = {
        "organization": f"budgets:{org}",
        "project": f"budgets:{org}:project_id:{acme.project.id}",
        "member": f"budgets:{org}:member_id:{member.id}",
        "key": f"budgets:{org}:api_key_id:{acme.key.id}",
        "end_customer": f"budgets:{org}:end_customer_id:{customer.id}",
        "run": f"budgets:{org}:run_id:run:with:colons",
    }
    for scope, subject in subjects.items():
        # when: its budget is created, edited and deleted
        with heard() as notes:
            budget = acme.budget(amount="1", scope=scope, **subject)
            Budget.objects.filter(pk=budget.pk).update(amount_nano=usd("2"))
            budget.delete()
        # then: each write names the subject (the column name is the cache's: ledger/scopes.py)
        assert notes == [expected[scope]] * 3, scope
        column = notes[0].split(":")[2] if scope != "organization" else None
        assert column is None or column in budget_cache.COLUMNS


def test_an_update_that_moves_a_budget_names_both_subjects(acme):
    budget = acme.budget(amount="1", scope="run", run_id="first")
    with heard() as notes:
        Budget.objects.filter(pk=budget.pk).update(run_id="second")  # only by hand: services refuse it
    org = acme.org.id
    assert notes == [f"budgets:{org}:run_id:first", f"budgets:{org}:run_id:second"]


@pytest.mark.usefixtures("listener")
@pytest.mark.parametrize("slices_setting", [True, False], ids=["slices-on", "slices-off"])
def test_new_runs_budgets_leave_another_keys_cached_budgets_and_slice_alone(
    acme, monkeypatch, settings, slices_setting
):
    # given: a $10 organization cap; a second key whose budgets are cached and which holds a
    # slice (slices on) in the process's book, the one the listener recalls
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": slices_setting}
    book = Book()
    monkeypatch.setattr(slices, "book", book)
    recalled: list[int] = []
    recall = book.on_notification
    monkeypatch.setattr(book, "on_notification", lambda payload: recalled.append(recall(payload)) or recalled[-1])
    acme.budget(amount="10")
    other = acme.add_key("other")
    owner = register().id
    _caught_up()
    other_subject = acme.subject(other)
    for _ in range(2):  # alone, then a slice of 20
        book.admit(_request_for(acme, other_subject, owner))
    assert book.stats()["admitting"] == (1 if slices_setting else 0)
    _caught_up()
    budget_cache.budgets_for(other_subject)

    # when: 40 new runs of the first key, 8 threads at once, each run's first call creating its
    # budget with its admission (subjects.founding), as the gateway does
    threads, per_thread = 8, 5
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def first_calls(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                who = payer(key=acme.key, customer_id=None, run_id=f"run-{t}-{i}", run_budget_usd="1")
                with founding(who) as founded:
                    book.admit(_request_for(acme, founded.subject, owner))
        except BaseException as exc:  # noqa: BLE001  (re-raised by the assertion below)
            errors.append(exc)
        finally:
            connection.close()

    pool = [threading.Thread(target=first_calls, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert not errors, errors
    assert Budget.objects.filter(organization=acme.org, scope="run").count() == threads * per_thread
    # every run budget's notices handled: the book heard each change, and a fence sent after
    # them came back (one queue, delivered in commit order)
    _wait_for(lambda: len(recalled) >= threads * per_thread)
    _caught_up()

    # then: the other key's cached budgets are still served from the cache, and no slice was recalled
    misses = budget_cache.cache.misses
    assert [b.amount_nano for b in budget_cache.budgets_for(other_subject)] == [usd("10")]
    assert budget_cache.cache.misses == misses
    assert len(recalled) >= threads * per_thread
    assert sum(recalled) == 0
    assert book.stats()["admitting"] == (1 if slices_setting else 0)
    book.retire_all()
    book.give_back_pending()


def _request_for(tenant, subject, owner_id: int) -> AdmissionRequest:
    return tenant.request(
        worst_nano=WORST, subject=subject, owner_id=owner_id, budgets=budget_cache.budgets_for(subject)
    )


@pytest.mark.usefixtures("listener")
@pytest.mark.parametrize(
    ("slices_setting", "guard"),
    [(True, True), (False, True), (True, False), (False, False)],
    ids=["slices-on", "slices-off", "slices-on-no-subject-drop (removal)", "slices-off-no-subject-drop (removal)"],
)
def test_a_budget_for_a_cached_subject_is_seen_at_once(acme, monkeypatch, settings, slices_setting, guard):
    # given: a $10 organization cap; a run's budgets cached before it has a budget of its own (its
    # label came without a cap), with two of its requests in flight (slices on: one from a slice)
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": slices_setting}
    monkeypatch.setattr(budget_cache.GUARDS, "drop_subject_entries", guard)
    acme.budget(amount="10")
    run = acme.subject(run_id="labelled")
    owner, book = register().id, Book()  # a book the slice recall does not reach: the cache's rule alone
    _caught_up()
    for _ in range(2):
        book.admit(_request_for(acme, run, owner))
    _caught_up()
    budget_cache.budgets_for(run)
    hits = budget_cache.cache.hits
    budget_cache.budgets_for(run)
    assert budget_cache.cache.hits == hits + 1  # served from the cache

    # when: the run gets a cap of one worst case (below what is in flight), created as a
    # first-sight budget (no wait) and its notice handled
    create_budget(
        organization=acme.org, actor=ADMIN, scope="run", run_id="labelled", amount_nano=WORST, first_sight=True
    )
    _caught_up()

    # then: the run's next read has its budget and the request is refused. Without the subject's
    # drop the cached budgets leave it out: with slices the old slice admits past the new cap;
    # without, the admission statement finds the budget it did not know and holds the cap itself.
    scopes = [b.scope for b in budget_cache.budgets_for(run)]
    assert ("run" in scopes) is guard
    try:
        book.admit(_request_for(acme, run, owner))
        admitted = True
    except BudgetExceeded:
        admitted = False
    assert admitted is (slices_setting and not guard)


@pytest.mark.usefixtures("listener")
@pytest.mark.parametrize("guard", [True, False], ids=["subject-drop", "no-subject-drop (removal)"])
def test_a_read_that_began_before_its_subjects_notice_is_not_kept(acme, monkeypatch, guard):
    # given: a run's budgets read (no run budget yet) and slow to be stored, racing the creation
    # of the run's budget, whose notice (naming the run, not the organization) is handled first
    monkeypatch.setattr(budget_cache.GUARDS, "drop_subject_entries", guard)
    acme.budget(amount="10")
    run = acme.subject(run_id="racing")
    _caught_up()
    real = budget_cache.matching_budgets
    read = threading.Event()

    def slow_read(subject):
        budgets = real(subject)
        read.set()
        _wait_for(lambda: ("run_id", "racing") in budget_cache.cache._subjects.get(acme.org.id, {}))
        return budgets

    def reader() -> None:
        try:
            budget_cache.budgets_for(run)
        finally:
            connection.close()

    monkeypatch.setattr(budget_cache, "matching_budgets", slow_read)
    thread = threading.Thread(target=reader)
    thread.start()
    assert read.wait(timeout=5)
    # when: the run's budget is created after the read and its notice handled before it is stored
    create_budget(organization=acme.org, actor=ADMIN, scope="run", run_id="racing", amount_nano=WORST, first_sight=True)
    thread.join(timeout=10)
    monkeypatch.setattr(budget_cache, "matching_budgets", real)
    # then: what the read saw was not kept, and the next read has the run's budget; kept, the
    # cached entry leaves the run's cap out
    assert ("run" in [b.scope for b in budget_cache.budgets_for(run)]) is guard


def test_too_many_subjects_counted_drop_only_their_organizations_entries(monkeypatch):
    # given: room to count 3 subjects per organization
    monkeypatch.setattr(budget_cache, "SUBJECT_LIMIT", 3)
    cache = budget_cache.BudgetCache()
    ours, theirs = Subject(organization_id=1, api_key_id=7), Subject(organization_id=2, api_key_id=8, run_id="r")
    before = cache._stamp(ours), cache._stamp(theirs)
    # when: a fourth new run of organization 1 is noticed
    for i in range(4):
        cache.changed(f"1:run_id:run-{i}")
    # then: organization 1's entries are all stale, and its counts start again; 2's are not
    assert cache._stamp(ours) != before[0]
    assert cache._stamp(theirs) == before[1]
    assert cache._subjects[1] == {}


def test_a_notice_the_cache_cannot_place_drops_the_organizations_entries():
    cache = budget_cache.BudgetCache()
    key = Subject(organization_id=1, api_key_id=7)
    for notice in ("1:api_key_id:not-an-id", "1:unknown_id:3", "1:api_key_id", "1"):
        before = cache._stamp(key)
        cache.changed(notice)
        assert cache._stamp(key) != before, notice
    # an id notice is counted under the int the subject carries; another key's leaves it
    before = cache._stamp(key)
    cache.changed("1:api_key_id:7")
    counted = cache._stamp(key)
    assert counted != before
    cache.changed("1:api_key_id:8")
    assert cache._stamp(key) == counted


@pytest.mark.usefixtures("listener")
@pytest.mark.parametrize("scope", [s.name for s in SCOPES])
def test_a_budget_makes_stale_every_entry_it_covers_and_no_other(acme, alice, scope):
    # given: two subjects' budgets cached, one with a value in every subject column that a new
    # budget of any scope names, the other with none of them
    member = Member.objects.create(organization=acme.org, user=alice)
    customer = EndCustomer.objects.create(project=acme.project, external_id="c-1")
    org, absent = acme.org.id, 10**9
    covered = Subject(org, acme.project.id, member.id, acme.key.id, customer.id, "r-1")
    other = Subject(org, absent, absent, absent, absent, "r-2")
    names = {
        "organization": {},
        "project": {"project": acme.project},
        "member": {"member": member},
        "key": {"api_key": acme.key},
        "end_customer": {"end_customer": customer},
        "run": {"run_id": "r-1"},
    }
    _caught_up()
    for subject in (covered, other):
        budget_cache.budgets_for(subject)
    # when: a budget of the scope is created for the covered subject's value
    acme.budget(amount="1", scope=scope, **names[scope])
    _caught_up()
    # then: the covered subject reads it at once; the other is served from the cache, unless the
    # budget is the organization's (it covers both)
    assert [b.scope for b in budget_cache.budgets_for(covered)] == [scope]
    misses = budget_cache.cache.misses
    assert [b.scope for b in budget_cache.budgets_for(other)] == (["organization"] if scope == "organization" else [])
    assert budget_cache.cache.misses == misses + (scope == "organization")
