"""Capgate's hot path as ratios to a cap-less reference proxy, in one run.

    bash scripts/services.sh start
    .venv/bin/python bench/ratio.py [--seconds 5] [--workers 1] [--pgbouncer] [--slices on|off] [--profile]

Each system proxies a 100-token chat request to nginx's static reply (an OpenAI
chat.completion with usage: 100 prompt tokens, 3 completion tokens), driven by wrk:

- the cap-less reference: uvicorn + aiohttp client, one process, no database (bench/reference_proxy.py);
- capgate under production settings (config.settings.prod, DEBUG off) with no cap;
- capgate with one hot per-run cap: every request names the same run (X-Capgate-Run) and its
  blocking lifetime budget (X-Capgate-Run-Budget-Usd, far above the run);
- capgate with one hot organization ceiling: every request under one blocking monthly cap.

Per system: a 2 s warm-up at c=50, then c=1 and c=50 for --seconds each (req/s, p50, p99,
errors, non-2xx). Derived: the added p50 at c=1 (capgate − reference) and the c=50 share
(capgate req/s ÷ reference req/s), checked against the targets; the capgate worker's resident
memory (VmRSS) after the run; the usage rows capgate wrote (the static reply billed as a priced
answer); the load (/proc/loadavg) at start and end. With --profile, py-spy samples the worker
during an extra hot-run-cap cell (not in the table; c=50, or --profile-connections) and the top
functions are printed, with the busy thread time per request.

nginx (Debian package `nginx`, installed if missing) runs as its own process from a config
generated in a temp dir. Own database (capgate_bench_ratio), own ports (18300-18302), only
127.0.0.1; every process it starts is stopped at the end, on error too. About 1.5 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateway as bench  # noqa: E402 — env, manage, fresh_database, wait_http

BIN = ROOT / ".venv" / "bin"
DB = "capgate_bench_ratio"
GW_PORT, UP_PORT, REF_PORT = 18300, 18301, 18302
MODEL = "ratio-up"
# About 100 tokens of prompt, as the request; the reply's usage says 100 either way.
PROMPT = "Summarize in one word: " + "the quick brown fox jumps over the lazy dog, " * 9
BODY = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 3
REPLY = {
    "id": "chatcmpl-ratio",
    "object": "chat.completion",
    "created": 1764633600,
    "model": "ratio-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Fox."}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    },
}
RUN_ID, RUN_BUDGET_USD = "ratio-hot-run", "1000000"  # the largest run budget a header may set
# Raw SQL for the settle wait and the billing check (a manage.py shell costs ~2 s a call);
# tests/bench/test_ratio.py checks these names against the models.
USAGE_TABLE, RESERVATION_TABLE, ORGANIZATION_TABLE = "usage_usagerecord", "budgets_reservation", "tenants_organization"
RSS_TARGET_MIB = 150


@dataclass(frozen=True, eq=False)  # hashed by identity: the headers are a dict
class System:
    label: str
    port: int
    org: str  # the organization slug its key belongs to ("" for the reference)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"cg_ratio_{self.org or 'reference'}_key_0000000000"


REFERENCE = System("cap-less reference: uvicorn + aiohttp client", REF_PORT, "")
NO_CAP = System("capgate, no cap", GW_PORT, "nocap")
HOT_RUN = System(
    "capgate, one hot per-run cap",
    GW_PORT,
    "run",
    {"X-Capgate-Run": RUN_ID, "X-Capgate-Run-Budget-Usd": RUN_BUDGET_USD},
)
HOT_ORG = System("capgate, one hot organization ceiling", GW_PORT, "org")
SYSTEMS = (REFERENCE, NO_CAP, HOT_RUN, HOT_ORG)


def check_database(name: str) -> str:
    """The bench drops and recreates its database: never the development one or a test one."""
    if name == "capgate" or name.startswith("test_") or not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise SystemExit(f"refusing database {name!r}: use a bench database of its own (default {DB})")
    return name


def direct_url(db: str) -> str:
    return f"postgres://capgate:capgate@127.0.0.1:15432/{db}"


def setup(db: str) -> None:
    bench.fresh_database(db)
    keys = {s.org: s.key for s in SYSTEMS if s.org}
    bench.manage(
        "shell",
        "-c",
        f"""
from decimal import Decimal as D
from tenants.models import Organization, Project, ApiKey, hash_key
from catalog.models import Provider, Model, Connection, Route, RouteTarget
from ledger.models import Budget
prov = Provider.objects.create(slug="ratio", name="Ratio")
m = Model.objects.create(provider=prov, name="ratio-1", input_usd_per_mtok=D("15"), output_usd_per_mtok=D("75"),
                         max_output_tokens=4096)
for slug, raw in {keys!r}.items():
    org = Organization.objects.create(name=f"Ratio {{slug}}", slug=slug)
    p = Project.objects.create(organization=org, name="Main", slug="main")
    ApiKey.objects.create(organization=org, project=p, name="k", prefix=f"cg_r{{slug}}", key_hash=hash_key(raw))
    up = Connection.objects.create(organization=org, name="nginx", kind="openai",
                                   base_url="http://127.0.0.1:{UP_PORT}/v1")
    RouteTarget.objects.create(route=Route.objects.create(organization=org, name="{MODEL}"), connection=up, model=m)
# A blocking cap far above the run: every request of this organization is admitted against it.
# The run's lifetime cap is created by its first request (X-Capgate-Run-Budget-Usd).
Budget.objects.create(organization=Organization.objects.get(slug="org"), scope="organization", period="month",
                      mode="block", amount_nano=10**15)
""",
        db=db,
    )


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port};
        # `return` answers any method, POST included, and discards the request body.
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{reply}';
        }}
        location / {{ return 404; }}
    }}
}}
"""


def nginx_config(directory: str, port: int = UP_PORT) -> str:
    reply = json.dumps(REPLY, separators=(",", ":"))
    assert "'" not in reply and "\\" not in reply  # it sits in an nginx single-quoted string as is
    return NGINX_CONF.format(dir=directory, port=port, reply=reply)


class Service:
    """A process of the bench's own, in its own session so that stopping it stops its children."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = open(ROOT / "var" / f"bench-ratio-{name}.log", "w")  # noqa: SIM115
        self.p = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def workers(self) -> list[int]:
        """uvicorn's worker pids: its children when it forked workers, else itself."""
        children = Path(f"/proc/{self.p.pid}/task/{self.p.pid}/children").read_text().split()
        return [int(c) for c in children] or [self.p.pid]

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    if found is None:
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status: has the process exited?")
    return int(found.group(1)) / 1024


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (/proc/<pid>/stat, fields 14 and 15)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


WRK_LUA = """
wrk.method = "POST"
wrk.body = [[%s]]
%s
done = function(summary, latency, requests)
  io.write(string.format("JSON %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(system: System, concurrency: int, seconds: int) -> dict[str, float]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {system.key}", **system.headers}
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(WRK_LUA % (json.dumps(BODY), lines))
    try:
        out = subprocess.run(
            ["wrk", "-t", str(min(2, concurrency)), "-c", str(concurrency), "-d", f"{seconds}s", "--timeout", "10s",
             "-s", fh.name, f"http://127.0.0.1:{system.port}/v1/chat/completions"],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        ).stdout  # fmt: skip
    finally:
        os.unlink(fh.name)
    requests, duration_us, errors, non2xx, p50, p99 = (int(x) for x in out.split("JSON ", 1)[1].split()[:6])
    return {
        "requests": requests,
        "seconds": duration_us / 1e6,
        "rps": requests / (duration_us / 1e6),
        "errors": errors,
        "non2xx": non2xx,
        "p50": p50 / 1000,
        "p99": p99 / 1000,
    }


def probe(system: System) -> None:
    """One request, answered 200 with the static reply's usage: the path works before it is timed."""
    r = httpx.post(
        f"http://127.0.0.1:{system.port}/v1/chat/completions",
        json=BODY,
        headers={"authorization": f"Bearer {system.key}", **system.headers},
        timeout=30,
    )
    if r.status_code != 200 or r.json().get("usage", {}).get("prompt_tokens") != PROMPT_TOKENS:
        raise RuntimeError(f"{system.label}: probe answered {r.status_code}: {r.text[:500]}")


def settle(db: str, timeout: float = 20) -> None:
    """Wait until capgate has written every usage row and released every reservation, so that one
    cell's recording does not run into the next cell's time."""
    deadline, last = time.monotonic() + timeout, -1
    with psycopg.connect(direct_url(db), autocommit=True) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(f"SELECT count(*) FROM {USAGE_TABLE}").fetchone()
            held = conn.execute(f"SELECT count(*) FROM {RESERVATION_TABLE}").fetchone()
            assert rows is not None and held is not None
            if rows[0] == last and held[0] == 0:
                return
            last = rows[0]
            time.sleep(0.5)


def billing(db: str, sent: Counter[str]) -> tuple[list[str], bool]:
    """The usage rows per organization. Every answer wrk counted as 2xx has a served row priced at
    the static reply's usage (more served rows than answers: wrk stops counting with requests in
    flight). The other rows are those in-flight requests cut off at a cell's end."""
    with psycopg.connect(direct_url(db), autocommit=True) as conn:
        found = conn.execute(
            f"""SELECT o.slug, u.status, count(*),
                       count(*) FILTER (WHERE u.input_tokens = %s AND u.output_tokens = %s AND u.cost_nano > 0),
                       min(u.cost_nano), max(u.cost_nano)
                FROM {USAGE_TABLE} u JOIN {ORGANIZATION_TABLE} o ON o.id = u.organization_id
                GROUP BY o.slug, u.status""",
            (PROMPT_TOKENS, COMPLETION_TOKENS),
        ).fetchall()
    rows = [
        "| system | 2xx answers | served rows | served, priced at 100 + 3 tokens | cost per served row | other rows |",
        "|---|---:|---:|---:|---:|---|",
    ]
    ok = True
    for system in SYSTEMS[1:]:
        mine = {status: rest for slug, status, *rest in found if slug == system.org}
        served, priced, low, high = mine.pop("served", (0, 0, None, None))
        ok = ok and priced == served >= sent[system.org] > 0
        cost = "—" if low is None else (f"{low:,} nano-USD" if low == high else f"{low:,}–{high:,} nano-USD")
        other = ", ".join(f"{status} {rest[0]}" for status, rest in sorted(mine.items())) or "none"
        rows.append(f"| {system.label} | {sent[system.org]} | {served} | {priced} | {cost} | {other} |")
    return rows, ok


def capgate_packages() -> set[str]:
    return {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}


def frame_key(frame: str) -> tuple[str, str]:
    """'name (path/file.py:123)' -> ('name', 'path/file.py'): a function, whatever its line."""
    found = re.fullmatch(r"(.*) \((.*?)(?::\d+)?\)", frame)
    if found is None:
        return frame, ""
    return found.group(1), found.group(2)


def idle(frames: list[tuple[str, str]]) -> bool:
    """A sample of a thread waiting for work: an executor's or the database pool's idle worker,
    or the event loop waiting for events: in select (asyncio's loop), or with no Python frame
    above `Runner.run` (uvloop's, which uvicorn uses when installed: its poll is C; so is its
    own socket I/O, which this counts as idle too). Not hot-path time (a wait inside capgate's
    own code stays)."""
    name, path = frames[-1]
    if (name, path) == ("_worker", "concurrent/futures/thread.py") or path == "selectors.py":
        return True
    if (name, path) == ("Runner.run", "asyncio/runners.py"):
        return True
    callers = [f for f in frames if f[1] not in ("threading.py", "queue.py")]
    return path in ("threading.py", "queue.py") and bool(callers) and callers[-1][1].startswith("psycopg_pool/")


def top_functions(raw: str, packages: set[str], limit: int = 25) -> tuple[int, int, list[str]]:
    """From py-spy's raw (collapsed) stacks, idle threads left out: functions by inclusive time
    (capgate's own modules only) and by self time (any module), as markdown tables."""
    inclusive: Counter[tuple[str, str]] = Counter()
    own: Counter[tuple[str, str]] = Counter()
    busy = idled = 0
    prefix = str(ROOT) + "/"
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_key(f) for f in stack.split(";")]
        frames = [(name, path.removeprefix(prefix)) for name, path in frames]
        if idle(frames):
            idled += n
            continue
        busy += n
        for fn in set(frames):
            if fn[1].split("/", 1)[0] in packages:
                inclusive[fn] += n
        own[frames[-1]] += n
    out = []
    for title, counts in (("inclusive, capgate's modules", inclusive), ("self, any module", own)):
        out += [f"| function ({title}) | file | samples | share of busy |", "|---|---|---:|---:|"]
        for (name, path), n in counts.most_common(limit):
            out.append(f"| `{name}` | {path} | {n} | {n / max(busy, 1):.1%} |")
        out.append("")
    return busy, idled, out


def profile(gateway: Service, seconds: int, workers: int, connections: int) -> tuple[list[str], dict[str, float]]:
    """py-spy on the worker during an extra hot-run-cap cell at `connections`, written to var/."""
    out = ROOT / "var" / f"bench-ratio-profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.raw"
    # --nonblocking: sampling without stopping the worker, so the profiled cell runs near its speed.
    args = [
        str(BIN / "py-spy"),
        "record",
        "--nonblocking",
        "-r",
        "100",
        "-d",
        str(seconds + 1),
        "-f",
        "raw",
        "-o",
        str(out),
    ]
    args += ["--subprocesses", "-p", str(gateway.p.pid)] if workers > 1 else ["-p", str(gateway.workers()[0])]
    spy = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(1)  # attached before the load starts
        cell = wrk(HOT_RUN, connections, seconds)
        _, err = spy.communicate(timeout=seconds + 30)
    finally:
        if spy.poll() is None:
            os.killpg(spy.pid, signal.SIGKILL)
            spy.wait()
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed: {err.decode()[-2000:]}")
    busy, idled, tables = top_functions(out.read_text(), capgate_packages())
    whom = "each worker" if workers > 1 else "the worker"
    per_request = busy * 10 / max(cell["requests"], 1)  # 100 Hz: a sample is 10 ms of a thread
    return [
        f"py-spy --nonblocking at 100 Hz, every thread of {whom}, during a c={connections} hot-per-run-cap cell "
        f"({seconds} s, {cell['rps']:.0f} req/s and p50 {cell['p50']:.2f} ms under sampling): {busy} busy samples "
        f"({idled} of idle threads left out), {per_request:.2f} ms of busy thread time per request, "
        f"in {out.relative_to(ROOT)}.",
        "",
        *tables,
    ], cell


def environment(db: str, pgbouncer: bool, slices: bool) -> dict[str, str]:
    env = {**bench.env(db), "CAPGATE_SLICES": "true" if slices else "false"}
    if pgbouncer:  # as bench/scale.py: transaction mode, the slices' LISTEN direct
        env |= {
            "DATABASE_URL": f"postgres://capgate:capgate@127.0.0.1:16432/{db}",
            "CAPGATE_DB_POOLER": "transaction",
            "CAPGATE_LISTEN_DATABASE_URL": direct_url(db),
        }
    return env


def uvicorn(app: str, port: int, workers: int = 1) -> list[str]:
    args = [str(BIN / "uvicorn"), app, "--host", "127.0.0.1", "--port", str(port)]
    return args + ["--no-access-log", "--log-level", "warning"] + (["--workers", str(workers)] if workers > 1 else [])


def measure(args: argparse.Namespace, started: list[Service], nginx_dir: str) -> None:
    db, seconds = args.database, args.seconds
    load_start = loadavg()
    setup(db)
    Path(nginx_dir, "nginx.conf").write_text(nginx_config(nginx_dir))
    conf = ["/usr/sbin/nginx", "-p", nginx_dir, "-c", f"{nginx_dir}/nginx.conf", "-e", f"{nginx_dir}/error.log"]
    started.append(Service("nginx", conf, dict(os.environ)))
    reference = Service("reference", uvicorn("bench.reference_proxy:app", REF_PORT), {
            **os.environ, "REFERENCE_UPSTREAM": f"http://127.0.0.1:{UP_PORT}"
    })  # fmt: skip
    started.append(reference)
    gateway = Service("gateway", uvicorn("config.asgi:application", GW_PORT, args.workers), environment(
        db, args.pgbouncer, args.slices == "on"
    ))  # fmt: skip
    started.append(gateway)
    bench.wait_http(f"http://127.0.0.1:{GW_PORT}/v1/models", {"authorization": f"Bearer {NO_CAP.key}"})
    time.sleep(1 if args.workers == 1 else 3)  # every worker past its startup
    rss_started = max(rss_mib(pid) for pid in gateway.workers())

    cells: dict[System, tuple[dict[str, float], dict[str, float]]] = {}
    sent: Counter[str] = Counter()
    rows = [
        "| system | c=1 req/s | c=1 p50 ms | c=1 p99 ms | c=50 req/s | c=50 p50 ms | c=50 p99 ms | "
        "c=50 server CPU ms/req · % of a core | errors | non-2xx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    servers = {REF_PORT: reference.workers, GW_PORT: gateway.workers}
    for system in SYSTEMS:
        probe(system)
        warm = wrk(system, 50, 2)  # pools, caches, the run's budget
        one = wrk(system, 1, seconds)
        pids = servers[system.port]()
        cpu = cpu_seconds(pids)
        fifty = wrk(system, 50, seconds)
        used = cpu_seconds(pids) - cpu  # the server's CPU over wrk's run (and its own start and stop)
        fifty["cpu_ms"], fifty["cpu_share"] = used * 1000 / max(fifty["requests"], 1), used / fifty["seconds"]
        cells[system] = (one, fifty)
        sent[system.org] += 1 + sum(int(c["requests"] - c["non2xx"]) for c in (warm, one, fifty))
        rows.append(
            f"| {system.label} | {one['rps']:.0f} | {one['p50']:.2f} | {one['p99']:.2f} | {fifty['rps']:.0f} | "
            f"{fifty['p50']:.1f} | {fifty['p99']:.1f} | {fifty['cpu_ms']:.2f} · {fifty['cpu_share']:.0%} | "
            f"{int(one['errors'] + fifty['errors'])} | "
            f"{int(one['non2xx'] + fifty['non2xx'])} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
        if system.org:
            settle(db)
    rss_after = max(rss_mib(pid) for pid in gateway.workers())
    spied: list[str] = []
    if args.profile:
        spied, cell = profile(gateway, seconds, args.workers, args.profile_connections)
        sent[HOT_RUN.org] += int(cell["requests"] - cell["non2xx"])
        settle(db)
    bill, billed = billing(db, sent)
    load_end = loadavg()

    ref1, ref50 = cells[REFERENCE]
    derived = ["| system | added p50 at c=1 | c=50 share of the reference |", "|---|---:|---:|"]
    for system in SYSTEMS[1:]:
        one, fifty = cells[system]
        derived.append(f"| {system.label} | {one['p50'] - ref1['p50']:+.2f} ms | {fifty['rps'] / ref50['rps']:.1%} |")
    hot1, hot50 = cells[HOT_RUN]
    share, added = hot50["rps"] / ref50["rps"], hot1["p50"] - ref1["p50"]
    targets = [
        "| target | result | met? |",
        "|---|---|---|",
        f"| c=50 with one hot per-run cap ≥ 10 % of the reference's req/s | {hot50['rps']:.0f} / {ref50['rps']:.0f} "
        f"= {share:.1%} | {'met' if share >= 0.10 else '**missed**'} |",
        f"| c=1 added p50 (one hot per-run cap) ≤ 2 ms | {hot1['p50']:.2f} − {ref1['p50']:.2f} = {added:.2f} ms | "
        f"{'met' if added <= 2 else '**missed**'} |",
        f"| {'largest ' if args.workers > 1 else ''}worker RSS after the run ≤ {RSS_TARGET_MIB} MiB | "
        f"{rss_after:.0f} MiB (after startup {rss_started:.0f} MiB)"
        f" | {'met' if rss_after <= RSS_TARGET_MIB else '**missed**'} |",
    ]
    slices = args.slices
    print(
        f"# capgate vs the cap-less reference — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, load {load_start} at start, {load_end} at end\n\n"
        f"capgate: {args.workers} worker process(es), config.settings.prod, "
        f"{'through PgBouncer (transaction mode)' if args.pgbouncer else 'direct to Postgres'}, headroom slices "
        f"{slices}; upstream: nginx static reply ({PROMPT_TOKENS} prompt + {COMPLETION_TOKENS} completion tokens); "
        f"wrk {seconds} s per cell after a 2 s warm-up at c=50.\n"
    )
    print("\n".join(rows) + "\n")
    print("\n".join(derived) + "\n")
    print("\n".join(targets) + "\n")
    print("## Billing: the static reply recorded as a priced answer\n")
    print("\n".join(bill) + "\n")
    if spied:
        print("## Profile\n")
        print("\n".join(spied))
    if not billed:
        raise SystemExit("capgate did not bill every answer as a priced answer: see the billing table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per cell (at most 30)")
    parser.add_argument("--workers", type=int, default=1, help="capgate's uvicorn worker processes")
    parser.add_argument("--pgbouncer", action="store_true", help="capgate's database through PgBouncer :16432")
    parser.add_argument("--slices", choices=("on", "off"), default="on", help="headroom slices (CAPGATE_SLICES)")
    parser.add_argument("--profile", action="store_true", help="py-spy the worker during an extra hot-cap cell")
    parser.add_argument("--profile-connections", type=int, default=50, help="that cell's connections (default 50)")
    parser.add_argument("--database", default=DB, help=f"the bench's own database, dropped first (default {DB})")
    args = parser.parse_args()
    args.seconds = max(1, min(args.seconds, 30))
    check_database(args.database)
    missing = [
        pkg for pkg, path in (("wrk", shutil.which("wrk")), ("nginx", shutil.which("/usr/sbin/nginx"))) if not path
    ]
    if missing:  # policy-rc.d keeps the package's own nginx service from starting where it is present
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True)
    (ROOT / "var").mkdir(exist_ok=True)
    # A SIGTERM stops the bench through the `finally` below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started: list[Service] = []
    nginx_dir = tempfile.mkdtemp(prefix="capgate-ratio-nginx-")
    try:
        measure(args, started, nginx_dir)
    finally:
        for service in reversed(started):
            service.stop()
        shutil.rmtree(nginx_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
