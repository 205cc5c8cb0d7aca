"""The cap holds with PgBouncer in transaction mode between capgate and Postgres: admission
races, the slices' recall (LISTEN on a direct connection) and a capcheck scenario at 200
concurrent requests through the live gateway, with slices on and off. The controls show each
test can fail there: without the row lock the cap leaks, and a LISTEN through the pooler never
hears the recall."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from alerts.audit import audit_counters
from gateway.upstream import loopdb
from ledger import admission, slices
from ledger.errors import BudgetExceeded
from ledger.models import Reservation, UsageRecord
from tests.concurrency import race
from tests.conftest import open_window, usd, window_of
from tests.ledger import test_slice_recall as recall

pytestmark = pytest.mark.django_db(transaction=True)

WORST = usd("0.037")  # a $1 cap has room for exactly 27


def _try_admit(tenant):
    try:
        return tenant.admit(worst_nano=WORST)
    except BudgetExceeded as refusal:
        return refusal


def _carried(pgbouncer, before: int, at_least: int) -> int:
    # PgBouncer refreshes its totals each second (stats_period, scripts/services.sh).
    deadline = time.monotonic() + 5
    while (carried := pgbouncer.transactions() - before) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return carried


def test_exact_fit_under_200_concurrent_admissions(pgbouncer, acme):
    # given: a $1 blocking cap
    budget = acme.budget(amount="1")
    before = pgbouncer.transactions()
    # when: 200 admissions race, each thread on its own connection through the pooler
    results = race(200, lambda i: _try_admit(acme))
    # then: exactly 27 fit, the rest are refused naming the ceiling, and the pooler carried them
    admitted = [r for r in results if not isinstance(r, BudgetExceeded)]
    assert len(admitted) == 27
    assert window_of(budget).reserved_nano == 27 * WORST
    assert {r.code for r in results if isinstance(r, BudgetExceeded)} == {"organization_budget"}
    assert _carried(pgbouncer, before, 200) >= 200


def test_without_the_row_lock_the_cap_leaks_through_pgbouncer_too(pgbouncer, acme, monkeypatch):
    # given: the lock removed (a plain read), every racer held between its read and its write,
    # and the window already open (its creation would serialize the racers: open_window)
    monkeypatch.setattr(admission, "LOCK_CLAUSE", "")
    monkeypatch.setattr(admission, "RACE_DELAY_SECONDS", 0.3)
    budget = acme.budget(amount="1")
    open_window(budget)
    # when
    results = race(60, lambda i: _try_admit(acme))
    # then: the same check fails, so the test above can
    assert len([r for r in results if not isinstance(r, BudgetExceeded)]) > 27
    assert window_of(budget).reserved_nano > usd(1)


@pytest.mark.usefixtures("slices_on")
def test_slices_are_recalled_over_the_direct_listen_connection(pgbouncer, acme, monkeypatch):
    # given: another process's slice on the organization's window, its LISTEN on the direct
    # connection (CAPGATE["LISTEN_DATABASE"]) while every other connection is pooled
    monkeypatch.setattr(slices, "RECALL_WAIT_SECONDS", 5.0)
    # when: a narrower key budget is created (its window carries that slice) and a request
    # under it is admitted at once. The owner gives back 1 s after it hears, so the request's
    # refusal is seen to wait for it: a give-back landing between the refusal and its check of
    # what slices hold ends the wait at once (a loaded machine made 0.2 s too short for that).
    book_a, in_flight, budget, outcome, waited, listener = recall._run(acme, delay=1.0)
    # then: the owner heard the budget change through the pooler's commit, gave its unused part
    # back, and the request was admitted after it
    assert {"org": acme.org.id, "column": "api_key_id", "value": acme.key.id} in [json.loads(p) for p in listener.heard]
    assert not isinstance(outcome, BudgetExceeded), (outcome, f"waited {waited:.2f} s")
    assert waited < slices.RECALL_WAIT_SECONDS + 0.5
    recall._finish(book_a, in_flight, extra=[outcome])
    assert not Reservation.objects.exists()
    assert audit_counters(record=False).ok


@pytest.mark.usefixtures("slices_on")
def test_a_listen_through_the_pooler_hears_nothing_and_the_request_is_refused(pgbouncer, acme, settings, monkeypatch):
    # given: the LISTEN connection made like every other one, through the transaction pooler
    settings.CAPGATE = {**settings.CAPGATE, "LISTEN_DATABASE": None}
    monkeypatch.setattr(slices, "RECALL_WAIT_SECONDS", 1.0)
    # when
    book_a, in_flight, _budget, outcome, waited, listener = recall._run(acme, delay=0.0)
    # then: the server connection that ran LISTEN went back to the pool, the notification went
    # nowhere, and the request waited out its bound and was refused with room left
    assert listener.heard == []
    assert isinstance(outcome, BudgetExceeded) and outcome.code == "key_budget"
    assert waited >= slices.RECALL_WAIT_SECONDS
    recall._finish(book_a, in_flight)
    assert not Reservation.objects.exists()


@pytest.fixture(params=[True, False], ids=["slices-on", "slices-off"])
def gateway_slices(request, settings, monkeypatch):
    """The live gateway's headroom slices on (as in production) and off, with a fresh book."""
    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": request.param, "SLICE_MIN_REQUESTS": 2}
    return request.param


def test_capcheck_holds_at_200_through_pgbouncer(pgbouncer, gateway_slices, gateway):
    # given: the live gateway, its database threads connected through the pooler
    before = pgbouncer.transactions()
    out = StringIO()
    # when: 200 concurrent requests against $1 caps (capcheck's basic scenario)
    try:
        call_command(
            "capcheck", "--url", gateway.url, "--scenario", "basic", "--concurrency", "200",
            "--settle-timeout", "30", "--timeout", "60", stdout=out,
        )  # fmt: skip
    except CommandError as exc:
        pytest.fail(f"{exc}\n{out.getvalue()}")
    # then: the four properties hold, nothing is left held, and the pooler carried the traffic
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out.getvalue(), out.getvalue()
    assert not Reservation.objects.exists()
    assert not UsageRecord.objects.filter(applied=False).exists()
    assert _carried(pgbouncer, before, 200) >= 200
    # the records' group commit was sent from the event loop through the pooler, unprepared
    # (gateway/upstream/loopdb.py), and never fell back to the threads
    params = loopdb.connection_params()
    assert (params["port"], params["prepare_threshold"]) == (pgbouncer.port, None)
    db = gateway.recorder().loop_db
    assert db.statements > 0 and db.failures == 0
