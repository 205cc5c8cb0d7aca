"""capcheck's load and watch: every request sent at once (each on its own connection, one event
loop), a sampler thread keeping each blocking window's highest spent + reserved, and the wait
for the outbox to drain."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import httpx
from django.db import DatabaseError, connection

from capcheck.plan import Plan, Sent, Setup
from capcheck.scenario import CUSTOMER
from ledger.models import Budget, Reservation, UsageRecord, Window


def fire(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    """Send every request at once, each on its own connection; fills in what each was told."""
    quiet = logging.getLogger("httpx")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # not a line per request
    try:
        asyncio.run(_fire(setup, plan, sent))
    finally:
        quiet.setLevel(level)


async def _fire(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    limits = httpx.Limits(max_connections=len(sent), max_keepalive_connections=0)
    bodies = {s: setup.body(stream=s) for s in (False, True)}
    start = asyncio.Event()
    async with httpx.AsyncClient(base_url=plan.url, limits=limits, timeout=plan.request_timeout) as client:
        tasks = [
            asyncio.create_task(_one(client, setup, s, bodies[s.mode in ("stream", "disconnect")], start)) for s in sent
        ]
        await asyncio.sleep(0)  # every task waits at the start line
        start.set()
        await asyncio.gather(*tasks)


async def _one(client: httpx.AsyncClient, setup: Setup, s: Sent, body: dict, start: asyncio.Event) -> None:
    headers = {"authorization": f"Bearer {setup.keys[s.key]}", **setup.headers}
    if s.mode == "fault":
        headers[setup.fault_header[0]] = setup.fault_header[1]
    elif s.mode == "customer":
        headers["x-capgate-customer"] = CUSTOMER
    await start.wait()
    began = time.perf_counter()
    try:
        async with client.stream("POST", setup.path, json=body, headers=headers) as resp:
            s.status = resp.status_code
            s.request_id = resp.headers.get("x-capgate-request-id", "")
            if resp.status_code != 200:
                s.code = _error_code(await resp.aread())
            elif s.mode == "disconnect":
                async for _ in resp.aiter_raw():
                    break  # leaving the block closes the connection mid-stream
            else:
                data = await resp.aread()
                if s.mode == "stream" and b"[DONE]" not in data and b"message_stop" not in data:
                    s.error = "stream ended without its last event ([DONE] or message_stop)"
    except httpx.HTTPError as exc:
        s.error = f"{type(exc).__name__}: {exc}"[:300]
    s.latency_s = time.perf_counter() - began


def _error_code(raw: bytes) -> str:
    try:
        return str((json.loads(raw).get("error") or {}).get("code") or "")
    except (ValueError, AttributeError):
        return ""


class Sampler(threading.Thread):
    """Reads the organization's blocking windows every `interval`, keeping each one's highest
    committed amount (spent + reserved): admission promises it never passes the cap."""

    def __init__(self, organization_id: int, interval: float):
        super().__init__(name="capcheck-sampler", daemon=True)
        self.organization_id = organization_id
        self.interval = interval
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        windows = Window.objects.filter(budget__organization_id=self.organization_id, budget__mode=Budget.Mode.BLOCK)
        try:
            while not self._halt.is_set():
                try:
                    for wid, spent, reserved in windows.values_list("id", "spent_nano", "reserved_nano"):
                        self.peaks[wid] = max(self.peaks.get(wid, 0), spent + reserved)
                    self.samples += 1
                except Exception:  # a sampler must not end the run; the count is reported
                    self.errors += 1
                    connection.close()
                self._halt.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> dict[int, int]:
        self._halt.set()
        self.join(timeout=30)
        return self.peaks


def wait_settled(*, organization_id: int, timeout: float) -> float | None:
    """Seconds until the organization's outbox is empty and no reservation is left; None if
    that did not happen within `timeout`."""
    began = time.monotonic()
    while True:
        try:
            busy = (
                UsageRecord.objects.filter(organization_id=organization_id, applied=False).exists()
                or Reservation.objects.filter(organization_id=organization_id).exists()
            )
        except DatabaseError:  # this connection died with a database restart (db-restart): again
            connection.close()
            busy = True
        elapsed = time.monotonic() - began
        if not busy:
            return elapsed
        if elapsed > timeout:
            return None
        time.sleep(0.1)
