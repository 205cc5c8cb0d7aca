#!/usr/bin/env python
"""Admission benchmark: how fast can one hot organization be admitted, next to what pgbench
reaches on the same Postgres with the same SQL (the database's own limit on this machine).

For 1 ceiling (an organization cap) and 3 stacked ceilings (organization + project + key caps)
at each client count, it runs for a fixed duration:

  threads     N Python threads in this process, each with its own DB connection, released by
              one barrier, admitting in a loop as the gateway does: matching_budgets(subject), then
              budgets.admission.admit(request=AdmissionRequest(..., budgets=budgets))
  processes   N forked processes doing the same, one connection each (the gateway runs several
              processes; threads share one GIL)
  pgbench     pgbench -c N -j N on bench/pgbench/admission_{1,3}.sql: the classic admission
              transaction (BEGIN; insert reservation; insert holds; SELECT .. FOR NO KEY UPDATE;
              UPDATE reserved; COMMIT) with Django's SQL: the issue's reference and the target's base
  pgbench-admit  pgbench on the script that issues exactly what admit() issues today, every round
              trip (found by comparing a libpq trace of admit() with bench/pgbench/admission_N_stmt.sql,
              the one-statement engine, and admission_N_full.sql, the classic one)

and, as extra rows, admit -> record -> drain cycles (workers admit and record; one drainer
thread applies the outbox every ~50 ms, as a gateway process does). It prints admissions/s and
p50/p99 latency per cell, checks the counters after every cell (reserved == sum of holds ==
admitted x worst case; after a cycle run: nothing reserved, spent == recorded cost, no
reservation left), and profiles one admit() (statements, round trips, Python vs database time).
With --whatif it also runs leaner admission engines written in this file (hand-written SQL; budgets
and windows cached per process; the classic transaction with that cache, for contrast) and pgbench
on the bare admission statement (bench/pgbench/admission_3_onestmt.sql), to size engine suggestions.

Budgets are $1,000,000 each (never refuse); reservations, holds and usage rows are truncated
and counters zeroed between cells. It uses its own database (default capgate_bench, created and
migrated here); it refuses to touch `capgate` or `test_*` databases.

Examples: .venv/bin/python bench/admission.py                      (about 2.5 minutes)
          .venv/bin/python bench/admission.py --clients 32 --ceilings 3 --repeat 3
          .venv/bin/python bench/admission.py --clients 1,32 --ceilings 3 --whatif
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
PGBENCH_DIR = Path(__file__).resolve().parent / "pgbench"
DEFAULT_DB_URL = "postgres://capgate:capgate@127.0.0.1:15432/capgate_bench"
BUDGET_NANO = 1_000_000 * 1_000_000_000  # $1M per budget: never refuses during a run
RUNNERS = ("threads", "processes", "pgbench", "pgbench-admit")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/admission.py",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=int, default=3, help="seconds per cell (default 3; pgbench -T takes whole seconds)")
    p.add_argument("--clients", type=_ints, default=[1, 8, 32, 64], help="client counts, comma separated (default 1,8,32,64)")
    p.add_argument("--ceilings", type=_ints, default=[1, 3], help="stacked ceilings per admission: 1 and/or 3 (default 1,3)")
    p.add_argument(
        "--runners",
        default=",".join(RUNNERS),
        help=f"comma separated subset of {','.join(RUNNERS)} (default: all)",
    )
    p.add_argument("--cycle-clients", type=_ints, default=[32], help="client counts for the admit->record->drain rows (3 ceilings; default 32; empty to skip)")
    p.add_argument("--repeat", type=int, default=1, help="run every cell N times; the table shows medians and the adm/s range (default 1)")
    p.add_argument("--worst-nano", type=int, default=37_000_000, help="worst case reserved per admission, nano-USD (default 37,000,000 = $0.037)")
    p.add_argument("--profile-calls", type=int, default=300, help="sequential admit() calls timed for the profile (0 skips the profile; default 300)")
    p.add_argument("--whatif", action="store_true", help="also measure leaner admission engines written in this file (hand-written SQL, cached budgets/windows, the classic transaction for contrast) at --whatif-clients, 3 ceilings, to size engine suggestions (adds ~100 s)")
    p.add_argument("--whatif-clients", type=_ints, default=[1, 32], help="client counts for --whatif (default 1,32)")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval() for the workers, seconds (default: Python's 0.005); shows how much of the threads' lock hold is GIL waiting")
    p.add_argument("--quiet-below", type=float, default=100.0, help="before each cell, wait until the host's background CPU busy %% is below this (default 100: never wait)")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="longest wait per cell for --quiet-below, seconds (default 60)")
    p.add_argument("--db-url", default=DEFAULT_DB_URL, help=f"benchmark database, created if missing (default {DEFAULT_DB_URL})")
    p.add_argument("--settings", default="config.settings.prod", help="Django settings module (default config.settings.prod: DEBUG off, psycopg pool on)")
    p.add_argument("--pgbench", default="pgbench", help="pgbench executable (default: pgbench on PATH)")
    p.add_argument("--out", type=Path, help="also write the report (markdown) to this file")
    args = p.parse_args(argv)
    args.runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    bad = set(args.runners) - set(RUNNERS)
    if bad:
        p.error(f"unknown runner(s): {', '.join(sorted(bad))}")
    if set(args.ceilings) - {1, 3}:
        p.error("--ceilings takes 1 and/or 3")
    if args.duration < 1:
        p.error("--duration must be >= 1")
    return args


# --- database and Django setup ---------------------------------------------------------------


@dataclass(frozen=True)
class Db:
    host: str
    port: int
    user: str
    password: str
    name: str


def parse_db_url(url: str) -> Db:
    u = urlsplit(url)
    return Db(
        host=u.hostname or "127.0.0.1",
        port=u.port or 5432,
        user=unquote(u.username or ""),
        password=unquote(u.password or ""),
        name=u.path.lstrip("/"),
    )


def create_database(db: Db) -> None:
    if db.name == "capgate" or db.name.startswith("test_") or not db.name:
        sys.exit(f"refusing to benchmark in database {db.name!r}: use a dedicated one (e.g. capgate_bench)")
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=db.host, port=db.port, user=db.user, password=db.password, dbname="postgres", autocommit=True
    ) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db.name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.name)))


def setup_django(args: argparse.Namespace) -> None:
    max_clients = max([*args.clients, *args.cycle_clients, *(args.whatif_clients if args.whatif else []), 1])
    os.environ["DATABASE_URL"] = args.db_url
    os.environ["DJANGO_SETTINGS_MODULE"] = args.settings
    # Production settings refuse to start without real secrets; the bench is loopback-only.
    os.environ.setdefault("DJANGO_SECRET_KEY", "capgate-bench-only-django-secret-key-never-deployed-0")
    os.environ.setdefault("CAPGATE_SECRET_KEY", "capgate-bench-only-connection-secret-key")
    # Every thread holds its own pooled connection for a whole cell (plus the drainer and main).
    os.environ["CAPGATE_DB_POOL_MAX"] = str(max_clients + 4)
    os.environ["CAPGATE_DB_POOL_MIN"] = "1"
    # Opening 64 connections on a busy 2-core machine can take longer than the default 10 s.
    os.environ["CAPGATE_DB_POOL_TIMEOUT"] = "120"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# --- the hot organizations -------------------------------------------------------------------


@dataclass
class Tenant:
    ceilings: int
    subject: object  # budgets.admission.Subject
    org_id: int
    project_id: int
    key_id: int
    budget_ids: list[int]
    window_ids: list[int]  # ascending, parallel to budget_ids sorted by window id
    period_start: dt.datetime
    admit_sql: list[str] = field(default_factory=list)  # what one admit() sends (libpq trace)
    admit_script: Path | None = None  # the pgbench script with the same statements


def ensure_tenant(ceilings: int) -> Tenant:
    from django.utils import timezone

    from budgets.admission import Subject, ensure_windows, matching_budgets
    from budgets.models import Budget
    from tenants.models import ApiKey, Organization, Project

    org, _ = Organization.objects.get_or_create(slug=f"bench-{ceilings}-ceiling", defaults={"name": f"Bench {ceilings} ceiling"})
    project, _ = Project.objects.get_or_create(organization=org, slug="main", defaults={"name": "Main"})
    key = ApiKey.objects.filter(organization=org, name="bench").first()
    if key is None:
        _raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(organization=org, project=project, name="bench", prefix=prefix, key_hash=digest)
    wanted = [("organization", {})]
    if ceilings == 3:
        wanted += [("project", {"project": project}), ("key", {"api_key": key})]
    for scope, kw in wanted:
        Budget.objects.update_or_create(
            organization=org, scope=scope, **kw,
            defaults={"mode": "block", "period": "month", "timezone": "UTC", "amount_nano": BUDGET_NANO},
        )
    # The subject always names its project and key, as the gateway's does; the 1-ceiling
    # organization simply has no project or key budget.
    subject = Subject(organization_id=org.id, project_id=project.id, api_key_id=key.id)
    budgets = matching_budgets(subject)
    assert len(budgets) == ceilings and all(b.mode == "block" for b in budgets), budgets
    window_of = ensure_windows(budgets=budgets, now=timezone.now())
    pairs = sorted((window_of[b.id], b.id) for b in budgets)
    from budgets.models import Window

    return Tenant(
        ceilings=ceilings,
        subject=subject,
        org_id=org.id,
        project_id=project.id,
        key_id=key.id,
        budget_ids=[b for _, b in pairs],
        window_ids=[w for w, _ in pairs],
        period_start=Window.objects.get(id=pairs[0][0]).period_start,
    )


def reset(tenants: list[Tenant]) -> None:
    """Empty the reservation/hold/usage tables, zero the counters, vacuum the hot rows."""
    from django.db import connection

    from budgets.models import Hold, Reservation, Window
    from usage.models import UsageRecord

    tables = ", ".join(f'"{m._meta.db_table}"' for m in (UsageRecord, Hold, Reservation))
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {tables} CASCADE")  # bench database only
        Window.objects.filter(id__in=[w for t in tenants for w in t.window_ids]).update(reserved_nano=0, spent_nano=0)
        cur.execute(f'VACUUM (ANALYZE) "{Window._meta.db_table}", {tables}')


def close_db() -> None:
    """Close this thread's connection and the shared pool (before forking workers)."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()


# --- measuring -------------------------------------------------------------------------------


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat (0, 0 where unavailable)."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def background_cpu(seconds: float = 0.4) -> float:
    """Host CPU busy % while this benchmark is idle: the noise from whatever else runs."""
    busy0, total0 = cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = cpu_ticks()
    return 100.0 * (busy1 - busy0) / (total1 - total0) if total1 > total0 else float("nan")


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


@dataclass
class Cell:
    runner: str
    ceilings: int
    clients: int
    mode: str = "admit"  # admit | cycle
    count: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds
    py_cpu: float = 0.0  # CPU seconds spent by the Python workers (threads: their own threads)
    host_cpu_pct: float = float("nan")
    bg_cpu_pct: float = float("nan")  # host CPU busy just before the cell: other people's load
    lock_stmt_ms: float = float("nan")  # mean duration of the statement that locks the windows
    held_ms: float = float("nan")  # mean time the lock stayed held after that statement returned
    # ... split into: Python until the UPDATE was sent, the UPDATE round trip, UPDATE return -> committed
    held_split: tuple[float, float, float] | None = None
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    check: str = ""
    note: str = ""

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed else 0.0

    @property
    def p50_ms(self) -> float:
        return pct(self.latencies, 0.50) * 1e3

    @property
    def p99_ms(self) -> float:
        return pct(self.latencies, 0.99) * 1e3


def production_admit(subject, request_id: str, worst: int):
    """Admit the way the gateway does (gateway/service.py): look up the subject's budgets, then
    admit(request=AdmissionRequest(..., budgets=budgets)). With an engine whose AdmissionRequest
    takes no budgets, admit() looks them up itself — the same statements either way."""
    from budgets.admission import AdmissionRequest, admit, matching_budgets

    if "budgets" in getattr(AdmissionRequest, "__dataclass_fields__", {}):
        budgets = matching_budgets(subject)
        return admit(request=AdmissionRequest(subject=subject, request_id=request_id, worst_nano=worst, budgets=budgets))
    return admit(request=AdmissionRequest(subject=subject, request_id=request_id, worst_nano=worst))


def _admit_once(subject, worst: int, cost: int, mode: str, request_id: str) -> float:
    """One admission (and its usage record in cycle mode); returns when the admission committed."""
    if mode in WHATIF:
        WHATIF[mode](subject, request_id, worst)
        return time.perf_counter()
    admitted = production_admit(subject, request_id, worst)
    committed = time.perf_counter()
    if mode == "cycle":
        from usage.recording import Outcome, record

        record(reservation=admitted.reservation, outcome=Outcome(status="served", cost_nano=cost))
    return committed


class LockTimer:
    """execute_wrapper for a worker's connection: times the statement that locks the windows
    (waiting for the hot rows + reading them) and the UPDATE that follows it, so the worker can
    split how long the lock stayed held after it: Python until the UPDATE is sent, the UPDATE's
    round trip, and from its return until COMMIT returned."""

    def __init__(self) -> None:
        self.lock_returned: float | None = None
        self.lock_stmt: float = 0.0
        self.update_sent: float | None = None
        self.update_returned: float | None = None

    def __call__(self, execute, sql, params, many, context):
        locking = "FOR NO KEY UPDATE" in sql and "budgets_usagerecord" not in sql
        updating = self.lock_returned is not None and self.update_sent is None and sql.lstrip().upper().startswith("UPDATE")
        if not (locking or updating):
            return execute(sql, params, many, context)
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            t1 = time.perf_counter()
            if locking:
                self.lock_returned, self.lock_stmt = t1, t1 - t0
            else:
                self.update_sent, self.update_returned = t0, t1

    def reset(self) -> None:
        self.lock_returned = self.update_sent = self.update_returned = None


def _worker(index: int, barrier, subject, worst: int, cost: int, mode: str, duration: float, tag: str) -> dict:
    """Connect, warm up (one admission, not timed), wait at the barrier, admit until the deadline."""
    from django.db import connection

    from budgets.errors import BudgetExceeded

    try:
        connection.ensure_connection()
        _admit_once(subject, worst, cost, mode, f"{tag}-{index}-warm")
    except BaseException as exc:
        barrier.abort()
        return {"fatal": f"warm-up: {type(exc).__name__}: {exc}", "warm": 0}
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        return {"fatal": "BrokenBarrierError: another worker failed before the start", "warm": 1}
    lat: list[float] = []
    lock_stmt: list[float] = []
    held: list[float] = []
    split: list[tuple[float, float, float]] = []
    refused = 0
    errors: list[str] = []
    timer = LockTimer()
    cpu0 = time.thread_time()
    start = time.monotonic()
    deadline = start + duration
    i = 0
    with connection.execute_wrapper(timer):
        while time.monotonic() < deadline:
            i += 1
            timer.reset()
            t0 = time.perf_counter()
            try:
                committed = _admit_once(subject, worst, cost, mode, f"{tag}-{index}-{i}")
            except BudgetExceeded:
                refused += 1
                continue
            except Exception as exc:  # reported in the table, never hidden
                errors.append(f"{type(exc).__name__}: {exc}")
                if len(errors) > 20:
                    break
                continue
            lat.append(time.perf_counter() - t0)
            if timer.lock_returned is not None:
                lock_stmt.append(timer.lock_stmt)
                held.append(committed - timer.lock_returned)
                if timer.update_sent is not None:
                    split.append((timer.update_sent - timer.lock_returned, timer.update_returned - timer.update_sent,
                                  committed - timer.update_returned))
    end = time.monotonic()
    return {
        "lat": lat, "refused": refused, "errors": errors, "start": start, "end": end,
        "cpu": time.thread_time() - cpu0, "warm": 1, "lock_stmt": lock_stmt, "held": held, "split": split,
    }


class Drainer(threading.Thread):
    """What each gateway process does: drain the outbox in micro-batches every ~50 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.batches = 0
        self.drained = 0
        self.error: str | None = None

    def run(self) -> None:
        from django.db import connection

        from usage.drain import drain

        try:
            while not self.stop.is_set():
                n = drain(limit=500)
                if n:
                    self.batches += 1
                    self.drained += n
                if n < 500:
                    self.stop.wait(0.05)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()


def _thread_target(results: list, i: int, *args) -> None:
    from django.db import connection

    try:
        results[i] = _worker(i, *args)
    except BaseException as exc:
        results[i] = {"fatal": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()


def _process_target(queue, i: int, *args) -> None:
    from django.db import connections

    # A worker process holds one connection for the whole cell: open it directly, without a
    # pool (no pool threads started in a forked child).
    settings_dict = connections["default"].settings_dict
    settings_dict["OPTIONS"] = {k: v for k, v in settings_dict.get("OPTIONS", {}).items() if k != "pool"}
    try:
        queue.put(_worker(i, *args))
    except BaseException as exc:
        queue.put({"fatal": f"{type(exc).__name__}: {exc}"})
    finally:
        close_db()


def run_python_cell(runner: str, tenant: Tenant, clients: int, mode: str, args: argparse.Namespace) -> Cell:
    cost = args.worst_nano // 4  # cycle: the provider billed a quarter of the worst case
    tag = uuid.uuid4().hex[:12]
    cell = Cell(runner=runner, ceilings=tenant.ceilings, clients=clients, mode=mode)
    drainer = Drainer() if mode == "cycle" else None
    common = (tenant.subject, args.worst_nano, cost, mode, float(args.duration), tag)
    if runner == "threads":
        barrier = threading.Barrier(clients + 1)
        results: list = [None] * clients
        workers = [threading.Thread(target=_thread_target, args=(results, i, barrier, *common)) for i in range(clients)]
        for w in workers:
            w.start()
        if drainer:
            drainer.start()
        busy0, total0 = _release(barrier)
        for w in workers:
            w.join()
    else:
        ctx = mp.get_context("fork")
        close_db()  # children must not share the parent's sockets or pool
        barrier = ctx.Barrier(clients + 1)
        queue = ctx.Queue()
        workers = [ctx.Process(target=_process_target, args=(queue, i, barrier, *common)) for i in range(clients)]
        for w in workers:
            w.start()
        if drainer:
            drainer.start()  # after forking: no pool threads in the parent at fork time
        busy0, total0 = _release(barrier)
        results = []
        for _ in workers:
            try:
                results.append(queue.get(timeout=args.duration + 300))
            except Exception as exc:  # a worker died without reporting
                results.append({"fatal": f"no result: {exc!r}"})
        for w in workers:
            w.join(timeout=30)
    busy1, total1 = cpu_ticks()
    if total1 > total0:
        cell.host_cpu_pct = 100.0 * (busy1 - busy0) / (total1 - total0)
    if drainer:
        drainer.stop.set()
        drainer.join()
    fatal = ["worker lost" if r is None else r["fatal"] for r in results if r is None or "fatal" in r]
    fatal.sort(key=lambda e: "BrokenBarrierError" in e)  # the cause first
    ok = [r for r in results if r and "fatal" not in r]
    cell.errors = fatal + [e for r in ok for e in r["errors"]]
    cell.refused = sum(r["refused"] for r in ok)
    cell.latencies = sorted(x for r in ok for x in r["lat"])
    cell.count = len(cell.latencies)
    cell.py_cpu = sum(r["cpu"] for r in ok)
    lock_stmt = [x for r in ok for x in r["lock_stmt"]]
    held = [x for r in ok for x in r["held"]]
    if lock_stmt:
        cell.lock_stmt_ms = statistics.fmean(lock_stmt) * 1e3
        cell.held_ms = statistics.fmean(held) * 1e3
    split = [x for r in ok for x in r.get("split", [])]
    if split:
        cell.held_split = tuple(statistics.fmean(x[k] for x in split) * 1e3 for k in range(3))
    if ok:
        cell.elapsed = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    admitted = cell.count + sum(r.get("warm", 0) for r in results if r)
    if mode == "cycle":
        from usage.drain import drain_all

        drain_all()
        cell.check = check_cycle(tenant, admitted, cost)
        if drainer and drainer.batches:
            cell.note = f"drainer: {drainer.batches} batches, {drainer.drained / drainer.batches:.0f} records/batch"
        if drainer and drainer.error:
            cell.errors.append(f"drainer: {drainer.error}")
    else:
        cell.check = check_reserved(tenant, admitted, args.worst_nano)
    return cell


def _release(barrier) -> tuple[int, int]:
    """Wait until every worker is connected and warm, then let them go together."""
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass  # a worker failed before the start; its error is in its result
    return cpu_ticks()


def check_reserved(tenant: Tenant, admitted: int, worst: int) -> str:
    """reserved == sum of live holds == admitted x worst on every ceiling; one reservation each."""
    from django.db.models import Sum

    from budgets.models import Hold, Reservation, Window

    problems = []
    for w in Window.objects.filter(id__in=tenant.window_ids).order_by("id"):
        held = Hold.objects.filter(window_id=w.id).aggregate(s=Sum("amount_nano"))["s"] or 0
        if not (w.reserved_nano == held == admitted * worst):
            problems.append(f"window {w.id}: reserved {w.reserved_nano}, holds {held}, expected {admitted * worst}")
    n = Reservation.objects.filter(organization_id=tenant.org_id).count()
    if n != admitted:
        problems.append(f"{n} reservations for {admitted} admissions")
    return "ok" if not problems else "FAIL " + "; ".join(problems)


def check_cycle(tenant: Tenant, admitted: int, cost: int) -> str:
    """After the drain: nothing reserved, spent == recorded cost, no reservation or hold left,
    one applied usage row per admission (the four properties, read from the database)."""
    from budgets.models import Hold, Reservation, Window
    from usage.models import UsageRecord

    problems = []
    for w in Window.objects.filter(id__in=tenant.window_ids).order_by("id"):
        if w.reserved_nano != 0 or w.spent_nano != admitted * cost:
            problems.append(f"window {w.id}: reserved {w.reserved_nano}, spent {w.spent_nano}, expected spent {admitted * cost}")
    left = Reservation.objects.filter(organization_id=tenant.org_id).count()
    holds = Hold.objects.filter(window_id__in=tenant.window_ids).count()
    rows = UsageRecord.objects.filter(organization_id=tenant.org_id)
    n_rows, n_unapplied = rows.count(), rows.filter(applied=False).count()
    if left or holds:
        problems.append(f"{left} reservations / {holds} holds left")
    if n_rows != admitted or n_unapplied:
        problems.append(f"{n_rows} usage rows ({n_unapplied} unapplied) for {admitted} admissions")
    return "ok" if not problems else "FAIL " + "; ".join(problems)


# --- what-if engines (measurements for suggestions; not production code) ----------------------
#
# Same semantics as admit() for the benchmark's subjects (organization / project / key budgets,
# all blocking, windows already created), written leaner ways to put numbers on the engine
# suggestions in docs/performance.md. They pass the same counter checks as admit() after every
# cell. The cache is per process, lives CACHE_TTL seconds and never past the period's end.

_CACHE: dict = {}  # subject -> (expires monotonic, period end, window ids)
CACHE_TTL = 5.0


def _raw_windows(cur, subject, now) -> tuple[list[int], dt.datetime | None, list[tuple]]:
    """matching_budgets() + current_windows() as two hand-written statements: window ids in id
    order, the earliest period end, and (window, budget, scope, amount, spent, reserved) rows."""
    from budgets.periods import period_bounds

    cond, params = ["scope = 'organization'"], []
    for scope, value in (("project", subject.project_id), ("api_key", subject.api_key_id)):
        if value is not None:
            cond.append(f"({scope}_id = %s AND scope = %s)")
            params += [value, "key" if scope == "api_key" else scope]
    cur.execute(
        f"SELECT id, scope, period, timezone, amount_nano FROM budgets_budget WHERE ({' OR '.join(cond)}) "
        "AND organization_id = %s AND mode = 'block' ORDER BY id",
        [*params, subject.organization_id],
    )
    budgets = {bid: (scope, period, tz, amount) for bid, scope, period, tz, amount in cur.fetchall()}
    bounds = {bid: period_bounds(period=period, tz=tz, now=now) for bid, (_s, period, tz, _a) in budgets.items()}
    cur.execute(
        "SELECT w.id, w.budget_id, w.spent_nano, w.reserved_nano FROM budgets_window w "
        "JOIN unnest(%s::bigint[], %s::timestamptz[]) AS k(b, s) ON w.budget_id = k.b AND w.period_start = k.s "
        "ORDER BY w.id",
        [list(bounds), [start for start, _end in bounds.values()]],
    )
    rows = [(w, b, budgets[b][0], budgets[b][3], spent, reserved) for w, b, spent, reserved in cur.fetchall()]
    assert len(rows) == len(budgets), "what-if engines expect existing windows"
    ends = [end for _start, end in bounds.values() if end is not None]
    return [r[0] for r in rows], (min(ends) if ends else None), rows


def _cached_windows(cur, subject, now) -> list[int]:
    hit = _CACHE.get(subject)
    if hit and time.monotonic() < hit[0] and (hit[1] is None or now < hit[1]):
        return hit[2]
    ids, period_end, _rows = _raw_windows(cur, subject, now)
    _CACHE[subject] = (time.monotonic() + CACHE_TTL, period_end, ids)
    return ids


def _reservation_params(subject, request_id: str, worst: int, now) -> list:
    from django.conf import settings

    return [
        uuid.uuid4(), request_id, subject.organization_id, subject.project_id, subject.api_key_id, worst,
        now, now + settings.CAPGATE["LEASE"], now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
    ]


def _refuse_if_needed(rows, worst: int) -> None:
    from budgets.admission import Ceiling, _refusal

    ceilings = [
        Ceiling(window_id=w, budget_id=b, scope=scope, code="customer_budget" if scope == "end_customer" else f"{scope}_budget",
                limit_nano=amount, spent_nano=spent, reserved_nano=reserved)
        for w, b, scope, amount, spent, reserved in rows
    ]
    refusal = _refusal(ceilings, worst)
    if refusal is not None:
        raise refusal


# One statement, run in autocommit: lock the windows in id order, check room, add the worst case,
# insert the reservation and its holds, all or nothing; COMMIT happens inside the same round trip,
# so the row lock is never held across a client round trip (or a GIL wait).
ONE_STATEMENT = (
    "WITH l AS (SELECT w.id, w.budget_id, b.scope, b.amount_nano, w.spent_nano, w.reserved_nano, "
    "  w.spent_nano + w.reserved_nano + %(worst)s <= b.amount_nano AS fits "
    "  FROM budgets_window w JOIN budgets_budget b ON b.id = w.budget_id "
    "  WHERE w.id = ANY(%(ids)s) ORDER BY w.id FOR NO KEY UPDATE OF w), "
    "ok AS (SELECT count(*) = cardinality(%(ids)s::bigint[]) AND bool_and(fits) AS ok FROM l), "
    "u AS (UPDATE budgets_window w SET reserved_nano = w.reserved_nano + %(worst)s FROM ok "
    "  WHERE ok.ok AND w.id = ANY(%(ids)s) RETURNING w.id), "
    "r AS (INSERT INTO budgets_reservation (id, request_id, organization_id, project_id, member_id, api_key_id, "
    "  end_customer_id, run_id, model, amount_nano, owner_id, created_at, expires_at, deadline_at, job_id) "
    "  SELECT %(rid)s, %(request_id)s, %(org)s, %(project)s, NULL, %(key)s, NULL, NULL, '', %(worst)s, NULL, "
    "  %(now)s, %(expires)s, %(deadline)s, NULL FROM ok WHERE ok.ok RETURNING id), "
    "h AS (INSERT INTO budgets_hold (reservation_id, window_id, amount_nano) "
    "  SELECT r.id, x.w, %(worst)s FROM r, unnest(%(ids)s::bigint[]) AS x(w) RETURNING 1) "
    "SELECT l.id, l.budget_id, l.scope, l.amount_nano, l.spent_nano, l.reserved_nano, "
    "  (SELECT count(*) FROM u), (SELECT count(*) FROM h) FROM l ORDER BY l.id"
)


def _one_statement(cur, ids, subject, request_id: str, worst: int, now) -> None:
    rid, request_id, org, project, key, worst, now, expires, deadline = _reservation_params(subject, request_id, worst, now)
    cur.execute(ONE_STATEMENT, {
        "worst": worst, "ids": ids, "rid": rid, "request_id": request_id, "org": org, "project": project,
        "key": key, "now": now, "expires": expires, "deadline": deadline,
    })
    rows = cur.fetchall()
    if not rows or len(rows) != len(ids) or rows[0][6] != len(ids):
        _refuse_if_needed([r[:6] for r in rows], worst)
        raise RuntimeError(f"one-statement admission did not apply: {rows}")


def admit_raw_3rt(subject, request_id: str, worst: int) -> None:
    """admit()'s one-statement shape with hand-written SQL: two reads (+ the unlocked pre-check)
    and the admission statement — 3 round trips, no ORM."""
    from django.db import connection
    from django.utils import timezone

    now = timezone.now()
    with connection.cursor() as cur:
        ids, _end, rows = _raw_windows(cur, subject, now)
        _refuse_if_needed(rows, worst)
        _one_statement(cur, ids, subject, request_id, worst, now)


def admit_cached_1rt(subject, request_id: str, worst: int) -> None:
    """Hand-written SQL, budgets/windows cached per process: the admission statement only."""
    from django.db import connection
    from django.utils import timezone

    now = timezone.now()
    with connection.cursor() as cur:
        _one_statement(cur, _cached_windows(cur, subject, now), subject, request_id, worst, now)


def admit_cached_6rt(subject, request_id: str, worst: int) -> None:
    """The classic transaction (BEGIN; reservation; holds; SELECT .. FOR NO KEY UPDATE; UPDATE;
    COMMIT) with hand-written SQL and the same cache: the lock is held across three client round
    trips. Against cached-1rt it isolates what holding the lock across round trips costs."""
    from django.db import connection, transaction
    from django.utils import timezone

    now = timezone.now()
    with connection.cursor() as cur:
        ids = _cached_windows(cur, subject, now)
        params = _reservation_params(subject, request_id, worst, now)
        with transaction.atomic():
            cur.execute(
                "INSERT INTO budgets_reservation (id, request_id, organization_id, project_id, member_id, api_key_id, "
                "end_customer_id, run_id, model, amount_nano, owner_id, created_at, expires_at, deadline_at, job_id) "
                "VALUES (%s, %s, %s, %s, NULL, %s, NULL, NULL, '', %s, NULL, %s, %s, %s, NULL)",
                params,
            )
            cur.execute(
                "INSERT INTO budgets_hold (reservation_id, window_id, amount_nano) "
                "SELECT %s, w, %s FROM unnest(%s::bigint[]) AS w",
                [params[0], worst, ids],
            )
            cur.execute(
                "SELECT w.id, w.budget_id, b.scope, b.amount_nano, w.spent_nano, w.reserved_nano FROM budgets_window w "
                "JOIN budgets_budget b ON b.id = w.budget_id WHERE w.id = ANY(%s) ORDER BY w.id FOR NO KEY UPDATE OF w",
                [ids],
            )
            _refuse_if_needed(cur.fetchall(), worst)
            cur.execute("UPDATE budgets_window SET reserved_nano = reserved_nano + %s WHERE id = ANY(%s)", [worst, ids])


WHATIF = {
    "raw-3rt": admit_raw_3rt,
    "cached-1rt": admit_cached_1rt,
    "cached-6rt": admit_cached_6rt,
}


# --- pgbench ---------------------------------------------------------------------------------


def pgbench_script(ceilings: int, kind: str = "") -> Path:
    """kind "": the classic transaction; "full": with its two reads; "stmt": the one-statement engine."""
    return PGBENCH_DIR / f"admission_{ceilings}{'_' + kind if kind else ''}.sql"


def match_admit_script(tenant: Tenant) -> Path | None:
    """The script whose statements are admit()'s (compared by verb and table, in order)."""
    got = [signature(q) for q in tenant.admit_sql]
    for kind in ("stmt", "full"):
        path = pgbench_script(tenant.ceilings, kind)
        if path.exists() and script_signatures(path) == got:
            return path
    return None


def pgbench_defines(tenant: Tenant, worst: int) -> list[str]:
    d = {"org": tenant.org_id, "project": tenant.project_id, "key": tenant.key_id, "worst": worst}
    for i, (w, b) in enumerate(zip(tenant.window_ids, tenant.budget_ids, strict=True), start=1):
        d[f"w{i}"] = w
        d[f"b{i}"] = b
    d["pstart"] = f"'{tenant.period_start.isoformat(sep=' ')}'::timestamptz"
    return [x for k, v in d.items() for x in ("-D", f"{k}={v}")]


def run_pgbench_cell(runner: str, tenant: Tenant, clients: int, args: argparse.Namespace, db: Db) -> Cell:
    cell = Cell(runner=runner, ceilings=tenant.ceilings, clients=clients)
    if runner == "pgbench-1stmt":
        script = PGBENCH_DIR / "admission_3_onestmt.sql"
    elif runner == "pgbench-admit":
        script = tenant.admit_script
        if script is None:
            cell.errors.append("no script in bench/pgbench has admit()'s statements (see the profile)")
            return cell
    else:
        script = pgbench_script(tenant.ceilings)
    close_db()
    with tempfile.TemporaryDirectory(prefix="capgate-pgbench-") as tmp:
        cmd = [
            args.pgbench, "-n", "-r", "-M", "simple", "-f", str(script), "-c", str(clients), "-j", str(clients),
            "-T", str(args.duration), "-l", "--log-prefix", f"{tmp}/tx",
            "-h", db.host, "-p", str(db.port), "-U", db.user,
            *pgbench_defines(tenant, args.worst_nano), db.name,
        ]
        env = {**os.environ, "PGPASSWORD": db.password}
        busy0, total0 = cpu_ticks()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.duration + 120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            cell.errors.append(f"pgbench: {exc}")
            return cell
        busy1, total1 = cpu_ticks()
        if total1 > total0:
            cell.host_cpu_pct = 100.0 * (busy1 - busy0) / (total1 - total0)
        out = proc.stdout + proc.stderr
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        processed = re.search(r"number of transactions actually processed: (\d+)", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        if proc.returncode != 0 or not tps or not processed:
            cell.errors.append(f"pgbench exit {proc.returncode}: {out.strip()[-400:]}")
            return cell
        lat = []
        for log in Path(tmp).glob("tx*"):
            for line in log.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]) / 1e6)
        cell.latencies = sorted(lat)
        cell.count = int(processed.group(1))
        cell.elapsed = cell.count / float(tps.group(1)) if float(tps.group(1)) else 0.0
        # -r: mean latency per statement; the locking one, and what follows it (lock still held).
        stmts = re.findall(r"^\s+([\d.]+)\s+\d+\s+(\S.*)$", out.split("statement latencies", 1)[-1], re.MULTILINE)
        # (pgbench cuts the text at ~120 characters: recognise the locking statement by its start)
        locking = [k for k, (_ms, text) in enumerate(stmts) if text.startswith(('SELECT "budgets_window"."id"', "WITH l AS", "WITH ceilings"))]
        if locking:
            k = locking[0]
            cell.lock_stmt_ms = float(stmts[k][0])
            cell.held_ms = sum(float(ms) for ms, _text in stmts[k + 1:])
        if failed and int(failed.group(1)):
            cell.errors.append(f"{failed.group(1)} failed transactions")
    cell.check = check_reserved_pgbench(tenant, cell.count, args.worst_nano)
    return cell


def check_reserved_pgbench(tenant: Tenant, processed: int, worst: int) -> str:
    # pgbench's reservations carry the same organization, so the same check applies.
    return check_reserved(tenant, processed, worst)


# --- profile of one admit() ------------------------------------------------------------------

_LABELS = [
    ("budgets_budget", "SELECT", "matching_budgets(): the subject's budgets"),
    ("budgets_window", "SELECT", "ensure_windows(): current window ids (no lock)"),
    ("budgets_reservation", "INSERT", "BEGIN + INSERT reservation (psycopg sends BEGIN first)"),
    ("budgets_hold", "INSERT", "INSERT holds (one statement, UNNEST)"),
    ("budgets_window", "SELECT", "lock the windows: SELECT .. FOR NO KEY UPDATE, id order"),
    ("budgets_window", "UPDATE", "UPDATE windows SET reserved += worst"),
]


def signature(sql: str) -> tuple[str, str]:
    """(verb, first table) of a statement: enough to compare admit() with the pgbench scripts."""
    s = sql.strip().strip('"').lstrip("(").strip()
    verb = s.split(None, 1)[0].upper() if s else ""
    m = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', s, re.IGNORECASE)
    return verb, (m.group(1) if m and verb not in ("BEGIN", "COMMIT") else "")


def script_signatures(path: Path) -> list[tuple[str, str]]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith(("--", "\\")))
    return [signature(stmt) for stmt in text.split(";") if stmt.strip()]


def trace_round_trips(tenant: Tenant, worst: int) -> list[str]:
    """The protocol messages one admit() sends (libpq trace): every Query is one round trip."""
    from django.db import connection


    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as f:
        pgconn.trace(f.fileno())
        try:
            from psycopg import pq

            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        except Exception:
            pass
        try:
            production_admit(tenant.subject, f"trace-{uuid.uuid4().hex}", worst)
        finally:
            pgconn.untrace()
        f.seek(0)
        messages: list[str] = []
        for line in f.read().splitlines():
            if line.startswith(("F\t", "B\t")) or not messages:
                messages.append(line)
            else:  # a query's text may span lines
                messages[-1] += " " + line.strip()
    sent = []
    for msg in messages:
        parts = msg.split("\t", 3)
        if len(parts) >= 4 and parts[0] == "F" and parts[2] in ("Query", "Parse"):
            sent.append(" ".join(parts[3].split()))
    return sent


def profile(tenant: Tenant, args: argparse.Namespace) -> list[str]:
    """Statements, round trips and where the time of one admit() goes (sequential calls)."""
    from django.db import connection, connections


    out: list[str] = []
    sent = trace_round_trips(tenant, args.worst_nano)
    n = args.profile_calls
    marks: list[tuple[str, float, float, float, float]] = []  # (sql, wall0, wall1, cpu0, cpu1)

    def wrapper(execute, sql, params, many, context):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return execute(sql, params, many, context)
        finally:
            marks.append((sql, w0, time.perf_counter(), c0, time.thread_time()))

    wrapped = connections["default"]
    real_commit = wrapped.commit

    def timed_commit():
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return real_commit()
        finally:
            marks.append(("COMMIT", w0, time.perf_counter(), c0, time.thread_time()))

    per_call: list[list[tuple[float, float, float, float]]] = []  # per segment: (py wall, py cpu, db wall, db cpu)
    totals: list[tuple[float, float]] = []
    sqls: list[str] = []
    wrapped.commit = timed_commit
    try:
        with connection.execute_wrapper(wrapper):
            for i in range(n + 20):
                marks.clear()
                w0, c0 = time.perf_counter(), time.thread_time()
                production_admit(tenant.subject, f"prof-{uuid.uuid4().hex}-{i}", args.worst_nano)
                w1, c1 = time.perf_counter(), time.thread_time()
                if i < 20:
                    continue  # warm-up
                segs = []
                pw, pc = w0, c0
                for _sql, a, b, ca, cb in marks:
                    segs.append((a - pw, ca - pc, b - a, cb - ca))
                    pw, pc = b, cb
                segs.append((w1 - pw, c1 - pc, 0.0, 0.0))  # Python after the commit
                per_call.append(segs)
                totals.append((w1 - w0, c1 - c0))
                sqls = [m[0] for m in marks]
    finally:
        del wrapped.commit
    if not per_call:
        return out

    def med(xs):
        return statistics.median(xs) * 1e3

    nseg = len(per_call[0])
    labels = []
    for k, sql in enumerate(sqls):
        sig = signature(sql)
        label = next((lab for t, v, lab in _LABELS if sig == (v, t)), " ".join(sql.split())[:60])
        if sig == ("SELECT", "budgets_window") and "FOR NO KEY UPDATE" in sql.upper():
            label = _LABELS[4][2]
        elif sig == ("SELECT", "budgets_window"):
            label = "current windows: ids (and counters) of the current periods, no lock"
        elif sig[0] == "WITH" and "FOR NO KEY UPDATE" in sql.upper():
            label = ("the admission statement (autocommit): lock windows in id order, check room, "
                     "reserved += worst, insert reservation + holds; COMMIT inside")
        labels.append(f"{k + 1}. {label}" if sql != "COMMIT" else f"{k + 1}. COMMIT")
    labels.append("   Python after the last statement (build the result)")
    out.append(f"### One admission profiled: matching_budgets() + admit(), as the gateway calls them "
               f"({tenant.ceilings} ceilings, {n} sequential calls, medians)")
    out.append("")
    out.append(f"Round trips per admission: **{len(sent)}** (libpq trace of one call; each is one simple-protocol Query; "
               "psycopg sends BEGIN/COMMIT as their own):")
    out.append("")
    for k, q in enumerate(sent, 1):
        text = q.strip('"')
        out.append(f"{k}. `{text[:150]}{' …' if len(text) > 150 else ''}`")
    out.append("")
    out.append("| step | Python before it, wall ms | Python before it, CPU ms | statement round trip, wall ms | driver CPU in it, ms |")
    out.append("|---|---:|---:|---:|---:|")
    for k in range(nseg):
        col = [c[k] for c in per_call if len(c) == nseg]
        db_w = med([x[2] for x in col]) if k < nseg - 1 else float("nan")
        db_c = med([x[3] for x in col]) if k < nseg - 1 else float("nan")
        out.append(
            f"| {labels[k]} | {med([x[0] for x in col]):.2f} | {med([x[1] for x in col]):.2f} | "
            + (f"{db_w:.2f} | {db_c:.2f} |" if k < nseg - 1 else "– | – |")
        )
    wall = statistics.median(t[0] for t in totals) * 1e3
    cpu = statistics.median(t[1] for t in totals) * 1e3
    py_cpu = sum(med([c[k][1] for c in per_call if len(c) == nseg]) for k in range(nseg))
    db_wall = sum(med([c[k][2] for c in per_call if len(c) == nseg]) for k in range(nseg - 1))
    out.append(f"| **total per admission** | | **{py_cpu:.2f}** | **{db_wall:.2f}** | |")
    out.append("")
    out.append(
        f"Per call: {wall:.2f} ms wall, of which {cpu:.2f} ms is this thread's CPU (ORM building SQL, "
        f"psycopg, model instances) and the rest waiting on Postgres. One thread can therefore do at most "
        f"~{1e3 / cpu:.0f} admissions/s of Python work; all threads of a process share that under the GIL."
    )
    # The pgbench scripts must issue what admit() issues.
    got = [signature(q) for q in sent]
    matching = [path for kind in ("stmt", "full") if script_signatures(path := pgbench_script(tenant.ceilings, kind)) == got]
    out.append("")
    if matching:
        out.append(f"Script check: `{matching[0].relative_to(ROOT)}` has admit()'s statements (verb and table, in order); "
                   "pgbench-admit runs it.")
    else:
        out.append(f"Script check: NO script in bench/pgbench has admit()'s statements {got}; pgbench-admit was skipped. "
                   "Add one mirroring the trace above.")
    return out


# --- report ----------------------------------------------------------------------------------


def _median_cell(cells: list[Cell]) -> Cell:
    return sorted(cells, key=lambda c: c.rate)[len(cells) // 2]


def _fmt_split(cell: Cell) -> str:
    return " ({:.1f} + {:.1f} + {:.1f})".format(*cell.held_split) if cell.held_split else ""


def _fmt_rate(cells: list[Cell]) -> str:
    if not cells or all(c.count == 0 for c in cells):
        return "–"
    med = statistics.median(c.rate for c in cells)
    if len(cells) > 1:
        return f"{med:,.0f} ({min(c.rate for c in cells):,.0f}–{max(c.rate for c in cells):,.0f})"
    return f"{med:,.0f}"


def _fmt_lat(cells: list[Cell]) -> str:
    if not cells or all(c.count == 0 for c in cells):
        return "–"
    return f"{statistics.median(c.p50_ms for c in cells):.1f} / {statistics.median(c.p99_ms for c in cells):.1f}"


def report(results: dict, args: argparse.Namespace, header: list[str], cycles: list[Cell]) -> list[str]:
    out = list(header)
    runners = [r for r in RUNNERS if r in args.runners]
    head = ["ceilings", "clients"]
    for r in runners:
        head += [f"{r} adm/s" if not r.startswith("pgbench") else f"{r} tps", "p50 / p99 ms"]
    py_runners = [r for r in runners if not r.startswith("pgbench")]
    if "pgbench" in runners:
        head += [f"{r} ÷ pgbench" for r in py_runners]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join(["---:"] * len(head)) + "|")
    for ceilings in args.ceilings:
        for clients in args.clients:
            row = [str(ceilings), str(clients)]
            for r in runners:
                cells = results.get((ceilings, clients, r), [])
                row += [_fmt_rate(cells), _fmt_lat(cells)]
            if "pgbench" in runners:
                base = results.get((ceilings, clients, "pgbench"), [])
                base_rate = statistics.median(c.rate for c in base) if base else 0
                for r in py_runners:
                    cells = results.get((ceilings, clients, r), [])
                    row.append(f"{statistics.median(c.rate for c in cells) / base_rate:.0%}" if cells and base_rate else "–")
            out.append("| " + " | ".join(row) + " |")
    if cycles:
        out.append("")
        out.append("admit → record → drain cycles (3 ceilings; workers admit then record, one drainer thread "
                   "applies the outbox every ~50 ms; rate = completed admit+record pairs/s):")
        out.append("")
        out.append("| runner | clients | cycles/s | p50 / p99 ms | drain | check |")
        out.append("|---|---:|---:|---:|---|---|")
        by: dict = {}
        for c in cycles:
            by.setdefault((c.runner, c.clients), []).append(c)
        for (runner, clients), cells in by.items():
            out.append(f"| {runner} | {clients} | {_fmt_rate(cells)} | {_fmt_lat(cells)} | {_median_cell(cells).note} | "
                       f"{', '.join(sorted({c.check for c in cells}))} |")
    # Details: CPU and checks, every cell.
    out.append("")
    out.append("Per cell: Python CPU per admission (sum of the workers' own CPU time / admissions); the mean "
               "duration of the statement that locks the windows (mostly waiting for the hot rows under "
               "contention) and the mean time the lock stays held after it returns, split into Python until the "
               "UPDATE is sent + the UPDATE's round trip + from its return until COMMIT returned, as Python "
               "sees them (a round trip includes getting the GIL / a CPU back); for pgbench the UPDATE + COMMIT "
               "statement latencies from -r. One hot row admits at most ~1000 / (that hold) per second; host CPU busy (both cores, /proc/stat) during the cell and in "
               "the 0.4 s before it while the benchmark was idle (other people's load: noise); the counter check.")
    out.append("")
    out.append("| ceilings | clients | runner | adm/s | py CPU ms/adm | locking stmt ms | lock held after it ms (py + UPDATE + COMMIT) | host CPU % | background CPU % before | check | errors / refusals |")
    out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
    for (ceilings, clients, runner), cells in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1], RUNNERS.index(kv[0][2]))):
        med = _median_cell(cells)
        cpu = f"{statistics.median(c.py_cpu / c.count * 1e3 for c in cells if c.count):.2f}" if not runner.startswith("pgbench") and med.count else "–"
        host = statistics.median(c.host_cpu_pct for c in cells)
        checks = ", ".join(sorted({c.check for c in cells}))
        errs = [e for c in cells for e in c.errors]
        refused = sum(c.refused for c in cells)
        extra = (f"{len(errs)} errors, first: {errs[0][:80]}" if errs else "") + (f" {refused} refused" if refused else "")
        bg = statistics.median(c.bg_cpu_pct for c in cells)
        lock = statistics.median(c.lock_stmt_ms for c in cells)
        held = statistics.median(c.held_ms for c in cells)
        out.append(f"| {ceilings} | {clients} | {runner} | {_fmt_rate(cells)} | {cpu} | {lock:.1f} | {held:.1f}{_fmt_split(med)} | {host:.0f} | {bg:.0f} | {checks} | {extra.strip() or '–'} |")
    # The target.
    out.append("")
    base = results.get((3, 32, "pgbench"))
    if base:
        base_rate = statistics.median(c.rate for c in base)
        for r in py_runners:
            cells = results.get((3, 32, r))
            if cells:
                rate = statistics.median(c.rate for c in cells)
                verdict = "MET" if rate >= base_rate / 2 else "NOT met"
                out.append(f"Target (3 ceilings, 32 clients, >= half of pgbench's {base_rate:,.0f}/s = {base_rate / 2:,.0f}/s): "
                           f"{r} {rate:,.0f}/s = {rate / base_rate:.0%} of pgbench -> **{verdict}**.")
    return out


ENGINE_SHAPE = {
    "admit": "admit() as it is (ORM)",
    "raw-3rt": "one-statement shape, hand-written SQL: 2 reads + the statement (3 round trips)",
    "cached-1rt": "hand-written SQL, budgets/windows cached per process: the statement only (1 round trip)",
    "cached-6rt": "classic transaction, hand-written SQL + the same cache (6 round trips, lock held across 3)",
    "pgbench": "pgbench, classic transaction (6 round trips)",
    "pgbench-1stmt": "pgbench, the admission statement alone (1 round trip)",
}


def report_whatif(whatif: dict, args: argparse.Namespace) -> list[str]:
    out = [
        "What-if engines (3 ceilings, written in bench/admission.py, not in the engine; the same counter "
        "checks pass after every cell) — to size the engine suggestions:",
        "",
        "| engine | runner | clients | adm/s | p50 / p99 ms | py CPU ms/adm | locking stmt ms | lock held after it ms (py + UPDATE + COMMIT) | host CPU % | check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for clients in args.whatif_clients:
        for (engine, c, runner), cells in whatif.items():
            if c != clients:
                continue
            cpu = (f"{statistics.median(x.py_cpu / x.count * 1e3 for x in cells if x.count):.2f}"
                   if runner != "pgbench" and any(x.count for x in cells) else "–")
            out.append(
                f"| {ENGINE_SHAPE.get(engine, engine)} | {runner} | {clients} | {_fmt_rate(cells)} | {_fmt_lat(cells)} | "
                f"{cpu} | {statistics.median(x.lock_stmt_ms for x in cells):.1f} | "
                f"{statistics.median(x.held_ms for x in cells):.1f}{_fmt_split(_median_cell(cells))} | "
                f"{statistics.median(x.host_cpu_pct for x in cells):.0f} | {', '.join(sorted({x.check for x in cells}))} |"
            )
    return out


def machine_header(args: argparse.Namespace, db: Db) -> list[str]:
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT version(), current_setting('synchronous_commit'), current_setting('shared_buffers'), current_setting('max_connections')")
        version, sync, shared, maxconn = cur.fetchone()
    try:
        cpu_model = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu_model = platform.processor() or "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    pgb = subprocess.run([args.pgbench, "--version"], capture_output=True, text=True).stdout.strip() if "pgbench" in ",".join(args.runners) else ""
    import django
    import psycopg

    return [
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: {os.cpu_count()} CPUs ({cpu_model}), "
        f"Python {platform.python_version()}, Django {django.get_version()}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), "
        f"{version.split(' on ')[0]} (synchronous_commit={sync}, shared_buffers={shared}, max_connections={maxconn}), {pgb}.",
        f"Settings {args.settings} (DEBUG={settings.DEBUG}, pool={'pool' in settings.DATABASES['default'].get('OPTIONS', {})}), "
        f"database {db.name} on {db.host}:{db.port}; GIL switch interval {sys.getswitchinterval() * 1e3:g} ms; "
        f"{args.duration} s per cell, repeat {args.repeat}, "
        f"worst case {args.worst_nano:,} nano-USD; load average at start {', '.join(f'{x:.2f}' for x in load)}"
        + (f"; each cell waited up to {args.quiet_wait:.0f} s for background CPU < {args.quiet_below:.0f}%." if args.quiet_below < 100 else "."),
        "",
    ]


def run_cell(runner: str, tenants: dict, ceilings: int, clients: int, mode: str, args, db: Db, label: str) -> Cell:
    """Reset, note the background load, run one cell, print a progress line."""
    reset(list(tenants.values()))
    bg = background_cpu()
    waited_until = time.monotonic() + args.quiet_wait
    while args.quiet_below < 100 and bg > args.quiet_below and time.monotonic() < waited_until:
        bg = background_cpu(1.0)  # someone else is busy: wait for a quieter moment
    tenant = tenants[ceilings]
    for attempt in range(2):
        if runner.startswith("pgbench"):
            cell = run_pgbench_cell(runner, tenant, clients, args, db)
        else:
            cell = run_python_cell(runner, tenant, clients, mode, args)
        if cell.count or not cell.errors or attempt:
            break
        print(f"  {label} {runner} {clients} clients failed ({cell.errors[0]}); once more", flush=True)
        reset(list(tenants.values()))
    cell.bg_cpu_pct = bg
    print(
        f"  {label} {ceilings} ceiling(s) {clients:>3} clients {runner:<12} {mode:<10} {cell.rate:>7,.0f}/s  "
        f"p50 {cell.p50_ms:6.1f} ms  p99 {cell.p99_ms:6.1f} ms  lock stmt {cell.lock_stmt_ms:5.1f} held {cell.held_ms:5.1f} ms"
        + (" (py {:.1f} + UPDATE {:.1f} + COMMIT {:.1f})".format(*cell.held_split) if cell.held_split else "") + "  "
        f"host CPU {cell.host_cpu_pct:3.0f}% (bg {bg:3.0f}%)  "
        f"{cell.note}  {cell.check}" + (f"  errors: {cell.errors[:2]}" if cell.errors else ""),
        flush=True,
    )
    return cell


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    db = parse_db_url(args.db_url)
    create_database(db)
    setup_django(args)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    started = time.monotonic()
    need = set(args.ceilings) | ({3} if args.cycle_clients or args.whatif else set())
    tenants = {c: ensure_tenant(c) for c in sorted(need)}
    for tenant in tenants.values():
        tenant.admit_sql = trace_round_trips(tenant, args.worst_nano)
        tenant.admit_script = match_admit_script(tenant)
    header = machine_header(args, db)
    for c, tenant in tenants.items():
        header.insert(-1, (
            f"An admission (matching_budgets + admit()) with {c} ceiling(s) makes {len(tenant.admit_sql)} round trips; pgbench-admit runs "
            + (f"`{tenant.admit_script.relative_to(ROOT)}` (same statements)." if tenant.admit_script else "nothing: no script matches it.")
        ))
    print("\n".join(header), flush=True)

    results: dict = {}
    cycles: list[Cell] = []
    whatif: dict = {}
    runners = [r for r in RUNNERS if r in args.runners]
    py_runners = [r for r in ("threads", "processes") if r in args.runners]
    for rep in range(args.repeat):
        label = f"[{rep + 1}/{args.repeat}]"
        for ceilings in args.ceilings:
            for clients in args.clients:
                for runner in runners:
                    cell = run_cell(runner, tenants, ceilings, clients, "admit", args, db, label)
                    results.setdefault((ceilings, clients, runner), []).append(cell)
        for clients in args.cycle_clients:
            for runner in py_runners:
                cycles.append(run_cell(runner, tenants, 3, clients, "cycle", args, db, label))
        if args.whatif:
            for clients in args.whatif_clients:
                for engine in ("admit", *WHATIF):
                    for runner in py_runners:
                        cell = run_cell(runner, tenants, 3, clients, engine, args, db, label)
                        whatif.setdefault((engine, clients, runner), []).append(cell)
                for runner in ("pgbench", "pgbench-1stmt"):
                    cell = run_cell(runner, tenants, 3, clients, "admit", args, db, label)
                    whatif.setdefault((runner, clients, "pgbench"), []).append(cell)
    reset(list(tenants.values()))
    lines = report(results, args, [], cycles) if results or cycles else []
    if whatif:
        lines += [""] + report_whatif(whatif, args)
    if args.profile_calls > 0 and tenants:
        lines += [""] + profile(tenants[max(tenants)], args)
        reset(list(tenants.values()))
    close_db()
    cmd = " ".join(["python bench/admission.py", *(sys.argv[1:] if argv is None else argv)])
    lines += ["", f"Command: `{cmd}` — finished in {time.monotonic() - started:.0f} s."]
    text = "\n".join(header + lines)
    print()
    print("\n".join(lines))
    if args.out:
        args.out.write_text(text + "\n")
    every = [c for cells in (*results.values(), *whatif.values()) for c in cells] + cycles
    return 1 if any(c.check.startswith("FAIL") for c in every) else 0


if __name__ == "__main__":
    sys.exit(main())
