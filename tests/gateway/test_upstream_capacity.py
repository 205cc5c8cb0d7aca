"""Fair upstream capacity: one tenant's hung upstream calls cannot starve another tenant.

Real hung connections: tenant A's requests make the fake upstream stall (it never answers),
tenant B's take 100 ms. The gateway process has a small upstream pool here (64 sockets) so a few
hundred of A's requests are enough to exhaust it — the issue saw 2,100 against the default 2,000;
the shape is the same, scaled to run in seconds."""

import asyncio
import time

import httpx
import pytest

from catalog.models import Connection, RouteTarget
from gateway.upstream import transport as guarded
from gateway.upstream.transport import Slots, slots
from ledger.models import Reservation, UsageRecord
from tenants.models import ApiKey, hash_key
from tests.conftest import make_tenant
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
KEY_B = "cg_test_key_tenant_b_0123456789"
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
HUNG_FROM_A = 300
PER_TENANT = 16


@pytest.fixture
def small_process(settings):
    """A gateway process with 64 upstream sockets, 16 per organization and per connection."""
    settings.CAPGATE = {
        **settings.CAPGATE,
        "UPSTREAM_MAX_CONNECTIONS": 64,
        "UPSTREAM_MAX_PER_ORGANIZATION": PER_TENANT,
        "UPSTREAM_MAX_PER_CONNECTION": PER_TENANT,
        "UPSTREAM_POOL_TIMEOUT": 2.0,
    }
    guarded._clients.clear()
    yield
    guarded._clients.clear()


@pytest.fixture
def tenant_b(wired, upstream):
    t = make_tenant("beta")
    ApiKey.objects.filter(pk=t.key.pk).update(key_hash=hash_key(KEY_B))
    conn = Connection.objects.create(
        organization=t.org,
        name="oa",
        kind="openai",
        base_url=upstream.url + "/v1",
        secret="sk-b",
        options={"forward_test_headers": True},
    )
    route = t.org.routes.create(name="gpt-test")
    RouteTarget.objects.create(route=route, connection=conn, model=wired.model, position=0)
    return t


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[int(0.99 * (len(ordered) - 1))]


async def _b_round(
    client: httpx.AsyncClient, url: str, n: int = 40, concurrency: int = 4
) -> tuple[list[int], list[float]]:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> tuple[int, float]:
        async with gate:
            t0 = time.monotonic()
            r = await client.post(
                url, json=CHAT, headers={"authorization": f"Bearer {KEY_B}", "x-upstream-delay-ms": "100"}
            )
            return r.status_code, time.monotonic() - t0

    results = await asyncio.gather(*(one() for _ in range(n)))
    return [s for s, _ in results], [t for _, t in results]


async def _starve(gateway, upstream) -> dict:
    url = gateway.url + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=HUNG_FROM_A + 50)) as client:
        _, unloaded = await _b_round(client, url)
        a_statuses: list[int] = []

        async def a_call() -> None:
            try:
                r = await client.post(
                    url, json=CHAT, headers={"authorization": f"Bearer {KEY}", "x-upstream-fail": "stall"}
                )
            except httpx.HTTPError:  # answered by a dropped connection: still answered
                a_statuses.append(0)
                return
            a_statuses.append(r.status_code)

        hung = [asyncio.create_task(a_call()) for _ in range(HUNG_FROM_A)]
        # A's load is in place once each of its requests was answered or is stuck upstream
        # (or, with no limits, stuck in the pool and timed out of it).
        deadline = time.monotonic() + 90  # a loaded 2-core CI machine admits 300 requests slowly
        while len(a_statuses) + (await asyncio.to_thread(upstream.stats))["in_flight"] < HUNG_FROM_A:
            assert time.monotonic() < deadline, "tenant A's load did not settle"
            await asyncio.sleep(0.1)
        in_flight = (await asyncio.to_thread(upstream.stats))["in_flight"]
        b_statuses, loaded = await _b_round(client, url)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
    return {
        "unloaded": unloaded,
        "loaded": loaded,
        "b_statuses": b_statuses,
        "a_statuses": a_statuses,
        "a_in_flight": in_flight,
    }


def test_hung_calls_from_one_tenant_do_not_starve_another(gateway, wired, tenant_b, upstream, small_process):
    # when: A holds 300 requests against an upstream that never answers, and B keeps calling
    seen = asyncio.run(_starve(gateway, upstream))
    # then: A got its share and 429 for the rest; B's calls all succeed, as fast as unloaded
    assert seen["a_in_flight"] == PER_TENANT
    assert sorted(set(seen["a_statuses"])) == [429]
    assert seen["b_statuses"] == [200] * len(seen["b_statuses"])
    assert p99(seen["loaded"]) <= 2 * p99(seen["unloaded"]), (p99(seen["loaded"]), p99(seen["unloaded"]))
    # and A's refusals were never charged: released at once (zero cost) or never reserved
    wait_settled(timeout=20)
    refused = UsageRecord.objects.filter(organization=wired.org, error__contains="concurrency")
    assert all(r.cost_nano == 0 for r in refused)
    assert not Reservation.objects.exists()


def test_without_the_limits_hung_calls_starve_the_other_tenant(
    gateway, wired, tenant_b, upstream, small_process, monkeypatch
):
    # The guard-removal test of the one above: with no per-organization or per-connection limit,
    # A's hung calls take the whole pool and B's calls time out waiting for it.
    monkeypatch.setattr(Slots, "limits", staticmethod(lambda: (10**9, 10**9)))
    seen = asyncio.run(_starve(gateway, upstream))
    assert seen["a_in_flight"] > PER_TENANT
    b_ok = seen["b_statuses"] == [200] * len(seen["b_statuses"])
    assert not (b_ok and p99(seen["loaded"]) <= 2 * p99(seen["unloaded"]))


def test_slots_are_given_back_when_calls_end(gateway, wired, upstream, small_process):
    # Each call's slot lives as long as its response (here: answered, and failed upstream).
    for fail in ("", "500"):
        r = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=CHAT,
            timeout=30,
            headers={"authorization": f"Bearer {KEY}", "x-upstream-fail": fail},
        )
        assert r.status_code in (200, 500)
    stream = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        timeout=30,
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert stream.status_code == 200
    assert slots.by_organization == {} and slots.by_connection == {}
