"""Windows, periods, leases and late reports: usage lands in the window of its admission."""

from datetime import UTC, datetime, timedelta

import pytest

from ledger.admission import renew
from ledger.drain import drain_all
from ledger.models import GatewayInstance, Reservation, UsageRecord, Window
from ledger.periods import LIFETIME_START, period_bounds
from ledger.recording import Outcome, expire, record
from tests.conftest import usd

pytestmark = pytest.mark.django_db


def test_admitted_before_midnight_settled_after_charges_the_admitting_day(acme):
    # given: a $1 daily cap; a request admitted at 23:59:59 UTC
    budget = acme.budget(amount="1", period="day")
    late = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)
    admitted = acme.admit(worst_nano=usd("0.5"), now=late)
    # when: it settles after midnight, and the new day's first request arrives
    record(reservation=admitted.reservation, outcome=Outcome(status="served", cost_nano=usd("0.2")))
    next_day = acme.admit(worst_nano=usd("0.9"), now=late + timedelta(seconds=2))
    drain_all()
    # then
    day1 = Window.objects.get(budget=budget, period_start=datetime(2026, 11, 30, tzinfo=UTC))
    day2 = Window.objects.get(budget=budget, period_start=datetime(2026, 12, 1, tzinfo=UTC))
    assert (day1.spent_nano, day1.reserved_nano) == (usd("0.2"), 0)
    assert (day2.spent_nano, day2.reserved_nano) == (0, usd("0.9"))
    assert next_day.reservation.created_at.date().day == 1


def test_periods_follow_the_budget_timezone():
    now = datetime(2026, 3, 8, 12, tzinfo=UTC)  # US DST starts this day: a 23-hour day
    start, end = period_bounds(period="day", tz="America/New_York", now=now)
    assert start == datetime(2026, 3, 8, 5, tzinfo=UTC) and end - start == timedelta(hours=23)
    start, end = period_bounds(period="week", tz="UTC", now=now)
    assert start == datetime(2026, 3, 2, tzinfo=UTC) and end == datetime(2026, 3, 9, tzinfo=UTC)
    start, end = period_bounds(period="month", tz="UTC", now=datetime(2026, 12, 31, 23, tzinfo=UTC))
    assert (start, end) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert period_bounds(period="lifetime", tz="UTC", now=now) == (LIFETIME_START, None)


def test_a_budget_created_mid_period_starts_with_the_spend_already_recorded(acme):
    now = datetime(2026, 11, 15, tzinfo=UTC)
    for _ in range(3):
        r = acme.admit(worst_nano=usd("0.1"), now=now)
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.05")))
    drain_all()
    # when: a $0.20 monthly cap is created after $0.15 was spent this month
    budget = acme.budget(amount="0.20")
    acme.admit(worst_nano=usd("0.05"), now=now + timedelta(hours=1))
    # then: it counts what was spent before it existed, and refuses past its amount
    assert Window.objects.get(budget=budget).spent_nano == usd("0.15")
    from ledger.errors import BudgetExceeded

    with pytest.raises(BudgetExceeded):
        acme.admit(worst_nano=usd("0.01"), now=now + timedelta(hours=1))


def test_alert_budgets_never_refuse_and_are_charged(acme):
    budget = acme.budget(amount="0.01", mode="alert")
    r = acme.admit(worst_nano=usd("1"))
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.5")))
    drain_all()
    w = Window.objects.get(budget=budget)
    assert (w.spent_nano, w.reserved_nano) == (usd("0.5"), 0)


def test_expired_lease_is_charged_at_worst_case_then_corrected_by_a_late_report(acme):
    budget = acme.budget(amount="1")
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    r = acme.admit(worst_nano=usd("0.3"), now=now)
    # when: the lease lapses (its owner stopped heartbeating) and beat expires it
    assert expire(now=now + timedelta(hours=1)) == 1
    w = Window.objects.get(budget=budget)
    assert (w.spent_nano, w.reserved_nano) == (usd("0.3"), 0)
    rec = UsageRecord.objects.get(request_id=r.reservation.request_id)
    assert rec.status == "estimated" and rec.applied
    # then: the true report arrives late and corrects the same record and window, once
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.1")))
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.2")))
    w.refresh_from_db()
    rec.refresh_from_db()
    assert w.spent_nano == usd("0.1")
    assert (rec.status, rec.cost_nano) == ("served", usd("0.1"))
    assert UsageRecord.objects.count() == 1


def test_expiry_never_touches_a_reservation_whose_record_exists(acme):
    acme.budget(amount="1")
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    r = acme.admit(worst_nano=usd("0.3"), now=now)
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.1")))  # not yet drained
    assert expire(now=now + timedelta(hours=1)) == 0
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano, rec.applied) == ("served", usd("0.1"), True)


def test_renew_extends_leases_of_live_owners_only_and_never_past_the_deadline(acme):
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    alive = GatewayInstance.objects.create(name="a", heartbeat_at=now)
    dead = GatewayInstance.objects.create(name="b", heartbeat_at=now - timedelta(hours=1))
    mine = acme.admit(worst_nano=1, now=now, owner_id=alive.id).reservation
    theirs = acme.admit(worst_nano=1, now=now, owner_id=dead.id).reservation
    later = now + timedelta(seconds=100)
    assert renew(owner_ids=[alive.id], now=later, lease=timedelta(seconds=120)) == 1
    assert Reservation.objects.get(pk=mine.pk).expires_at == later + timedelta(seconds=120)
    assert Reservation.objects.get(pk=theirs.pk).expires_at == theirs.expires_at
    # past the hard deadline nothing is renewed
    assert renew(owner_ids=[alive.id], now=mine.deadline_at + timedelta(seconds=1)) == 0


def test_a_dead_owners_reservations_are_charged_within_the_grace_not_a_lease_later(acme):
    from ledger.instances import alive_ids, dead_ids

    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    alive = GatewayInstance.objects.create(name="a", heartbeat_at=now)
    crashed = GatewayInstance.objects.create(name="b", heartbeat_at=now - timedelta(seconds=31))
    acme.budget(amount="1")
    mine = acme.admit(worst_nano=usd("0.1"), now=now, owner_id=alive.id).reservation
    theirs = acme.admit(worst_nano=usd("0.2"), now=now, owner_id=crashed.id).reservation
    # when: beat runs 1 s later — both leases (120 s) are far from lapsing
    live = alive_ids(grace=timedelta(seconds=30), now=now)
    assert expire(now=now + timedelta(seconds=1), dead_owner_ids=dead_ids(alive=live)) == 1
    # then: only the crashed process's request is charged, at its worst case
    rec = UsageRecord.objects.get()
    assert (rec.request_id, rec.status, rec.cost_nano) == (theirs.request_id, "estimated", usd("0.2"))
    assert Reservation.objects.filter(pk=mine.pk).exists()
