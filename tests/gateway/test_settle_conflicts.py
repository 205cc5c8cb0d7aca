"""Concurrent settles of one reservation at different costs (POST /v1/reservations/{id}/settle):
the first is final, every other is answered 409 `reservation_settle_conflict` and kept once on the
record, and `manage.py audit` stays clean however often it runs — a client's retries cannot keep
the deployment's audit red. Without the guard the losers are told 200 and the audit reports the
request as drift on every run."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.core.management import CommandError, call_command

from gateway.admission import reservations
from ledger.models import Hold, Reservation, UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
# Settles run on the gateway's settle lane (gateway/upstream/runtime.py SETTLE_THREADS, 4, one of them
# shared with the background drain): three can be in it at once.
N = 3
COSTS = [f"0.0{i + 1}" for i in range(N)]  # $0.01 .. $0.03: every settle reports another cost


def _reserve(gateway) -> str:
    r = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "0.40"}, headers=AUTH, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _settle(gateway, rid: str, cost: str) -> httpx.Response:
    return httpx.post(gateway.url + f"/v1/reservations/{rid}/settle", json={"cost_usd": cost}, headers=AUTH, timeout=30)


@pytest.fixture
def racing(monkeypatch):
    """The exact interleaving of a race: every settle has looked up the reservation (and found it
    not settled yet) before any of them records, as clients retrying at once do."""
    barrier = threading.Barrier(N, timeout=20)
    find = reservations._find

    def find_then_wait(caller, reservation_id):
        found = find(caller, reservation_id)
        barrier.wait()
        return found

    monkeypatch.setattr(reservations, "_find", find_then_wait)
    return find  # the lookup without the wait, for what follows the race


def _concurrent_settles(gateway, rid: str) -> list[httpx.Response]:
    barrier = threading.Barrier(N)

    def attempt(cost: str) -> httpx.Response:
        barrier.wait()
        return _settle(gateway, rid, cost)

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(attempt, COSTS))


def _audit() -> str:
    from io import StringIO

    out = StringIO()
    call_command("audit", stdout=out)
    return out.getvalue()


def test_concurrent_settles_keep_the_first_answer_the_rest_409_and_the_audit_stays_clean(
    gateway, wired, slices_mode, racing, monkeypatch
):
    # given: a reservation under a $1 cap
    budget = wired.budget(amount="1")
    rid = _reserve(gateway)
    # when: three settles at three costs, released together
    answers = _concurrent_settles(gateway, rid)
    wait_settled()
    # then: one settle won; every other was told it conflicts
    won = [(cost, r) for cost, r in zip(COSTS, answers, strict=True) if r.status_code == 200]
    assert len(won) == 1, [r.text for r in answers]
    cost, winner = won[0]
    lost = [r for r in answers if r.status_code != 200]
    assert {(r.status_code, r.json()["error"]["code"]) for r in lost} == {(409, "reservation_settle_conflict")}
    # one record, at the winner's cost, applied to the window; the conflict kept once, never applied
    [rec] = UsageRecord.objects.all()
    assert rec.cost_nano == winner.json()["cost_nano"] == int(cost[2:]) * 10_000_000
    assert rec.conflicting_cost_nano is not None and rec.conflicting_cost_nano != rec.cost_nano
    assert rec.reported_cost_nano == rec.cost_nano
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (rec.cost_nano, 0)
    assert not Reservation.objects.exists() and not Hold.objects.exists()
    # and the audit is clean, run after run
    for _ in range(2):
        assert "0 requests off their reported cost" in _audit()
    # a retry of the winning settle is still its answer; any other cost still conflicts, once
    kept = rec.conflicting_cost_nano
    monkeypatch.setattr(reservations, "_find", racing)
    assert _settle(gateway, rid, cost).json()["cost_nano"] == rec.cost_nano
    again = _settle(gateway, rid, "0.5")
    assert again.status_code == 409 and again.json()["error"]["code"] == "reservation_settle_conflict"
    rec.refresh_from_db()
    assert (rec.cost_nano, rec.conflicting_cost_nano) == (winner.json()["cost_nano"], kept)
    assert "0 requests off their reported cost" in _audit()


def test_without_the_guard_the_losers_hear_200_and_the_audit_fails_every_run(
    gateway, wired, slices_mode, racing, monkeypatch
):
    # given: the guard removed
    monkeypatch.setattr(reservations.GUARDS, "record_conflicts_apart", False)
    wired.budget(amount="1")
    rid = _reserve(gateway)
    # when
    answers = _concurrent_settles(gateway, rid)
    wait_settled()
    # then: every caller is told 200, most at a cost that is not theirs, and the audit is red forever
    assert all(r.status_code == 200 for r in answers)
    assert len({r.json()["cost_nano"] for r in answers}) == 1
    for _ in range(2):
        with pytest.raises(CommandError, match="1 requests recorded at other than their reported cost"):
            _audit()
