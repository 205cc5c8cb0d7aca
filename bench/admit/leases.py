"""The leases runner (headroom slices): N forked processes, each a gateway process in
miniature admitting on one hot ceiling through its own ledger.slices.Book.

Each process:
  - registers a GatewayInstance (the owner of its slices) and sets its Book's `processes` to N;
  - its main thread admits as gateway/admission/service.py does (budgets_for(subject), the
    process's budget cache, ledger/budget_cache.py; then
    Book.admit(AdmissionRequest(..., owner_id=..., budgets=...))), --leases-group admissions at a
    time, then writes their usage records in one record_many (the group commit,
    gateway/upstream/recorder.py; the carve out of the slice happens inside it) and tells the book each one
    is settled;
  - a settle thread drains the outbox every 50 ms (drain(limit=500), as gateway/upstream/runtime.py
    `_drain`) and every 100 ms retires expired slices and gives unused parts back (`_slices`);
  - a listener thread LISTENs on capgate_slices on its own psycopg connection and, when another
    process was refused on a window, recalls its slices there and gives back; it also LISTENs on
    capgate_cache and sends the fences that keep the budget cache trusted, as the gateway's
    listener does (gateway/upstream/runtime.py `_listen`).
At the end a process retires all its slices and gives back; its settle thread drains once more.
The parent then drains everything and checks the counters.
The exhaustion run (bench/admit/exhaustion.py) uses the same processes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, connections

from bench.admit.cell import Cell, check_cycle, cpu_ticks
from bench.admit.tenant import Tenant, close_db
from core import invalidation
from gateway.upstream.runtime import conninfo
from ledger import slices
from ledger.admission import AdmissionRequest, Admitted, Subject, matching_budgets
from ledger.budget_cache import budgets_for
from ledger.drain import drain, drain_all
from ledger.errors import BudgetExceeded
from ledger.instances import register, stop
from ledger.recording import Outcome, record_many

MAX_PROCESSES = 16  # each process holds 3 connections (admitting, settle, LISTEN)
STOP_AFTER_REFUSALS = 25  # exhaustion: a process stops after this many refusals in a row ...
REFUSED_PAUSE = 0.02  # ... pausing this long (seconds) after each
RETRIES = 5  # a record or the final give-back failing with a DatabaseError is tried again


@dataclass(frozen=True)
class Plan:
    subject: Subject
    worst: int
    cost: int
    processes: int
    seconds: float  # throughput: the run; exhaustion: the longest it may take
    group: int
    slices_on: bool
    exhaust: bool
    tag: str
    cache_budgets: bool = False  # what-if: the budgets read once per process, not per request


class Settler(threading.Thread):
    """Drain every 50 ms; retire expired slices and give unused parts back every 100 ms. A
    DatabaseError is noted (reported with the cell) and the next round tries again, as the
    gateway's settle tasks log it and go on (gateway/upstream/runtime.py)."""

    def __init__(self, book: slices.Book) -> None:
        super().__init__(daemon=True)
        self.book = book
        self.halt = threading.Event()
        self.drained = 0
        self.failures: list[str] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            tick = 0
            while True:
                stopping = self.halt.is_set()
                try:
                    n = drain(limit=500)
                    self.drained += n
                    if tick % 2 == 0 or stopping:
                        self.book.retire_expired()
                        self.book.give_back_pending()
                except DatabaseError as exc:
                    self.failures.append(f"settle: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                    n = 0
                if stopping and n < 500:
                    return
                if n < 500:
                    self.halt.wait(0.05)
                tick += 1
        except Exception as exc:  # reported with the cell, never hidden
            self.error = f"settle: {type(exc).__name__}: {exc}"
        finally:
            connection.close()


class Listener(threading.Thread):
    """LISTEN capgate_slices (another process was refused on these windows: give back here) and
    capgate_cache (budget writes, and this process's own fences: core/invalidation.py)."""

    def __init__(self, book: slices.Book) -> None:
        super().__init__(daemon=True)
        self.book = book
        self.halt = threading.Event()
        self.ready = threading.Event()
        self.notes = 0
        self.recalled = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(conninfo(), autocommit=True) as conn:
                conn.execute(f"LISTEN {slices.NOTIFY_CHANNEL}")
                conn.execute(f"LISTEN {invalidation.CHANNEL}")
                invalidation.freshness.enabled = True
                self.ready.set()
                while not self.halt.is_set():
                    conn.execute("SELECT pg_notify(%s, %s)", [invalidation.CHANNEL, invalidation.freshness.fence()])
                    for note in conn.notifies(timeout=min(0.1, invalidation.fence_interval())):
                        if note.channel == invalidation.CHANNEL:
                            invalidation.freshness.on_notification(note.payload)
                            continue
                        self.notes += 1
                        ids = [int(w) for w in note.payload.split(",") if w.strip().isdigit()]
                        if self.book.recall(ids):
                            self.recalled += 1
                            self.book.give_back_pending()
        except Exception as exc:  # reported with the cell, never hidden
            self.error = f"listen: {type(exc).__name__}: {exc}"
        finally:
            invalidation.freshness.lost()
            invalidation.freshness.enabled = False
            self.ready.set()
            connection.close()


class Phases:
    """Wall time a process spends in each step, summed (seconds): the budget lookup, the book's
    admission, the group commit (record_many and settled)."""

    def __init__(self) -> None:
        self.budgets = self.book = self.record = 0.0


def _admit(book: slices.Book, plan: Plan, owner: int, request_id: str, phases: Phases, cached: list) -> Admitted:
    t0 = time.perf_counter()
    budgets = cached if plan.cache_budgets and cached else budgets_for(plan.subject)
    t1 = time.perf_counter()
    try:
        return book.admit(
            AdmissionRequest(
                subject=plan.subject,
                request_id=request_id,
                worst_nano=plan.worst,
                owner_id=owner,
                budgets=budgets,
            )
        )
    finally:
        phases.budgets += t1 - t0
        phases.book += time.perf_counter() - t1


def _retrying(what: str, fn: Callable[[], object], errors: list[str]) -> None:
    """Call fn; a DatabaseError (a deadlock, seen on this machine) is noted and fn called again,
    up to RETRIES times: what the gateway's spool replay does for records, and its settle thread's
    next round for give-backs (a failed statement rolled back, so calling again is a replay)."""
    for attempt in range(RETRIES):
        try:
            fn()
            return
        except DatabaseError as exc:
            errors.append(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            if attempt == RETRIES - 1:
                raise
            time.sleep(0.05)


def _record(book: slices.Book, admitted: list[Admitted], cost: int, errors: list[str]) -> None:
    """One group commit: the records (and carves) in one record_many, then each settled."""
    items = [(a.reservation, Outcome(status="served", cost_nano=cost)) for a in admitted]
    results: list = []
    try:
        _retrying("record", lambda: results.extend(record_many(items=items)), errors)
    finally:
        for a in admitted:
            book.settled(a.reservation)
    errors += [f"record: {type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]


def _run(index: int, barrier, plan: Plan) -> dict:
    book = slices.Book()
    book.processes = plan.processes
    phases = Phases()
    settler, listener = Settler(book), Listener(book)
    try:
        owner = register(name=f"bench-leases-{plan.tag}-{index}").id
        settler.start()
        listener.start()
        listener.ready.wait(30)
        # The key's first request is admitted alone: it tells the book how much room there is.
        cached = matching_budgets(plan.subject)
        warm = _admit(book, plan, owner, f"{plan.tag}-{index}-warm", phases, cached)
        warm_at = time.monotonic()
        warm_errors: list[str] = []
        _record(book, [warm], plan.cost, warm_errors)
    except BaseException as exc:
        barrier.abort()
        return {"fatal": f"warm-up: {type(exc).__name__}: {exc}", "warm": 0}
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        return {"fatal": "BrokenBarrierError: another process failed before the start", "warm": 1}
    lat: list[float] = []
    stamps: list[float] = [warm_at]
    errors: list[str] = list(warm_errors)
    refused = in_a_row = 0
    first_refused: float | None = None
    phases.budgets = phases.book = phases.record = 0.0  # the warm-up is not counted
    cpu0 = time.process_time()
    start = time.monotonic()
    deadline = start + plan.seconds
    i = 0
    while time.monotonic() < deadline and len(errors) <= 20:
        group: list[Admitted] = []
        for _ in range(plan.group):
            i += 1
            t0 = time.perf_counter()
            try:
                admitted = _admit(book, plan, owner, f"{plan.tag}-{index}-{i}", phases, cached)
            except BudgetExceeded:
                refused += 1
                in_a_row += 1
                first_refused = first_refused or time.monotonic()
                break
            except Exception as exc:  # reported in the table, never hidden
                errors.append(f"admit: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                break
            lat.append(time.perf_counter() - t0)
            if plan.exhaust:
                stamps.append(time.monotonic())
            in_a_row = 0
            group.append(admitted)
        if group:
            t0 = time.perf_counter()
            _record(book, group, plan.cost, errors)
            phases.record += time.perf_counter() - t0
        if in_a_row:
            if plan.exhaust and in_a_row >= STOP_AFTER_REFUSALS:
                break
            time.sleep(REFUSED_PAUSE)
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    book.retire_all()  # the process stops: unused parts go back, then its last records drain
    _retrying("give back", book.give_back_pending, errors)
    for thread in (settler, listener):
        thread.halt.set()
        thread.join(timeout=60)
        if thread.error:
            errors.append(thread.error)
    errors += settler.failures
    stop(instance_id=owner)
    return {
        "lat": lat,
        "stamps": stamps if plan.exhaust else [],
        "refused": refused,
        "first_refused": first_refused,
        "errors": errors,
        "start": start,
        "end": end,
        "cpu": cpu,
        "phases": (phases.budgets, phases.book, phases.record) if not plan.exhaust else (0.0, 0.0, 0.0),
        "warm": 1,
        "stats": book.stats(),
        "notes": listener.notes,
        "recalled": listener.recalled,
    }


def _process_target(queue, index: int, barrier, plan: Plan) -> None:
    # Plain connections in the child (no pool threads across a fork); slices on or off here.
    settings_dict = connections["default"].settings_dict
    settings_dict["OPTIONS"] = {k: v for k, v in settings_dict.get("OPTIONS", {}).items() if k != "pool"}
    settings.CAPGATE["SLICES"] = plan.slices_on
    try:
        queue.put(_run(index, barrier, plan))
    except BaseException as exc:
        queue.put({"fatal": f"{type(exc).__name__}: {exc}"})
    finally:
        close_db()


def fork(plan: Plan) -> tuple[list[dict], float]:
    """Run the plan in N forked processes released together; (their results, host CPU %)."""
    ctx = mp.get_context("fork")
    close_db()
    barrier = ctx.Barrier(plan.processes + 1)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_target, args=(queue, i, barrier, plan)) for i in range(plan.processes)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass  # a process failed before the start; its error is in its result
    busy0, total0 = cpu_ticks()
    results: list[dict] = []
    for _ in procs:
        try:
            results.append(queue.get(timeout=plan.seconds + 300))
        except Exception as exc:  # a process died without reporting
            results.append({"fatal": f"no result: {exc!r}"})
    for p in procs:
        p.join(timeout=30)
    busy1, total1 = cpu_ticks()
    return results, (100.0 * (busy1 - busy0) / (total1 - total0) if total1 > total0 else float("nan"))


def _slice_note(ok: list[dict]) -> str:
    taken = sum(r["stats"]["slices_taken"] for r in ok)
    inmem = sum(r["stats"]["admitted_from_slices"] for r in ok)
    admitted = sum(len(r["lat"]) + r["warm"] for r in ok)
    return (
        f"{taken} slices, {inmem / admitted:.1%} admitted in memory, {sum(r['recalled'] for r in ok)} recalls"
        if admitted
        else ""
    )


def run_leases_cell(tenant: Tenant, processes: int, args: argparse.Namespace, *, cache_budgets: bool = False) -> Cell:
    """Throughput: N processes admit → record → settle on the tenant's ceilings for --duration s
    (cache_budgets: the leases-cached what-if, budgets read once per process)."""
    cost = args.worst_nano // 4  # as the cycle rows: the provider billed a quarter of the worst case
    plan = Plan(
        subject=tenant.subject,
        worst=args.worst_nano,
        cost=cost,
        processes=processes,
        seconds=float(args.duration),
        group=args.leases_group,
        slices_on=True,
        exhaust=False,
        tag=uuid.uuid4().hex[:12],
        cache_budgets=cache_budgets,
    )
    runner = "leases-cached" if cache_budgets else "leases"
    cell = Cell(runner=runner, ceilings=tenant.ceilings, clients=processes, mode="leases")
    results, cell.host_cpu_pct = fork(plan)
    fatal = [r["fatal"] for r in results if "fatal" in r]
    fatal.sort(key=lambda e: "BrokenBarrierError" in e)  # the cause first
    ok = [r for r in results if "fatal" not in r]
    cell.errors = fatal + [e for r in ok for e in r["errors"]]
    cell.refused = sum(r["refused"] for r in ok)
    cell.latencies = sorted(x for r in ok for x in r["lat"])
    cell.count = len(cell.latencies)
    cell.py_cpu = sum(r["cpu"] for r in ok)
    if ok:
        cell.elapsed = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    drain_all()
    cell.check = check_cycle(tenant, cell.count + sum(r.get("warm", 0) for r in results), cost)
    cell.note = _slice_note(ok)
    if cell.count:
        per = [sum(r["phases"][k] for r in ok) / cell.count * 1e3 for k in range(3)]
        cell.note += "; wall ms/adm per process: budgets {:.2f}, book {:.2f}, record {:.2f}".format(*per)
    return cell
