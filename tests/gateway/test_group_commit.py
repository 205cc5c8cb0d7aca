"""Group commit of usage records through the live gateway (issue 12 §2, gateway/upstream/recorder.py):
requests finishing while a record write is in flight share the next INSERT, and each response
still waits until its own record is committed (property 3: nothing served without a row)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from django.db import connection

from gateway.upstream import recorder as recorder_module
from ledger.models import UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

BODY = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def test_concurrent_responses_share_inserts_and_each_waits_for_its_own_record(gateway, wired, monkeypatch):
    # given: a cap, and record writes widened to 0.3 s so responses finishing meanwhile queue
    budget = wired.budget(amount="100")
    real = recorder_module.record_many
    batches: list[int] = []

    def slow(*, items):
        time.sleep(0.3)
        batches.append(len(items))
        return real(items=items)

    monkeypatch.setattr(recorder_module, "record_many", slow)
    n = 12
    barrier = threading.Barrier(n)

    def one(_i: int) -> tuple[int, bool]:
        try:
            barrier.wait()
            r = httpx.post(
                gateway.url + "/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {KEY}"}, timeout=60
            )
            # read at once, on this thread's own connection: the record must already exist
            there = UsageRecord.objects.filter(request_id=r.headers["x-capgate-request-id"]).exists()
            return r.status_code, there
        finally:
            connection.close()

    # when: n requests released together
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(one, range(n)))
    # then: all served, each with its record in place before its response arrived
    assert answers == [(200, True)] * n
    assert sum(batches) == n and len(batches) < n  # fewer INSERTs than records
    wait_settled()
    records = list(UsageRecord.objects.all())
    assert len(records) == n and {r.status for r in records} == {"served"}
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (sum(r.cost_nano for r in records), 0)
