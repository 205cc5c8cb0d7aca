"""Database restarts under steady traffic, for tests/faults/test_restarts.py: a private
PostgreSQL cluster, one or more gateway processes, the fake provider counting what it billed,
beat's renew_and_expire in a thread, and a load generator sending requests at a fixed rate.

A `Run` reads everything back from the database once the books are settled and measures what the
restart cost: 503s after recovery, slices charged at worst case, recorded spend against the
provider's bill. Every server listens on 127.0.0.1; traffic is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
from django.db import connection

import capcheck
from catalog.models import Connection, RouteTarget
from ledger.models import Reservation, UsageRecord, Window
from tests.faults.conftest import PrivatePostgres, wait_until

# Gateways and beat judge liveness on the same short clock, so a 6 s outage is many graces long.
LEASE_SECONDS, HEARTBEAT_SECONDS, GRACE_SECONDS = 2, 1, 3


def gateway_env(*, slices: bool) -> dict[str, str]:
    return {
        "CAPGATE_DB_POOL_TIMEOUT": "2",  # fail closed in 2 s during the outage
        "CAPGATE_DB_POOL_MAX": "20",  # the default: 15 admission threads, each holding a connection
        "CAPGATE_LEASE_SECONDS": str(LEASE_SECONDS),
        "CAPGATE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        "CAPGATE_HEARTBEAT_GRACE_SECONDS": str(GRACE_SECONDS),
        "CAPGATE_SLICES": "true" if slices else "false",
        "CAPGATE_UPSTREAM_ALLOWED_NETWORKS": "127.0.0.0/8",
    }


def beat_settings(settings) -> None:
    settings.CAPGATE = {
        **settings.CAPGATE,
        "LEASE": timedelta(seconds=LEASE_SECONDS),
        "HEARTBEAT_GRACE": timedelta(seconds=GRACE_SECONDS),
    }


@dataclass
class Shot:
    index: int
    sent_at: float  # time.monotonic() when sent
    status: int = 0
    code: str = ""
    request_id: str = ""
    error: str = ""


class Load(threading.Thread):
    """One request every 1/rate s (each on its own connection, none waiting for another) until
    stopped or `limit` were sent."""

    def __init__(self, *, urls: list[str], setup: capcheck.Setup, rate: float, limit: int = 1000):
        super().__init__(name="restart-load", daemon=True)
        self.urls, self.setup, self.rate, self.limit = urls, setup, rate, limit
        self.shots: list[Shot] = []
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        body = self.setup.body(stream=False)
        headers = {"authorization": f"Bearer {self.setup.keys['A']}"}
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            tasks = []
            while not self._halt.is_set() and len(self.shots) < self.limit:
                shot = Shot(index=len(self.shots), sent_at=time.monotonic())
                self.shots.append(shot)
                url = self.urls[shot.index % len(self.urls)] + self.setup.path
                tasks.append(asyncio.create_task(_send(client, url, body, headers, shot)))
                await asyncio.sleep(1 / self.rate)
            await asyncio.gather(*tasks)

    def stop(self) -> list[Shot]:
        self._halt.set()
        self.join(timeout=90)
        return self.shots


async def _send(client: httpx.AsyncClient, url: str, body: dict, headers: dict, shot: Shot) -> None:
    try:
        resp = await client.post(url, json=body, headers=headers)
        shot.status = resp.status_code
        shot.request_id = resp.headers.get("x-capgate-request-id", "")
        if resp.status_code != 200:
            try:
                shot.code = str((resp.json().get("error") or {}).get("code") or "")
            except ValueError:
                shot.code = resp.text[:100]
    except httpx.HTTPError as exc:
        shot.error = f"{type(exc).__name__}: {exc}"[:300]


def bill_through_fake_provider(setup: capcheck.Setup, upstream, *, delay_ms: int) -> None:
    """Route the run's model to the fake provider (an OpenAI-wire server in this process), which
    bills exactly the plan's actual cost per call and counts every call it answered."""
    upstream.reset()
    upstream.control(prompt_tokens=setup.tokens.prompt, completion_tokens=setup.tokens.completion, delay_ms=delay_ms)
    fake = Connection.objects.create(
        organization=setup.organization, name="fake", kind="openai", base_url=upstream.url + "/v1", secret="sk-up"
    )
    RouteTarget.objects.filter(route__organization=setup.organization).update(connection=fake)


def restart(pg: PrivatePostgres, *, down_seconds: float) -> float:
    """Stop the cluster (fast: connections cut, as in an outage), wait, start it; returns
    time.monotonic() when it accepts connections again."""
    connection.close()
    pg.stop()
    time.sleep(down_seconds)
    pg.start()
    return time.monotonic()


def retrying(fn):
    """fn() with this test's own connection, reconnecting once after the restart cut it."""
    try:
        return fn()
    except Exception:
        connection.close()
        return fn()


@dataclass
class Outcome:
    """What a restart cost, read back from the database after the books settled."""

    shots: list[Shot]
    recovered_at: float
    bill_nano: int
    recorded_nano: int
    spent_nano: int
    statuses: dict[int, int]
    late_503: list[float]  # seconds after recovery of each 503 sent more than 1 s after it
    first_after: Shot | None
    slices_charged: int
    estimated: int
    unrecorded_served: list[str]
    left_behind: int
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"statuses {self.statuses}; provider billed {self.bill_nano / 1e9:.6f} USD, recorded "
            f"{self.recorded_nano / 1e9:.6f} USD (window spent {self.spent_nano / 1e9:.6f}); 503s >1 s after "
            f"recovery: {len(self.late_503)} {[round(s, 1) for s in self.late_503]}; first request after "
            f"recovery: {self.first_after.status if self.first_after else None}; slices charged: "
            f"{self.slices_charged}; estimated rows: {self.estimated}; served without a row: "
            f"{len(self.unrecorded_served)}; reservations left: {self.left_behind}"
        )


def settle_and_measure(
    *, setup: capcheck.Setup, upstream, shots: list[Shot], recovered_at: float, timeout: float = 60
) -> Outcome:
    org_id = setup.organization.id

    def settled() -> bool:
        return not (
            Reservation.objects.filter(organization_id=org_id).exists()
            or UsageRecord.objects.filter(organization_id=org_id, applied=False).exists()
        )

    try:
        wait_until(lambda: retrying(settled), timeout=timeout, interval=0.25, what="the books to settle")
    except AssertionError:
        pass  # measured below as reservations left behind
    rows = list(UsageRecord.objects.filter(organization_id=org_id))
    per_call = setup.tokens.actual_nano
    bill = upstream.stats()["completed"] * per_call
    served_ids = {s.request_id for s in shots if s.status == 200}
    recorded_ids = {r.request_id for r in rows}
    after = sorted((s for s in shots if s.sent_at >= recovered_at), key=lambda s: s.sent_at)
    statuses: dict[int, int] = {}
    for s in shots:
        statuses[s.status] = statuses.get(s.status, 0) + 1
    window = Window.objects.get(budget__organization_id=org_id)
    return Outcome(
        shots=shots,
        recovered_at=recovered_at,
        bill_nano=bill,
        recorded_nano=sum(r.cost_nano for r in rows),
        spent_nano=window.spent_nano,
        statuses=statuses,
        late_503=[s.sent_at - recovered_at for s in after if s.status == 503 and s.sent_at > recovered_at + 1],
        first_after=after[0] if after else None,
        slices_charged=sum(1 for r in rows if r.request_id.startswith("slice-") and r.cost_nano > 0),
        estimated=sum(1 for r in rows if r.status == UsageRecord.Status.ESTIMATED),
        unrecorded_served=sorted(served_ids - recorded_ids),
        left_behind=Reservation.objects.filter(organization_id=org_id).count(),
    )
