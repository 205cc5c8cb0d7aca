"""Headroom slices through the live gateway (ledger/slices.py): a burst on one hot ceiling is
admitted largely from the process's slices, and the four properties hold, read from the database;
without the slice's own check the same burst overspends the cap."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection

from alerts.audit import audit_counters
from ledger import slices
from ledger.models import Reservation, UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

BODY = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
N = 60


@pytest.fixture
def sliced(settings, monkeypatch):
    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {
        **settings.CAPGATE,
        "SLICES": True,
        "SLICE_SHARE": 0.5,
        "SLICE_MIN_REQUESTS": 2,
        "SLICE_MAX_REQUESTS": 20,
        "SLICE_SECONDS": 0.5,
    }
    return slices.book


def _post(url: str, i: int = 0, *, mixed: bool = False) -> httpx.Response:
    """A chat call; `mixed`: every third fails upstream after admission, every fourth streams."""
    headers = {"authorization": f"Bearer {KEY}"}
    body = dict(BODY)
    if mixed and i % 3 == 1:
        headers["x-capgate-echo-fail"] = "500"
    if mixed and i % 4 == 2:
        body["stream"] = True
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def _burst(gateway, wired, calls: int, *, mixed: bool = False):
    """A cap worth `calls` worst cases (echo bills every output token it was allowed, 200 ms
    each), one request to learn the worst case, then N requests released together."""
    wired.echo.options = {**wired.echo.options, "completion_tokens": 200, "delay_ms": 200}
    wired.echo.save()
    budget = wired.budget(amount="100")
    first = _post(gateway.url)
    assert first.status_code == 200
    wait_settled()
    worst = UsageRecord.objects.get().reserved_nano
    spent_before = window_of(budget).spent_nano
    budget.amount_nano = spent_before + calls * worst
    budget.save()
    barrier = threading.Barrier(N)

    def one(_i: int) -> tuple[int, str]:
        try:
            barrier.wait()
            r = _post(gateway.url, _i, mixed=mixed)
            return r.status_code, r.headers.get("x-capgate-request-id", "")
        finally:
            connection.close()

    with ThreadPoolExecutor(N) as pool:
        answers = list(pool.map(one, range(N)))
    return budget, worst, answers


def _settled_without_slices(timeout: float = 10.0) -> None:
    # Slices retire after SLICE_SECONDS and give their unused part back: then nothing is held.
    deadline = time.monotonic() + timeout
    while Reservation.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_settled()


def test_a_burst_on_one_ceiling_is_admitted_from_slices_and_the_cap_holds(gateway, wired, sliced):
    budget, worst, answers = _burst(gateway, wired, calls=15)
    _settled_without_slices()
    served = [rid for status, rid in answers if status == 200]
    # property 2: each request served or refused with a code naming the ceiling
    assert {status for status, _ in answers} <= {200, 402}
    assert served and len(served) < N
    # property 3: every served request has its usage row
    assert UsageRecord.objects.filter(request_id__in=served, status="served").count() == len(served)
    # property 1: recorded spend within the cap (echo never bills above the worst case)
    w = window_of(budget)
    assert w.spent_nano <= budget.amount_nano
    assert w.spent_nano == sum(UsageRecord.objects.values_list("cost_nano", flat=True))
    # property 4: nothing left behind, slices included
    assert w.reserved_nano == 0 and not Reservation.objects.exists()
    assert audit_counters(record=False).ok
    # and the burst went through slices, not one admission statement per request (none would
    # without them). Each slice takes half of what is left (SLICE_SHARE), so of 15 worst cases at
    # most about 7 + 4 + 2 + 1 are sliced, and requests arriving while a slice is being taken are
    # admitted by statement: quiet runs slice 10 of 15-16, a CI run beside the second lane 8 of 16.
    assert sliced.admitted_from_slices >= len(served) // 3


def test_failures_and_streams_from_slices_each_get_their_row_and_nothing_is_left_held(gateway, wired, sliced):
    budget, worst, answers = _burst(gateway, wired, calls=25, mixed=True)
    _settled_without_slices()
    by_request = {r.request_id: r for r in UsageRecord.objects.all()}
    # property 2: served, refused before the call, or failed upstream with its own row
    # (503: the echo connection sat out its cooldown after failing, so nothing was sent)
    for status, rid in answers:
        assert status in {200, 402, 502, 503}, status
        if status == 200:
            assert by_request[rid].status == "served"
        elif status == 502:
            assert by_request[rid].status == "failed_upstream" and by_request[rid].cost_nano == 0
        else:
            assert rid not in by_request
    assert any(status == 502 for status, _ in answers)
    w = window_of(budget)
    assert w.spent_nano <= budget.amount_nano
    assert w.reserved_nano == 0 and not Reservation.objects.exists()
    assert audit_counters(record=False).ok
    assert sliced.admitted_from_slices > 0


def test_without_the_slice_check_the_same_burst_overspends_the_cap(gateway, wired, sliced, monkeypatch):
    monkeypatch.setattr(slices.GUARDS, "check_available", False)
    budget, worst, answers = _burst(gateway, wired, calls=15)
    deadline = time.monotonic() + 10  # the drain applies what was recorded
    while UsageRecord.objects.filter(applied=False).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    served = [rid for status, rid in answers if status == 200]
    records = UsageRecord.objects.filter(request_id__in=served, status="served")
    spent = window_of(budget).spent_nano
    # then: the checks of the test above fail: the slice handed out more than it held. Either
    # spend passed the cap, or the overdrawn requests escaped the window: served without a row
    # (the carve's CHECK constraint refused it) or with a row that charged nothing (the slice was
    # already carved to zero and gone)
    assert len(served) > 15
    assert (
        spent > budget.amount_nano
        or records.count() < len(served)
        or spent < sum(UsageRecord.objects.values_list("cost_nano", flat=True))
    )
