"""Every money rule the database can state is a named constraint: each rejects a bad row."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction

from ledger.models import Budget, Hold, Reservation, UsageRecord, Window
from tests.conftest import usd

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def _rejects(fn, name: str):
    with pytest.raises(IntegrityError) as err, transaction.atomic():
        fn()
    assert name in str(err.value)


@pytest.fixture
def window(acme):
    budget = acme.budget(amount="1")
    return Window.objects.create(budget=budget, period_start=NOW)


def test_window_counters_never_negative(window):
    _rejects(lambda: Window.objects.filter(pk=window.pk).update(reserved_nano=-1), "window_reserved_nonnegative")
    _rejects(lambda: Window.objects.filter(pk=window.pk).update(spent_nano=-1), "window_spent_nonnegative")


def test_one_window_per_budget_and_period(window):
    _rejects(lambda: Window.objects.create(budget=window.budget, period_start=NOW), "window_unique_per_period")


def test_spent_may_exceed_the_budget(window):
    # An overbilling provider's excess is recorded, never rejected.
    Window.objects.filter(pk=window.pk).update(spent_nano=usd(5))
    assert Window.objects.get(pk=window.pk).spent_nano == usd(5)


def test_budget_scope_must_name_its_subject(acme):
    _rejects(
        lambda: Budget.objects.create(organization=acme.org, scope="key", amount_nano=1),
        "budget_scope_names_its_subject",
    )
    _rejects(
        lambda: Budget.objects.create(organization=acme.org, scope="organization", amount_nano=-1),
        "budget_amount_nonnegative",
    )


def test_one_budget_per_run(acme):
    acme.budget(amount="1", scope="run", run_id="r1", period="lifetime")
    _rejects(lambda: acme.budget(amount="2", scope="run", run_id="r1", period="lifetime"), "budget_one_per_run")


def test_one_usage_record_per_request_id(acme):
    row = dict(organization=acme.org, status="served", admitted_at=NOW)
    UsageRecord.objects.create(request_id="same", **row)
    _rejects(lambda: UsageRecord.objects.create(request_id="same", **row), "usage_usagerecord_request_id_key")
    _rejects(lambda: UsageRecord.objects.create(request_id="neg", cost_nano=-1, **row), "usage_cost_nonnegative")


def test_holds_and_reservations_never_negative(window, acme):
    res = dict(
        organization=acme.org,
        created_at=NOW,
        expires_at=NOW + timedelta(minutes=1),
        deadline_at=NOW + timedelta(hours=1),
    )
    _rejects(
        lambda: Reservation.objects.create(request_id="r", amount_nano=-5, **res), "reservation_amount_nonnegative"
    )
    ok = Reservation.objects.create(id=uuid.uuid4(), request_id="ok", amount_nano=5, **res)
    _rejects(lambda: Hold.objects.create(reservation=ok, window=window, amount_nano=-5), "hold_amount_nonnegative")
