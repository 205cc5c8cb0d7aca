"""Database outages fail closed at admission and lose nothing after it; the cap holds through
HTTP under a real concurrent burst."""

import asyncio
import socket
import threading
import time

import httpx
import pytest
from django.db import connections

from gateway.upstream import runtime
from ledger import spool
from ledger.models import Reservation, UsageRecord, Window
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


class DatabaseOutage:
    """Points the gateway's database threads at a closed port: their next query fails to
    connect, exactly as when Postgres is down. The test thread keeps its own connection."""

    def __enter__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        self.settings = connections.settings["default"]
        self.port = self.settings["PORT"]
        self.settings["PORT"] = dead
        runtime.close_thread_connections()
        return self

    def __exit__(self, *exc):
        self.settings["PORT"] = self.port
        runtime.close_thread_connections()


def test_admission_fails_closed_when_the_database_is_unreachable(gateway, wired, upstream):
    with DatabaseOutage():
        r = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "budget_unavailable"
    assert upstream.stats()["requests"] == 0  # never sent
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30).status_code == 200


def test_a_response_finishing_during_an_outage_is_spooled_then_lands_once(gateway, wired, upstream, settings, tmp_path):
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": tmp_path}
    budget = wired.budget(amount="1")
    upstream.control(delay_ms=1500, prompt_tokens=10, completion_tokens=10)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
        )
    )
    thread.start()
    deadline = time.monotonic() + 5
    while not Reservation.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # admitted; now the database goes away while the provider answers
    with DatabaseOutage():
        thread.join(timeout=20)
        assert result["r"].status_code == 200  # the client is served
        assert spool.pending(), "the record must be on disk"
        assert not UsageRecord.objects.exists()
    # when the database is back, the gateway replays the spool
    wait_settled(timeout=15)
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("served", 10 * 15_000 + 10 * 75_000)
    assert Window.objects.get(budget=budget).spent_nano == rec.cost_nano
    assert not spool.pending()


def test_200_concurrent_requests_at_a_cap_worth_10_worst_cases_send_exactly_10_upstream(gateway, wired, upstream):
    # given: the worst case of this exact body, learned from one request
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30).status_code == 200
    wait_settled()
    first = UsageRecord.objects.get()
    worst = first.reserved_nano
    # a budget created now starts with the month's recorded spend (the calibration request)
    budget = wired.budget(amount="1")
    budget.amount_nano = first.cost_nano + 10 * worst
    budget.save()
    upstream.reset()
    upstream.control(delay_ms=8000)  # nobody settles before everyone has been admitted or refused

    async def burst():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *[client.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH) for _ in range(200)]
            )

    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    assert codes.count(200) == 10
    assert codes.count(402) == 190
    assert upstream.stats()["requests"] == 10
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 402} == {"organization_budget"}
    wait_settled(timeout=20)
    assert Window.objects.get(budget=budget).spent_nano <= budget.amount_nano
    assert UsageRecord.objects.filter(status="served").count() == 11
