"""Gateway benchmark: direct calls to the fake upstream vs the same calls through capgate.

    bash scripts/services.sh start
    .venv/bin/python bench/gateway.py            # ~4 minutes; prints markdown tables

Measures, in one run:
1. throughput and p50/p95/p99 latency at concurrency 1, 50, 200, 500 (upstream delay 50 ms),
   non-stream and stream, with wrk (Debian package `wrk`; installed here if missing);
2. the 500-request burst against a $1 blocking cap (half of them streams): served/refused, p95,
   and the four properties read from the database;
3. the gateway's resident memory while holding 1,000 open streams;
4. how long after a response the room returns to the cap (the micro-batch drain delay).

It uses its own database (capgate_bench_gw), its own ports, and only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.money import format_usd  # noqa: E402 — money shown through the one module, never float

PY = str(ROOT / ".venv" / "bin" / "python")
DB = "capgate_bench_gw"
UP_PORT, GW_PORT, REF_PORT = 18201, 18200, 18202
KEY = "cg_bench_key_0000000000000000"
BURST_KEY = "cg_bench_burst_key_00000000000"  # its own organization: a clean $1 cap
BODY = {"model": "bench-up", "messages": [{"role": "user", "content": "Say hello in one word."}], "max_tokens": 64}


def env(db: str = DB) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://capgate:capgate@127.0.0.1:15432/{db}",
        "DJANGO_SETTINGS_MODULE": "config.settings.prod",
        "CAPGATE_LOG_LEVEL": "WARNING",
        "CAPGATE_DB_POOL_MAX": "40",
        "CAPGATE_DATA_DIR": tempfile.mkdtemp(),
        # The fake upstream listens on loopback, which production settings refuse to dial.
        "CAPGATE_UPSTREAM_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        # Production settings refuse to start without real secrets; the bench is loopback-only.
        "DJANGO_SECRET_KEY": os.environ.get(
            "DJANGO_SECRET_KEY", "capgate-bench-only-django-secret-key-never-deployed-0"
        ),
        "CAPGATE_SECRET_KEY": os.environ.get("CAPGATE_SECRET_KEY", "capgate-bench-only-connection-secret-key"),
    }


def manage(*args: str, db: str = DB) -> str:
    if args[0] == "shell":  # Django 5.2's shell announces its auto-imports on stdout
        args = ("shell", "--no-imports", *args[1:])
    done = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env(db), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def fresh_database(db: str) -> None:
    """Drop and recreate the benchmark's own database, migrated."""
    subprocess.run(["bash", "scripts/services.sh", "start"], cwd=ROOT, check=True, capture_output=True)
    psql = [
        "runuser",
        "-u",
        "postgres",
        "--",
        "/usr/lib/postgresql/15/bin/psql",
        "-h",
        "/var/tmp/capgate/sock",
        "-p",
        "15432",
        "-d",
        "postgres",
        "-qtA",
        "-c",
    ]
    subprocess.run([*psql, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=True, capture_output=True)
    subprocess.run([*psql, f"CREATE DATABASE {db} OWNER capgate"], check=True, capture_output=True)
    manage("migrate", "--noinput", "-v0", db=db)


def setup_database() -> None:
    fresh_database(DB)
    manage(
        "shell",
        "-c",
        f"""
from decimal import Decimal as D
from tenants.models import Organization, Project, ApiKey, hash_key
from catalog.models import Provider, Model, Connection, Route, RouteTarget
from ledger.models import Budget
org = Organization.objects.create(name="Bench", slug="bench")
p = Project.objects.create(organization=org, name="Main", slug="main")
ApiKey.objects.create(organization=org, project=p, name="k", prefix="cg_bench", key_hash=hash_key("{KEY}"))
prov = Provider.objects.create(slug="bench", name="Bench")
m = Model.objects.create(provider=prov, name="bench-1", input_usd_per_mtok=D("15"), output_usd_per_mtok=D("75"),
                         cache_read_usd_per_mtok=D("1.5"), cache_write_usd_per_mtok=D("18.75"), max_output_tokens=4096)
up = Connection.objects.create(organization=org, name="up", kind="openai", base_url="http://127.0.0.1:{UP_PORT}/v1")
echo = Connection.objects.create(organization=org, name="echo", kind="echo", options={{"delay_ms": 50}})
for name, conn in (("bench-up", up), ("bench-echo", echo)):
    r = Route.objects.create(organization=org, name=name)
    RouteTarget.objects.create(route=r, connection=conn, model=m)
# A blocking cap far above the run: every request goes through full admission.
Budget.objects.create(organization=org, scope="organization", period="month", mode="block", amount_nano=10**15)
burst = Organization.objects.create(name="Burst", slug="burst")
bp = Project.objects.create(organization=burst, name="Main", slug="main")
ApiKey.objects.create(organization=burst, project=bp, name="k", prefix="cg_burst", key_hash=hash_key("{BURST_KEY}"))
becho = Connection.objects.create(organization=burst, name="echo", kind="echo", options={{"delay_ms": 50}})
br = Route.objects.create(organization=burst, name="bench-echo")
RouteTarget.objects.create(route=br, connection=becho, model=m)
Budget.objects.create(organization=burst, scope="organization", period="day", mode="block", amount_nano=10**9)
""",
    )


class Proc:
    def __init__(self, name: str, args: list[str], db: str = DB):
        self.name = name
        self.log = open(ROOT / "var" / f"bench-{name}.log", "w")  # noqa: SIM115
        self.p = subprocess.Popen(
            args, cwd=ROOT, env=env(db), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def rss_kb(self) -> int:
        # uvicorn runs the app in this process (no --workers): its RSS is the gateway's.
        text = Path(f"/proc/{self.p.pid}/status").read_text()
        rss = re.search(r"VmRSS:\s+(\d+)", text)
        if rss is None:
            raise RuntimeError(f"no VmRSS in /proc/{self.p.pid}/status: has the {self.name} process exited?")
        return int(rss.group(1))

    def stop(self) -> None:
        os.killpg(self.p.pid, signal.SIGTERM)
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)


def wait_http(url: str, headers: dict | None = None) -> None:
    for _ in range(200):
        try:
            if httpx.get(url, headers=headers, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


WRK_LUA = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
done = function(summary, latency, requests)
  io.write(string.format("JSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"errors\\": %%d, "
    .. "\\"non2xx\\": %%d, \\"p50\\": %%d, \\"p95\\": %%d, \\"p99\\": %%d}\\n",
    summary.requests, summary.duration, summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


def wrk(url: str, body: dict, concurrency: int, seconds: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(WRK_LUA % (json.dumps(body), KEY))
    threads = min(2, concurrency)
    out = subprocess.run(
        [
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(concurrency),
            "-d",
            f"{seconds}s",
            "--timeout",
            "10s",
            "-s",
            fh.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = json.loads(out.split("JSON ", 1)[1].splitlines()[0])
    data["rps"] = data["requests"] / (data["duration_us"] / 1e6)
    return data


def latency_table(seconds: int) -> list[str]:
    rows = [
        "| path | mode | concurrency | req/s | p50 ms | p95 ms | p99 ms | errors | non-2xx |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stream in (False, True):
        body = {**BODY, "stream": stream}
        for c in (1, 50, 200, 500):
            for label, url in (
                ("direct", f"http://127.0.0.1:{UP_PORT}/v1/chat/completions"),
                ("capgate", f"http://127.0.0.1:{GW_PORT}/v1/chat/completions"),
            ):
                r = wrk(url, body, c, seconds)
                rows.append(
                    f"| {label} | {'stream' if stream else 'json'} | {c} | {r['rps']:.0f} | {r['p50'] / 1000:.1f} | "
                    f"{r['p95'] / 1000:.1f} | {r['p99'] / 1000:.1f} | {r['errors']} | {r['non2xx']} |"
                )
                print(rows[-1], flush=True)
    return rows


def reference_table(seconds: int) -> list[str]:
    """The comparison with the cap-less reference proxy (uvicorn + aiohttp client, no database)
    vs capgate with one hot blocking ceiling (every request admitted against the bench
    organization's one blocking cap), same static upstream answering at once, JSON."""
    httpx.post(f"http://127.0.0.1:{UP_PORT}/_control", json={"delay_ms": 0})
    rows = [
        "| system (1 process) | c=1 req/s | c=1 p50 ms | c=50 req/s | c=50 p50 ms | c=50 p99 ms | errors | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cells = {}
    for label, port in (
        ("cap-less reference: uvicorn + aiohttp client", REF_PORT),
        ("capgate, one hot blocking ceiling", GW_PORT),
    ):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        wrk(url, BODY, 10, 2)  # warm up pools and code paths
        one, fifty = wrk(url, BODY, 1, seconds), wrk(url, BODY, 50, seconds)
        cells[port] = (one, fifty)
        rows.append(
            f"| {label} | {one['rps']:.0f} | {one['p50'] / 1000:.2f} | {fifty['rps']:.0f} | "
            f"{fifty['p50'] / 1000:.1f} | {fifty['p99'] / 1000:.1f} | {one['errors'] + fifty['errors']} | "
            f"{one['non2xx'] + fifty['non2xx']} |"
        )
        print(rows[-1], flush=True)
    httpx.post(f"http://127.0.0.1:{UP_PORT}/_control", json={"delay_ms": 50})
    (ref1, ref50), (cg1, cg50) = cells[REF_PORT], cells[GW_PORT]
    added = (cg1["p50"] - ref1["p50"]) / 1000
    share = cg50["rps"] / ref50["rps"]
    rows += [
        "",
        "| target (issue 12) | result | met? |",
        "|---|---|---|",
        f"| c=50: capgate ≥ 40 % of the reference's req/s | {cg50['rps']:.0f} / {ref50['rps']:.0f} = {share:.0%} | "
        f"{'yes' if share >= 0.4 else '**no**'} |",
        f"| c=1: capgate's added p50 ≤ 2 ms | {cg1['p50'] / 1000:.2f} − {ref1['p50'] / 1000:.2f} = {added:.2f} ms | "
        f"{'yes' if added <= 2 else '**no**'} |",
    ]
    return rows


def burst_cap(calls: int) -> int:
    """A cap worth `calls` calls: that many times the worst case one burst request reserves
    (read from a probe call's usage record on the bench organization, same body and model)."""
    headers = {"authorization": f"Bearer {KEY}"}
    httpx.post(
        f"http://127.0.0.1:{GW_PORT}/v1/chat/completions",
        json={**BODY, "model": "bench-echo"},
        headers=headers,
        timeout=30,
    ).raise_for_status()
    time.sleep(0.5)
    worst = int(
        manage(
            "shell",
            "-c",
            """
from ledger.models import UsageRecord as U
print(U.objects.filter(organization__slug="bench").order_by("-id").values_list("reserved_nano", flat=True)[0])
""",
        )
        .strip()
        .splitlines()[-1]
    )
    manage(
        "shell",
        "-c",
        f"from ledger.models import Budget; "
        f"Budget.objects.filter(organization__slug='burst').update(amount_nano={worst * calls})",
    )
    return worst


def burst(n: int = 500, calls: int = 100) -> list[str]:
    """The capped burst: n requests at once (half streams) against a fresh organization's cap
    worth `calls` calls."""
    url = f"http://127.0.0.1:{GW_PORT}/v1/chat/completions"
    worst = burst_cap(calls)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
        t = time.perf_counter()
        body = {**BODY, "model": "bench-echo", "stream": i % 2 == 0}
        async with client.stream("POST", url, json=body, headers={"authorization": f"Bearer {BURST_KEY}"}) as r:
            await r.aread()
            return r.status_code, time.perf_counter() - t

    async def go():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(*[one(client, i) for i in range(n)])

    t0 = time.perf_counter()
    results = asyncio.run(go())
    wall = time.perf_counter() - t0
    lat = sorted(x[1] for x in results)
    codes = [x[0] for x in results]
    time.sleep(1.5)
    check = json.loads(
        manage(
            "shell",
            "-c",
            """
import json
from django.db.models import Sum
from ledger.models import Window, Reservation
from ledger.models import UsageRecord as U
w = Window.objects.get(budget__organization__slug="burst")
recs = U.objects.filter(organization__slug="burst")
print(json.dumps(dict(spent=w.spent_nano, reserved=w.reserved_nano, cap=w.budget.amount_nano,
  records=recs.count(), served=recs.filter(status="served").count(),
  excess=recs.aggregate(s=Sum("excess_nano"))["s"] or 0,
  reservations=Reservation.objects.filter(organization__slug="burst").count())))
""",
        )
        .strip()
        .splitlines()[-1]
    )
    p95 = lat[int(len(lat) * 0.95) - 1]
    ok = (
        check["spent"] <= check["cap"] + check["excess"]
        and check["records"] == codes.count(200)
        and check["reservations"] == 0
        and set(codes) <= {200, 402}
    )
    overshoot = max(0, check["spent"] - check["cap"])
    return [
        f"Cap {format_usd(check['cap'])} = {calls} × the worst case one request reserves ({format_usd(worst)}); "
        "overshoot = recorded spend above the cap.",
        "",
        "| requests | served | refused 402 | other | wall s | p50 ms | p95 ms | recorded spend | cap | "
        "overshoot | records | reservations left | four properties |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {n} | {codes.count(200)} | {codes.count(402)} | "
        f"{len(codes) - codes.count(200) - codes.count(402)} | {wall:.2f} | "
        f"{statistics.median(lat) * 1000:.0f} | {p95 * 1000:.0f} | {format_usd(check['spent'])} | "
        f"{format_usd(check['cap'])} | "
        f"{format_usd(overshoot)} | {check['records']} | {check['reservations']} | {'hold' if ok else 'FAIL'} |",
        "",
        "| target (issue 12) | result | met? |\n|---|---|---|\n| burst p95 ≤ 1.5 s with 0 overshoot | p95 "
        f"{p95:.2f} s, "
        f"overshoot {format_usd(overshoot)} | {'yes' if p95 <= 1.5 and overshoot == 0 else '**no**'} |",
    ]


def stream_memory(gateway: Proc, n: int = 1000) -> list[str]:
    """RSS of the gateway process with n streams open at once (upstream paces chunks slowly)."""
    url = f"http://127.0.0.1:{GW_PORT}/v1/chat/completions"
    body = {**BODY, "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    httpx.post(f"http://127.0.0.1:{UP_PORT}/_control", json={"chunks": 30, "chunk_delay_ms": 1000, "delay_ms": 0})
    for _ in range(20):  # warm up the pools and code paths first
        httpx.post(url, json={**BODY}, headers=headers, timeout=30)
    time.sleep(1)
    base = gateway.rss_kb()
    opened = asyncio.Event()
    peak = {"rss": base, "open": 0}

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            async for _ in r.aiter_lines():
                break  # first chunk arrived: the stream is open
            peak["open"] += 1
            await opened.wait()

    async def go():
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            tasks = [asyncio.create_task(one(client)) for _ in range(n)]
            deadline = time.monotonic() + 60
            while peak["open"] < n and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(1)
            peak["rss"] = gateway.rss_kb()
            opened.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    httpx.post(f"http://127.0.0.1:{UP_PORT}/_reset")
    per = (peak["rss"] - base) / max(peak["open"], 1)
    return [
        "| open streams | RSS before | RSS with streams open | per stream |",
        "|---:|---:|---:|---:|",
        f"| {peak['open']} | {base / 1024:.1f} MiB | {peak['rss'] / 1024:.1f} MiB | {per:.1f} KB |",
    ]


def settle_delay(samples: int = 20) -> list[str]:
    """Time from a response's end until its hold leaves the window (room back in the cap)."""
    out = (
        manage(
            "shell",
            "-c",
            f"""
import time, httpx
from ledger.models import Window
httpx.post("http://127.0.0.1:{GW_PORT}/v1/chat/completions", json={BODY!r},
           headers={{"authorization": "Bearer {KEY}"}}, timeout=30)
w = Window.objects.filter(budget__organization__slug="bench").order_by("-id").first()
delays = []
for i in range({samples}):
    httpx.post("http://127.0.0.1:{GW_PORT}/v1/chat/completions", json={BODY!r},
           headers={{"authorization": "Bearer {KEY}"}}, timeout=30)
    t = time.perf_counter()
    while Window.objects.get(pk=w.pk).reserved_nano != 0:
        time.sleep(0.002)
    delays.append((time.perf_counter() - t) * 1000)
    time.sleep(0.1)
delays.sort()
print(f"{{delays[len(delays)//2]:.0f}} {{delays[-1]:.0f}}")
""",
        )
        .strip()
        .splitlines()[-1]
    )
    p50, worst = out.split()
    return ["| samples | p50 ms | max ms |", "|---:|---:|---:|", f"| {samples} | {p50} | {worst} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8, help="wrk duration per cell")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--only-reference", action="store_true", help="only the reference comparison and the capped burst (issue 12)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="uvicorn worker processes for capgate (default 1, as the issue's tables; scripts/up.sh runs one per core)",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
    (ROOT / "var").mkdir(exist_ok=True)
    setup_database()
    upstream = Proc("upstream", [PY, "-m", "tests.upstream.server", "--port", str(UP_PORT)])
    gateway = Proc(
        "gateway",
        [
            str(ROOT / ".venv/bin/uvicorn"),
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(GW_PORT),
            "--no-access-log",
            "--log-level",
            "warning",
            *(["--workers", str(args.workers)] if args.workers > 1 else []),
        ],
    )
    reference = Proc(
        "reference",
        [
            str(ROOT / ".venv/bin/uvicorn"),
            "bench.reference_proxy:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(REF_PORT),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
    )
    try:
        wait_http(f"http://127.0.0.1:{UP_PORT}/_stats")
        wait_http(f"http://127.0.0.1:{REF_PORT}/_stats")
        wait_http(f"http://127.0.0.1:{GW_PORT}/v1/models", {"authorization": f"Bearer {KEY}"})
        httpx.post(
            f"http://127.0.0.1:{UP_PORT}/_control", json={"delay_ms": 50, "prompt_tokens": 20, "completion_tokens": 8}
        )
        print(
            f"# capgate gateway benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores; capgate {args.workers} worker process(es), headroom slices "
            f"{'off' if os.environ.get('CAPGATE_SLICES', '').lower() in ('0', 'false', 'off', 'no') else 'on'}\n"
        )
        print("## Capgate vs the cap-less reference (upstream answers at once, JSON)\n")
        print("\n".join(reference_table(args.seconds)) + "\n")
        if args.only_reference:
            print("## 500-request burst against a cap worth 100 calls (half streams, echo 50 ms)\n")
            print("\n".join(burst()) + "\n")
            return
        if not args.skip_latency:
            print("## Latency and throughput (upstream delay 50 ms)\n")
            print("\n".join(latency_table(args.seconds)) + "\n")
        print("## Settlement delay (response end -> hold released)\n")
        print("\n".join(settle_delay()) + "\n")
        print("## 500-request burst against a cap worth 100 calls (half streams, echo 50 ms)\n")
        print("\n".join(burst()) + "\n")
        print("## Memory per open stream\n")
        print("\n".join(stream_memory(gateway)) + "\n")
    finally:
        reference.stop()
        gateway.stop()
        upstream.stop()


if __name__ == "__main__":
    main()
