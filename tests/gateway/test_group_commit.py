"""Group commit of usage records through the live gateway (issue 12 §2, gateway/upstream/recorder.py):
requests finishing while a record write is in flight share the next INSERT, and each response
still waits until its own record is committed (property 3: nothing served without a row). Both
ways a batch is written: its statement sent from the event loop (gateway/upstream/loopdb.py), or
on a settle thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection

from gateway.upstream import recorder as recorder_module
from ledger.models import UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled

BODY = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


@pytest.mark.parametrize("from_loop", [True, False], ids=["loop", "thread"])
def test_concurrent_responses_share_inserts_and_each_waits_for_its_own_record(
    gateway, wired, monkeypatch, settings, from_loop
):
    # given: a cap, and record writes widened to 0.3 s so responses finishing meanwhile queue
    settings.CAPGATE = {**settings.CAPGATE, "LOOP_RECORDS": from_loop}
    budget = wired.budget(amount="100")
    real = recorder_module.Recorder._write_batch
    batches: list[int] = []
    writers: set[recorder_module.Recorder] = set()

    async def slow(self, items):
        await asyncio.sleep(0.3)
        batches.append(len(items))
        writers.add(self)
        return await real(self, items)

    monkeypatch.setattr(recorder_module.Recorder, "_write_batch", slow)
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
    (writer,) = writers
    assert writer.loop_db.statements == (len(batches) if from_loop else 0)
    wait_settled()
    records = list(UsageRecord.objects.all())
    assert len(records) == n and {r.status for r in records} == {"served"}
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (sum(r.cost_nano for r in records), 0)
