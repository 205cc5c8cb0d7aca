"""Gateway processes and memory: throughput from 1 to 4 worker processes on one database, and
a worker's resident memory by which encodings its catalog names.

    bash scripts/services.sh start
    .venv/bin/python bench/scale.py [--seconds 5] [--pgbouncer]     # ~3 minutes; markdown tables

1. Throughput: capgate under production settings with 1, 2, 3 and 4 uvicorn worker processes,
   wrk at 50 connections for --seconds per cell against the built-in echo provider (no upstream
   process competing for the cores), on one hot ceiling (every request under one organization's
   blocking cap) and on 100 distinct ceilings (requests spread over 100 organizations, each with
   its own cap). Every request goes through admission; caps are far above the run.
2. Memory: one worker's RSS (VmRSS, /proc) after startup and after a 3 s wrk run, with routed
   models naming no tokenizer, o200k_base, or both encodings (which is what every worker loaded
   before encodings were loaded only for routed models, gateway/admission/tokens.py), and with
   o200k_base counted by the token counter process (gateway/admission/token_counter.py), whose
   own RSS is shown too. Every request is under a blocking cap, so each one is counted exactly.

With --pgbouncer the workers reach Postgres through PgBouncer in transaction mode (scripts/
services.sh, :16432; the slices' LISTEN direct). Own database (capgate_bench_scale), own port,
127.0.0.1 only; each run is bounded by --seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateway as bench  # noqa: E402 — the gateway benchmark's helpers

DB = "capgate_bench_scale"
PORT = 18210
ORGS = 100
DIRECT = f"postgres://capgate:capgate@127.0.0.1:15432/{DB}"
POOLED = f"postgres://capgate:capgate@127.0.0.1:16432/{DB}"
BODY = '{"model": "scale-echo", "messages": [{"role": "user", "content": "Say hello in one word."}], "max_tokens": 64}'


def key(i: int) -> str:
    return f"cg_scale_key_{i:03d}_000000000000"


def setup() -> None:
    bench.fresh_database(DB)
    bench.manage(
        "shell",
        "-c",
        f"""
from decimal import Decimal as D
from tenants.models import Organization, Project, ApiKey, hash_key
from catalog.models import Provider, Model, Connection, Route, RouteTarget
from ledger.models import Budget
prov = Provider.objects.create(slug="scale", name="Scale")
m = Model.objects.create(provider=prov, name="scale-1", input_usd_per_mtok=D("15"), output_usd_per_mtok=D("75"),
                         max_output_tokens=4096)
for i in range({ORGS}):
    org = Organization.objects.create(name=f"Scale {{i}}", slug=f"scale-{{i}}")
    p = Project.objects.create(organization=org, name="Main", slug="main")
    ApiKey.objects.create(organization=org, project=p, name="k", prefix=f"cg_sc{{i:03d}}",
                          key_hash=hash_key(f"cg_scale_key_{{i:03d}}_000000000000"))
    echo = Connection.objects.create(organization=org, name="echo", kind="echo", options={{}})
    r = Route.objects.create(organization=org, name="scale-echo")
    RouteTarget.objects.create(route=r, connection=echo, model=m)
    # A blocking cap far above the run: every request goes through admission.
    Budget.objects.create(organization=org, scope="organization", period="month", mode="block", amount_nano=10**15)
""",
        db=DB,
    )


def set_tokenizer(name: str | None) -> None:
    bench.manage(
        "shell", "-c", f"from catalog.models import Model; Model.objects.update(tokenizer={name!r})", db=DB
    )  # fmt: skip


def environment(pgbouncer: bool) -> dict[str, str]:
    values = {"DATABASE_URL": DIRECT, "CAPGATE_DB_POOL_MAX": "12", "CAPGATE_DB_WEB_CONNECTIONS": "2"}
    if pgbouncer:
        values |= {"DATABASE_URL": POOLED, "CAPGATE_DB_POOLER": "transaction", "CAPGATE_LISTEN_DATABASE_URL": DIRECT}
    return values


class Gateway:
    """uvicorn with `workers` worker processes (one process when 1) on PORT."""

    def __init__(self, workers: int, extra: dict[str, str]) -> None:
        self.log = open(ROOT / "var" / f"bench-scale-{workers}.log", "w")  # noqa: SIM115
        args = [str(ROOT / ".venv/bin/uvicorn"), "config.asgi:application", "--host", "127.0.0.1"]
        args += ["--port", str(PORT), "--no-access-log", "--log-level", "warning"]
        args += ["--workers", str(workers)] if workers > 1 else []
        self.p = subprocess.Popen(
            args, cwd=ROOT, env={**bench.env(DB), **extra}, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        bench.wait_http(f"http://127.0.0.1:{PORT}/v1/models", {"authorization": f"Bearer {key(0)}"})
        time.sleep(2)  # every worker up and past its startup (registration, warm connections, encodings)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.p.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024

    def stop(self) -> None:
        os.killpg(self.p.pid, 15)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, 9)


LUA = """
keys = {%s}
counter = 0
request = function()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. keys[(counter %% #keys) + 1]}
  return wrk.format("POST", "/v1/chat/completions", headers, [[%s]])
end
done = function(summary, latency, requests)
  io.write(string.format("JSON %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50)))
end
"""


def wrk(keys: list[str], seconds: int, connections: int = 50) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(LUA % (", ".join(f'"{k}"' for k in keys), BODY))
    out = subprocess.run(
        ["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s", "-s", fh.name,
         f"http://127.0.0.1:{PORT}"],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    requests, duration_us, errors, non2xx, p50 = (int(x) for x in out.split("JSON ", 1)[1].split()[:5])
    return {"rps": requests / (duration_us / 1e6), "errors": errors, "non2xx": non2xx, "p50": p50 / 1000}


def throughput(seconds: int, extra: dict[str, str]) -> list[str]:
    rows = [
        "| worker processes | one hot ceiling req/s | p50 ms | 100 ceilings req/s | p50 ms | errors | non-2xx |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workers in (1, 2, 3, 4):
        gw = Gateway(workers, extra)
        try:
            wrk([key(0)], 2)  # warm up every worker's pools and caches
            hot = wrk([key(0)], seconds)
            wrk([key(i) for i in range(ORGS)], 2)  # each worker's first admission on each ceiling
            spread = wrk([key(i) for i in range(ORGS)], seconds)
        finally:
            gw.stop()
        rows.append(
            f"| {workers} | {hot['rps']:.0f} | {hot['p50']:.1f} | {spread['rps']:.0f} | {spread['p50']:.1f} | "
            f"{hot['errors'] + spread['errors']} | {hot['non2xx'] + spread['non2xx']} |"
        )
        print(rows[-1], flush=True)
    return rows


class TokenCounter:
    """The token counter process (gateway/admission/token_counter.py) on a socket of its own."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cg-bench-tc-", dir="/tmp"))
        self.socket = str(self.dir / "counter.sock")
        self.p = subprocess.Popen(
            [str(ROOT / ".venv/bin/python"), "-m", "gateway.admission.token_counter", "serve", "--socket", self.socket],
            cwd=ROOT, env=bench.env(DB), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        check = [str(ROOT / ".venv/bin/python"), "-m", "gateway.admission.token_counter", "check"]
        deadline = time.monotonic() + 30
        while subprocess.run([*check, "--socket", self.socket], cwd=ROOT, capture_output=True).returncode:
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the token counter did not start")
            time.sleep(0.1)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.p.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024

    def stop(self) -> None:
        self.p.terminate()
        self.p.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def memory(extra: dict[str, str]) -> list[str]:
    rows = [
        "| routed models name | RSS after startup | RSS after 3 s at c=50 | req/s in those 3 s | counter RSS after |",
        "|---|---:|---:|---:|---:|",
    ]
    cases: list[tuple[str, str | None, list[str], bool]] = [("no tokenizer", None, [], False)]
    cases += [
        ("o200k_base", "o200k_base", [], False),
        ("o200k_base and cl100k_base (what every worker loaded before)", "o200k_base", ["cl100k_base"], False),
        ("o200k_base, counted by the token counter (CAPGATE_TOKEN_COUNTER)", "o200k_base", [], True),
    ]
    for label, tokenizer, more, remote in cases:
        set_tokenizer(tokenizer)
        if more:  # a second model naming the other encoding, routed to (unrouted ones load nothing)
            bench.manage(
                "shell", "-c",
                "from catalog.models import Model, Route, RouteTarget; m = Model.objects.get(name='scale-1'); "
                f"m.pk = None; m.name = 'scale-2'; m.tokenizer = {more[0]!r}; m.save(); "
                "r = Route.objects.get(organization__slug='scale-0', name='scale-echo'); "
                "RouteTarget.objects.create(route=r, connection=r.targets.get().connection, model=m, position=1)",
                db=DB,
            )  # fmt: skip
        else:
            drop_second_model()
        counter = TokenCounter() if remote else None
        gw = Gateway(1, {**extra, "CAPGATE_TOKEN_COUNTER": counter.socket if counter else ""})
        try:
            started = gw.rss_mib()
            run = wrk([key(i) for i in range(ORGS)], 3)
            after = gw.rss_mib()
            counted = f"{counter.rss_mib():.0f} MiB" if counter else "—"
        finally:
            gw.stop()
            if counter:
                counter.stop()
        rows.append(f"| {label} | {started:.0f} MiB | {after:.0f} MiB | {run['rps']:.0f} | {counted} |")
        print(rows[-1], flush=True)
    drop_second_model()
    set_tokenizer(None)
    return rows


def drop_second_model() -> None:
    drop = "from catalog.models import Model, RouteTarget; RouteTarget.objects.filter(model__name='scale-2').delete(); "
    bench.manage("shell", "-c", drop + "Model.objects.filter(name='scale-2').delete()", db=DB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per cell (bounded: at most 30)")
    parser.add_argument("--pgbouncer", action="store_true", help="through PgBouncer in transaction mode")
    parser.add_argument("--only", choices=("throughput", "memory"), help="one of the two tables")
    args = parser.parse_args()
    seconds = min(args.seconds, 30)
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
    (ROOT / "var").mkdir(exist_ok=True)
    setup()
    extra = environment(args.pgbouncer)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"# capgate processes and memory — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, load {load}; {'through PgBouncer' if args.pgbouncer else 'direct to Postgres'}\n"
    )
    if args.only != "memory":
        print(f"## Throughput by worker processes (echo provider, c=50, {seconds} s per cell)\n")
        print("\n".join(throughput(seconds, extra)) + "\n")
    if args.only != "throughput":
        print("## One worker's memory by the encodings its catalog names\n")
        print("\n".join(memory(extra)) + "\n")


if __name__ == "__main__":
    main()
