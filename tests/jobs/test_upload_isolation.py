"""One organization's batch uploads do not starve another's requests: the uploads are parsed and
sized in a sizing process (jobs/uploads.py), never on the gateway's event loop or its threads."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx

from catalog.models import Connection, Route, RouteTarget
from tenants.models import ApiKey, hash_key
from tests.conftest import make_tenant
from tests.gateway.conftest import KEY

OTHER_KEY = "cg_other_key_0123456789"
LINES, PAD = 3000, 3000  # about 9.5 MB a file
SAMPLES = 40


def _file() -> bytes:
    line = {"method": "POST", "url": "/v1/chat/completions"}
    body = {"model": "echo-1", "max_tokens": 10, "messages": [{"role": "user", "content": "x" * PAD}]}
    return "".join(json.dumps({"custom_id": f"r{i}", **line, "body": body}) + "\n" for i in range(LINES)).encode()


def _other_org(wired) -> None:
    other = make_tenant("globex")
    ApiKey.objects.filter(pk=other.key.pk).update(key_hash=hash_key(OTHER_KEY))
    conn = Connection.objects.create(organization=other.org, name="echo", kind="echo")
    route = Route.objects.create(organization=other.org, name="echo-1")
    RouteTarget.objects.create(route=route, connection=conn, model=wired.model, position=0)


def _latencies(url: str, n: int) -> list[float]:
    body = {"model": "echo-1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    out = []
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {OTHER_KEY}"}, timeout=30) as c:
        for _ in range(n):
            t = time.perf_counter()
            assert c.post("/v1/chat/completions", json=body).status_code == 200
            out.append(time.perf_counter() - t)
    return out


def _p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


def test_the_loop_is_not_held_while_another_org_uploads_large_files(gateway, wired, settings):
    # given: a second organization's baseline, and the gateway loop's lag measured throughout
    # lookups cached as in production (the test settings turn the cache off): sizing is CPU, not queries
    settings.CAPGATE = {**settings.CAPGATE, "ORG_CONCURRENT_UPLOADS": 2, "LOOKUP_CACHE_SECONDS": 2.0}
    _other_org(wired)
    _latencies(gateway.url, 5)  # warm
    baseline = _latencies(gateway.url, SAMPLES)
    lags: list[float] = []
    stop = threading.Event()

    async def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t - 0.005)

    assert gateway.server.loop is not None
    probing = asyncio.run_coroutine_threadsafe(probe(), gateway.server.loop)
    # The form encoded once, up front: the uploading clients share this process's GIL with the gateway.
    form = httpx.Request("POST", gateway.url, files={"file": ("b.jsonl", _file())}, data={"purpose": "batch"})
    body, content_type, statuses = form.read(), form.headers["content-type"], []

    def upload() -> None:
        headers = {"authorization": f"Bearer {KEY}", "content-type": content_type}
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=120) as c:
            statuses.append(c.post("/v1/files", content=body).status_code)

    # when: two large uploads run at once while the other organization keeps sending small requests
    uploads = [threading.Thread(target=upload) for _ in range(2)]
    for t in uploads:
        t.start()
    during: list[float] = []
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in uploads) and time.monotonic() < deadline:
        during += _latencies(gateway.url, 5)
    for t in uploads:
        t.join(timeout=5)
    if len(during) < SAMPLES:  # uploads finished early: sample the rest (still under their tail)
        during += _latencies(gateway.url, SAMPLES - len(during))
    stop.set()
    probing.result(timeout=5)
    # then: both uploads taken, and the event loop every tenant is served on was never held for
    # long (its lag's 99th percentile; a 5 ms sleep's overshoot is a few ms on an idle loop)
    assert statuses == [200, 200]
    lag_p99 = statistics.quantiles(lags, n=100)[-1]
    p95s = f"other org p95 {_p95(baseline) * 1000:.0f} -> {_p95(during) * 1000:.0f} ms"
    report = f"{p95s}, loop lag p99 {lag_p99 * 1000:.0f} ms"
    print(report)
    assert lag_p99 < 0.075, report
    # and the other organization's p95 within 2x its baseline (a baseline of at least 30 ms: on a
    # loaded 2-core machine a 10 ms p95 doubles from scheduling alone)
    assert _p95(during) <= 2 * max(_p95(baseline), 0.030), report
