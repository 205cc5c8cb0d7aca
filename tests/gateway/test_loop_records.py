"""Usage records sent from the event loop on its own connection (gateway/upstream/loopdb.py),
through the live gateway: the same record a settle thread writes, and, when that connection
fails, the batch written on a thread, so no response goes without its record (property 3) and
no record is written twice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from django.db import connection

from gateway.upstream import loopdb
from ledger.models import Reservation, UsageRecord
from tenants.models import EndCustomer
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

BODY = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
# Set by the request or the moment it was written, so different between any two records.
_PER_REQUEST = {
    "id",
    "request_id",
    "reservation_id",
    "admitted_at",
    "created_at",
    "latency_ms",
    "applied_at",
    "slice_id",
}


def _chat(gateway) -> str:
    r = httpx.post(gateway.url + "/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.headers["x-capgate-request-id"]


def _record(request_id: str) -> dict:
    row = UsageRecord.objects.values().get(request_id=request_id)
    return {name: value for name, value in row.items() if name not in _PER_REQUEST}


def test_a_record_sent_from_the_loop_is_the_one_a_thread_writes(gateway, wired, settings, slices_mode):
    # given: a cap (with slices on, each request is carved from its slice by the record's statement)
    budget = wired.budget(amount="100")
    # when: one request recorded from the loop, one with the loop's connection turned off
    on_loop = _chat(gateway)
    statements = gateway.recorder().loop_db.statements
    settings.CAPGATE = {**settings.CAPGATE, "LOOP_RECORDS": False}
    on_thread = _chat(gateway)
    # then: the first went through the loop's connection and the second did not
    assert statements == 1 and gateway.recorder().loop_db.statements == 1
    # and, once drained, the two records are alike in every column a request does not make its own
    wait_settled()
    assert _record(on_loop) == _record(on_thread)
    records = list(UsageRecord.objects.all())
    assert len(records) == 2 and all(r.applied for r in records)
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (sum(r.cost_nano for r in records), 0)


def _drop_loop_connection() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [loopdb.APPLICATION_NAME],
        )
        assert cursor.fetchall() == [(True,)]


def test_a_dropped_loop_connection_loses_no_record_and_comes_back(gateway, wired, monkeypatch, slices_mode):
    # given: a cap, and the loop's connection open after a first request
    monkeypatch.setattr(loopdb, "RETRY_SECONDS", 0.3)
    budget = wired.budget(amount="100")
    ids = [_chat(gateway)]
    db = gateway.recorder().loop_db
    assert (db.statements, db.failures) == (1, 0)
    # when: the database drops that connection (as a restart or an idle timeout would)
    _drop_loop_connection()
    ids.append(_chat(gateway))
    # then: the request was answered and its batch written on a thread
    assert (db.statements, db.failures) == (1, 1)
    # while the connection rests, records go to the threads without trying it
    ids.append(_chat(gateway))
    assert (db.statements, db.failures) == (1, 1)
    # after the rest, a new connection takes the statement again
    time.sleep(0.4)
    ids.append(_chat(gateway))
    assert (db.statements, db.failures) == (2, 1)
    # and every request has exactly one record, all of them charged to the cap
    wait_settled()
    records = list(UsageRecord.objects.all())
    assert sorted(str(r.request_id) for r in records) == sorted(ids)
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (sum(r.cost_nano for r in records), 0)


def test_a_record_the_database_refuses_on_the_loop_is_written_on_a_thread_and_the_loop_stays(gateway, wired):
    # given: a request in flight for an end customer, the loop's connection open from a first request
    budget = wired.budget(amount="100")
    first = _chat(gateway)
    db = gateway.recorder().loop_db
    wired.echo.options = {"delay_ms": 1000}
    wired.echo.save()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            httpx.post,
            gateway.url + "/v1/chat/completions",
            json=BODY,
            headers={"authorization": f"Bearer {KEY}", "x-capgate-customer": "cust-gone"},
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while not Reservation.objects.filter(end_customer__external_id="cust-gone").exists():
            assert time.monotonic() < deadline, "the request never got in flight"
            time.sleep(0.02)
        # when: the customer is deleted in flight, so the loop's statement breaks a foreign key
        customer_id = EndCustomer.objects.get(external_id="cust-gone").pk
        EndCustomer.objects.filter(pk=customer_id).delete()
        answer = future.result()
    # then: answered, and recorded on a thread with the customer detached (its id kept)
    assert answer.status_code == 200, answer.text
    gone = UsageRecord.objects.get(request_id=answer.headers["x-capgate-request-id"])
    assert gone.end_customer_id is None and gone.subject["end_customer"]["id"] == customer_id
    # the connection was fine: not closed and not resting, so the next record is sent on it
    assert db.failures == 0 and db.enabled
    wired.echo.options = {}
    wired.echo.save()
    _chat(gateway)
    assert db.statements == 2
    wait_settled()
    assert UsageRecord.objects.count() == 3 and UsageRecord.objects.filter(request_id=first).exists()
    assert window_of(budget).spent_nano == sum(r.cost_nano for r in UsageRecord.objects.all())


def _loop_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            [loopdb.APPLICATION_NAME],
        )
        return cursor.fetchone()[0]


def test_the_loop_connection_is_closed_when_the_gateway_stops(gateway, wired):
    # given: the loop's connection open after a request
    wired.budget(amount="100")
    _chat(gateway)
    assert _loop_backends() == 1
    # when: the gateway shuts down (its lifespan's shutdown)
    gateway.server.should_exit = True
    gateway.thread.join(timeout=15)
    # then: its session is gone, so nothing holds the database open after the process
    deadline = time.monotonic() + 5
    while _loop_backends() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _loop_backends() == 0


def test_a_record_in_flight_at_shutdown_is_written_before_the_connection_closes(gateway, wired, monkeypatch):
    # given: the loop's statement slowed past uvicorn's graceful shutdown (2 s in these tests), so
    # the request is cancelled at shutdown while its record is being written
    wired.budget(amount="100")
    _chat(gateway)
    real = loopdb.LoopConnection.fetchone

    async def slow(self, sql, params):
        await asyncio.sleep(3)
        return await real(self, sql, params)

    monkeypatch.setattr(loopdb.LoopConnection, "fetchone", slow)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            httpx.post,
            gateway.url + "/v1/chat/completions",
            json=BODY,
            headers={"authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while UsageRecord.objects.count() < 1 or not Reservation.objects.exists():
            assert time.monotonic() < deadline, "the second request never got in flight"
            time.sleep(0.02)
        time.sleep(0.5)  # its upstream call answered: its record is in the slowed statement
        # when: the gateway shuts down meanwhile
        gateway.server.should_exit = True
        gateway.thread.join(timeout=30)
        assert not gateway.thread.is_alive()
        with contextlib.suppress(httpx.HTTPError):
            pending.result()
    # then: both requests have their records, and the loop's session is gone
    assert UsageRecord.objects.count() == 2
    assert _loop_backends() == 0
