"""The cap holds under real concurrency: threads with their own connections, one barrier."""

import random

import pytest
from django.db import OperationalError
from django.db.models import Sum

from ledger import admission
from ledger.drain import drain, drain_all
from ledger.errors import BudgetExceeded
from ledger.models import Hold, Reservation, UsageRecord, Window
from ledger.recording import Outcome, record, release
from tests.concurrency import race
from tests.conftest import open_window, usd, window_of

pytestmark = pytest.mark.django_db(transaction=True)

WORST = usd("0.037")


def _try_admit(tenant, **kw):
    try:
        return tenant.admit(**kw)
    except BudgetExceeded as refusal:
        return refusal


def _exact_fit(acme, n=200, *, window_open=False):
    # given: a $1 blocking cap and a worst case of $0.037 -> room for exactly 27
    budget = acme.budget(amount="1")
    if window_open:
        open_window(budget)
    # when
    results = race(n, lambda i: _try_admit(acme, worst_nano=WORST))
    admitted = [r for r in results if not isinstance(r, BudgetExceeded)]
    return budget, admitted, results


def test_exact_fit_under_200_concurrent_admissions(acme):
    budget, admitted, results = _exact_fit(acme)
    # then
    assert len(admitted) == 27
    assert window_of(budget).reserved_nano == 27 * WORST
    assert Reservation.objects.count() == 27
    refusals = [r for r in results if isinstance(r, BudgetExceeded)]
    assert {r.code for r in refusals} == {"organization_budget"}
    assert all(r.status == 402 and r.remaining_nano == usd(1) - 27 * WORST for r in refusals)


def _widen_race(monkeypatch):
    # Hold every racer between its read and its write, so a missing guard shows every time.
    monkeypatch.setattr(admission, "RACE_DELAY_SECONDS", 0.3)


def test_without_the_row_lock_the_cap_leaks(acme, monkeypatch):
    # given: the lock removed (a plain read), the race window widened, the window already open
    # (its creation would serialize the racers: open_window)
    monkeypatch.setattr(admission, "LOCK_CLAUSE", "")
    _widen_race(monkeypatch)
    # when
    budget, admitted, _ = _exact_fit(acme, n=60, window_open=True)
    # then: the exact-fit check fails — more than 27 admitted, reserved past the cap
    assert len(admitted) > 27
    assert window_of(budget).reserved_nano > usd(1)


def test_without_the_reservation_read_the_cap_leaks(acme, monkeypatch):
    # given: the lock kept, but admission ignores what others have reserved
    monkeypatch.setattr(admission.GUARDS, "count_reserved", False)
    # when
    budget, admitted, _ = _exact_fit(acme, n=60)
    # then
    assert len(admitted) == 60
    assert window_of(budget).reserved_nano > usd(1)


def test_with_the_race_widened_but_the_guards_in_place_the_cap_holds(acme, monkeypatch):
    # the control for the two tests above: the same widened race, nothing removed
    _widen_race(monkeypatch)
    budget, admitted, _ = _exact_fit(acme, n=40, window_open=True)
    assert len(admitted) == 27
    assert window_of(budget).reserved_nano == 27 * WORST


def test_stacked_ceilings_each_hold_and_refusals_name_the_right_one(acme):
    # given: keys A and B in project P1, key C in project P2;
    #        $0.30 daily cap on key A, $0.50 on P1, $1 on the organization
    from tenants.models import Project

    p2 = Project.objects.create(organization=acme.org, name="Second", slug="second")
    key_a, key_b, key_c = acme.key, acme.add_key("b"), acme.add_key("c", project=p2)
    key_cap = acme.budget(amount="0.30", scope="key", api_key=key_a, period="day")
    project_cap = acme.budget(amount="0.50", scope="project", project=acme.project)
    org_cap = acme.budget(amount="1")
    keys = [key_a, key_b, key_c]
    # when
    results = race(200, lambda i: (keys[i % 3], _try_admit(acme, worst_nano=WORST, key=keys[i % 3])))
    # then: no ceiling is over-reserved
    for budget in (key_cap, project_cap, org_cap):
        w = window_of(budget)
        assert w.spent_nano + w.reserved_nano <= budget.amount_nano
    admitted = {k.id: 0 for k in keys}
    for key, r in results:
        if isinstance(r, BudgetExceeded):
            allowed = {
                key_a: {"key_budget", "project_budget", "organization_budget"},
                key_b: {"project_budget", "organization_budget"},
                key_c: {"organization_budget"},
            }[key]
            assert r.code in allowed
        else:
            admitted[key.id] += 1
    assert admitted[key_a.id] <= 8  # floor(0.30 / 0.037)
    assert admitted[key_a.id] + admitted[key_b.id] <= 13  # floor(0.50 / 0.037)
    assert sum(admitted.values()) == 27  # the org cap binds: C had ample demand
    assert window_of(org_cap).reserved_nano == 27 * WORST


def test_settle_cycles_return_room_and_leave_nothing_reserved(acme):
    # given: actual cost is a third of the worst case
    budget = acme.budget(amount="1")
    actual = usd("0.012")

    def cycle(i):
        outcomes = []
        for _ in range(5):
            r = _try_admit(acme, worst_nano=WORST)
            if isinstance(r, BudgetExceeded):
                outcomes.append("refused")
                continue
            record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=actual))
            drain(limit=50)
            outcomes.append("served")
        return outcomes

    # when: 40 threads x 5 admit -> record -> drain cycles
    results = [o for rs in race(40, cycle) for o in rs]
    drain_all()
    # then
    w = window_of(budget)
    served = results.count("served")
    assert w.spent_nano == served * actual <= usd(1)
    assert w.reserved_nano == 0
    assert served > 27  # settling freed room: more served than the worst case alone allows
    assert UsageRecord.objects.filter(status="served").count() == served
    assert not Reservation.objects.exists() and not Hold.objects.exists()


def test_failures_released_after_admission_lose_no_room(acme):
    budget = acme.budget(amount="1")
    actual = usd("0.012")

    def attempt(i):
        r = _try_admit(acme, worst_nano=WORST)
        if isinstance(r, BudgetExceeded):
            return "refused"
        if i % 3 == 0:
            release(reservation=r.reservation, error="upstream 503")
            return "failed"
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=actual))
        return "served"

    results = race(120, attempt)
    drain_all()
    w = window_of(budget)
    assert w.reserved_nano == 0
    assert w.spent_nano == results.count("served") * actual
    assert UsageRecord.objects.filter(status="released").count() == results.count("failed")
    assert UsageRecord.objects.filter(status="released").aggregate(s=Sum("cost_nano"))["s"] in (0, None)
    assert not Reservation.objects.exists()
    # the room came back: a fresh request fits while spend is far below the cap
    assert acme.admit(worst_nano=WORST)


def test_overbilling_excess_is_recorded_and_reported(acme):
    # given: every fourth admitted request is billed at 3x its worst case
    budget = acme.budget(amount="1")

    def attempt(i):
        r = _try_admit(acme, worst_nano=WORST)
        if isinstance(r, BudgetExceeded):
            return 0
        cost = 3 * WORST if i % 4 == 0 else WORST
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=cost))
        return cost

    race(200, attempt)
    drain_all()
    # then: spend exceeds the cap by exactly the excess billed, and that excess is on record
    w = window_of(budget)
    excess = UsageRecord.objects.aggregate(s=Sum("excess_nano"))["s"]
    assert excess > 0
    assert excess == UsageRecord.objects.filter(excess_nano__gt=0).count() * 2 * WORST
    assert w.spent_nano == UsageRecord.objects.aggregate(s=Sum("reserved_nano"))["s"] + excess
    assert w.spent_nano - excess <= usd(1)


def test_deadlock_freedom_with_overlapping_ceilings_in_random_order(acme):
    # given: 6 keys in 2 projects, each key with its own cap, plus project and org caps
    from tenants.models import Project

    p2 = Project.objects.create(organization=acme.org, name="Second", slug="second")
    keys = [acme.key] + [acme.add_key(f"k{i}", project=p2 if i % 2 else None) for i in range(5)]
    for key in keys:
        acme.budget(amount="100", scope="key", api_key=key, period="day")
    acme.budget(amount="100", scope="project", project=acme.project)
    acme.budget(amount="100", scope="project", project=p2)
    acme.budget(amount="1000", period="week")
    acme.budget(amount="1000", mode="alert")
    errors = []

    def attempt(i):
        rng = random.Random(i)
        for _ in range(10):
            try:
                r = acme.admit(worst_nano=rng.randint(1, 10_000), key=rng.choice(keys))
                if rng.random() < 0.5:
                    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=rng.randint(0, 5000)))
                    drain(limit=20)
            except OperationalError as exc:  # a deadlock surfaces as OperationalError
                errors.append(exc)

    race(64, attempt)
    assert errors == []
    drain_all()
    # every counter equals its live holds: nothing half-applied by an aborted transaction
    for w in Window.objects.all():
        assert w.reserved_nano == sum(h.amount_nano for h in Hold.objects.filter(window=w))


def test_drain_run_twice_at_once_applies_each_record_once(acme):
    budget = acme.budget(amount="1000", mode="alert")
    for _ in range(300):
        r = acme.admit(worst_nano=1000)
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=7))
    # when: 8 drains race over the same outbox
    applied = race(8, lambda i: drain_all(batch=25))
    # then
    assert sum(applied) == 300
    assert window_of(budget).spent_nano == 300 * 7
    assert not UsageRecord.objects.filter(applied=False).exists()
