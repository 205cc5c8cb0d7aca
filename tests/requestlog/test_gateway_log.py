"""Every gateway request gets one row in the request log, under its request id — refusals
included, written off the admission path."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from django.db import connection, connections

from ledger.models import Reservation, UsageRecord
from ratelimits import services as ratelimit_services
from ratelimits.models import RateLimit
from requestlog import buffer
from requestlog.models import Refusal, RequestLogEntry
from tenants.models import EndCustomer
from tests.concurrency import race
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}


def chat(max_tokens: int = 100) -> dict:
    return {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


@pytest.fixture(autouse=True)
def empty_buffer():
    buffer.refusals.take()
    ratelimit_services._limiters = None
    yield
    buffer.refusals.take()
    ratelimit_services._limiters = None


def wait_logged(request_ids: list[str], timeout: float = 10.0) -> dict[str, RequestLogEntry]:
    """The log's rows for these ids, once every one is there (refusals arrive within a flush)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r.request_id: r for r in RequestLogEntry.objects.filter(request_id__in=request_ids)}
        if len(rows) == len(set(request_ids)) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_served_refused_and_rate_limited_requests_each_get_their_row(gateway, wired):
    # given: a $0.01 cap (room for one 100-token call, worst ~$0.0078) and 3 requests a minute
    budget = wired.budget(amount="0.01")
    RateLimit.objects.create(organization=wired.org, scope="key", api_key=wired.key, name="rpm", requests_per_minute=3)
    headers = {**AUTH, "x-capgate-customer": "acme-c1", "x-capgate-run": "run-7"}
    # when
    served = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=headers, timeout=30)
    wait_settled()
    refused = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=headers, timeout=30)
    refused_again = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=headers, timeout=30)
    limited = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=headers, timeout=30)
    # then
    assert [r.status_code for r in (served, refused, refused_again, limited)] == [200, 402, 402, 429]
    ids = [r.headers["x-capgate-request-id"] for r in (served, refused, refused_again, limited)]
    rows = wait_logged(ids)
    assert [rows[i].status for i in ids] == ["served", "refused", "refused", "rate_limited"]
    row = rows[ids[1]]
    assert (row.code, row.http_status, row.budget_id) == ("organization_budget", 402, budget.id)
    assert refused.headers["x-capgate-budget-code"] == row.code
    assert row.reserved_nano == rows[ids[0]].reserved_nano > 0  # the same worst case, refused this time
    assert row.cost_nano == 0 and row.latency_ms is not None
    assert (row.api_key_id, row.project_id, row.organization_id) == (wired.key.id, wired.project.id, wired.org.id)
    assert row.end_customer is not None and row.end_customer.external_id == "acme-c1"
    assert (row.run_id, row.model) == ("run-7", "echo-1")
    assert (rows[ids[3]].code, rows[ids[3]].http_status) == (limited.json()["error"]["code"], 429)
    # and nothing about money changed: refusals left no usage record and no reservation
    assert UsageRecord.objects.count() == 1 and not Reservation.objects.exists()


def test_every_request_of_a_concurrent_burst_at_a_cap_has_exactly_one_row(gateway, wired):
    # given: room for a few calls at a $0.025 cap
    budget = wired.budget(amount="0.025")

    # when: 24 at once, released by a barrier
    def call(_: int) -> httpx.Response:
        return httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=60)

    responses = race(24, call)
    wait_settled()
    # then: each request id is in the log once, with the status its response said
    ids = [r.headers["x-capgate-request-id"] for r in responses]
    rows = wait_logged(ids)
    assert len(set(ids)) == 24 and len(rows) == 24
    assert RequestLogEntry.objects.filter(organization=wired.org).count() == 24
    expected = {200: "served", 402: "refused"}
    assert sorted(expected[r.status_code] for r in responses) == sorted(rows[i].status for i in ids)
    served = [rows[i] for i in ids if rows[i].status == "served"]
    # (holds return as calls settle, so later calls can be admitted into freed room: what the cap
    # bounds is the recorded cost, not the sum of every hold ever made)
    assert served and sum(r.cost_nano for r in served) <= budget.amount_nano
    assert Refusal.objects.filter(code="organization_budget").count() == 24 - len(served)


def test_an_admitted_request_that_fails_upstream_is_logged_once(gateway, wired, monkeypatch):
    # given: an admitted call whose only connection answers 500 (failed_upstream, then a 502)
    wired.budget(amount="1")
    headers = {**AUTH, "x-capgate-echo-fail": "500"}
    # when
    r = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=headers, timeout=30)
    wait_settled()
    time.sleep(buffer_flush_seconds() * 2)
    # then: its usage record is its row; no refusal row besides it
    request_id = r.headers["x-capgate-request-id"]
    assert r.status_code == 502
    assert [e.status for e in RequestLogEntry.objects.filter(request_id=request_id)] == ["failed_upstream"]


def test_guard_removed_an_admitted_failure_would_be_logged_twice(gateway, wired, monkeypatch):
    # given: the guard that skips admitted calls, removed
    monkeypatch.setattr(buffer.GUARDS, "skip_admitted", False)
    wired.budget(amount="1")
    # when
    r = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat(), headers={**AUTH, "x-capgate-echo-fail": "500"}, timeout=30
    )
    wait_settled()
    request_id = r.headers["x-capgate-request-id"]
    deadline = time.monotonic() + 10
    while not Refusal.objects.filter(request_id=request_id).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # then: the same request twice in the log
    assert sorted(e.status for e in RequestLogEntry.objects.filter(request_id=request_id)) == [
        "failed_upstream",
        "rejected",
    ]


def buffer_flush_seconds() -> float:
    from django.conf import settings

    return settings.CAPGATE["REQUEST_LOG_FLUSH_SECONDS"]


def test_a_refusal_is_answered_while_the_log_table_is_locked(gateway, wired):
    """The refusal's row is not written by the admission: with the log's table locked by
    another transaction, the 402 still comes back at once, and the row follows the lock."""
    # given: a cap with no room, and the refusal table locked
    wired.budget(amount="0.000001")
    locker = connections.create_connection("default")
    locker.set_autocommit(False)
    with locker.cursor() as cursor:
        cursor.execute("LOCK TABLE requestlog_refusal IN ACCESS EXCLUSIVE MODE")
    try:
        # when
        started = time.monotonic()
        r = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=10)
        answered_in = time.monotonic() - started
        # then: answered without waiting on the table
        assert r.status_code == 402 and answered_in < 2
    finally:
        locker.rollback()
        locker.close()
    rows = wait_logged([r.headers["x-capgate-request-id"]])
    assert [e.status for e in rows.values()] == ["refused"]


def test_an_unknown_key_is_not_logged_and_a_revoked_key_is(gateway, wired):
    from django.utils import timezone

    other = wired.add_key("old")
    from tenants.models import ApiKey, hash_key

    ApiKey.objects.filter(pk=other.pk).update(key_hash=hash_key("cg_revoked_key_0000"), revoked_at=timezone.now())
    # when
    bad = httpx.post(gateway.url + "/v1/chat/completions", json=chat(), headers={"authorization": "Bearer nope"})
    revoked = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat(), headers={"authorization": "Bearer cg_revoked_key_0000"}
    )
    # then
    assert (bad.status_code, revoked.status_code) == (401, 401)
    rows = wait_logged([revoked.headers["x-capgate-request-id"]])
    row = rows[revoked.headers["x-capgate-request-id"]]
    assert (row.status, row.code, row.api_key_id) == ("rejected", "revoked_api_key", other.id)
    assert not RequestLogEntry.objects.filter(request_id=bad.headers["x-capgate-request-id"]).exists()


def test_the_buffer_is_bounded_and_counts_what_it_drops(settings):
    # given: room for 3 refusals in memory
    settings.CAPGATE = {**settings.CAPGATE, "REQUEST_LOG_BUFFER": 3}
    b = buffer.Buffer()

    def pending(i: int) -> buffer.Pending:
        return buffer.Pending(
            request_id=f"r{i}",
            key_hash="h",
            customer="",
            run_id="",
            model="m",
            endpoint="chat",
            status="refused",
            code="c",
            http_status=402,
            budget_id=None,
            reserved_nano=0,
            latency_ms=1,
            message="",
        )

    # when: 5 noted, then a failed write's batch comes back while 2 newer wait
    for i in range(5):
        b.add(pending(i))
    taken = b.take()
    b.add(pending(5))
    b.add(pending(6))
    b.put_back(taken)
    # then: never more than 3 held; the rest counted
    assert len(b) == 3 and b.dropped == 2 + 2
    assert [p.request_id for p in b.take()] == ["r0", "r5", "r6"]


def test_concurrent_notes_and_takes_lose_nothing_under_the_bound():
    b = buffer.Buffer()
    seen: list[str] = []
    done = threading.Event()

    def taker() -> None:
        while not done.is_set():
            seen.extend(p.request_id for p in b.take())
        seen.extend(p.request_id for p in b.take())

    t = threading.Thread(target=taker)
    t.start()
    for i in range(2000):
        b.add(
            buffer.Pending(
                request_id=f"r{i}",
                key_hash="h",
                customer="",
                run_id="",
                model="m",
                endpoint="chat",
                status="refused",
                code="c",
                http_status=402,
                budget_id=None,
                reserved_nano=0,
                latency_ms=1,
                message="",
            )
        )
    done.set()
    t.join()
    assert sorted(seen) == sorted(f"r{i}" for i in range(2000)) and b.dropped == 0
    connection.close()


def test_reservation_api_refusals_are_logged_off_the_admission_path(gateway, wired):
    """POST /v1/reservations: a 402 and a 400 get their rows under the id the answer names,
    written by the batch (with the log's table locked, the 402 still comes back at once); an
    admitted reservation is not noted (its usage record will be its row)."""
    # given: a $0.10 cap, and the refusal table locked by another transaction
    budget = wired.budget(amount="0.10")
    headers = {**AUTH, "x-capgate-customer": "acme-c1", "x-capgate-run": "job-3"}
    locker = connections.create_connection("default")
    locker.set_autocommit(False)
    with locker.cursor() as cursor:
        cursor.execute("LOCK TABLE requestlog_refusal IN ACCESS EXCLUSIVE MODE")
    try:
        # when: one over the cap, one malformed, one that fits
        started = time.monotonic()
        refused = httpx.post(
            gateway.url + "/v1/reservations",
            headers=headers,
            timeout=10,
            json={"model": "echo-1", "amount_usd": "0.20", "request_id": "job-3-a"},
        )
        answered_in = time.monotonic() - started
        bad = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "lots"}, headers=AUTH, timeout=10)
        admitted = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "0.01"}, headers=AUTH, timeout=10)
        # then: answered without waiting on the table
        assert (refused.status_code, bad.status_code, admitted.status_code) == (402, 400, 201)
        assert answered_in < 2
    finally:
        locker.rollback()
        locker.close()
    ids = [refused.headers["x-capgate-request-id"], bad.headers["x-capgate-request-id"]]
    rows = wait_logged(ids)
    row = rows[ids[0]]
    assert (row.status, row.code, row.http_status, row.budget_id) == ("refused", "organization_budget", 402, budget.id)
    assert row.reserved_nano == 200_000_000 and row.model == "echo-1" and row.run_id == "job-3"
    # a refused first call creates no end customer (refused means nothing written): none to name
    assert (row.api_key_id, row.end_customer) == (wired.key.id, None)
    assert not EndCustomer.objects.filter(external_id="acme-c1").exists()
    assert (rows[ids[1]].status, rows[ids[1]].code, rows[ids[1]].http_status) == ("rejected", "invalid_request", 400)
    assert Refusal.objects.get(request_id=ids[0]).endpoint == "reservations"
    time.sleep(buffer_flush_seconds() * 2)
    assert Refusal.objects.count() == 2  # the admitted reservation was not noted
