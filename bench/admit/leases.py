"""The leases runner (issue 12 §1, headroom slices): N forked processes, each a gateway process in
miniature admitting on one hot ceiling through its own ledger.slices.Book.

Each process:
  - registers a GatewayInstance (the owner of its slices) and sets its Book's `processes` to N;
  - its main thread admits as gateway/service.py does (matching_budgets(subject), then
    Book.admit(AdmissionRequest(..., owner_id=..., budgets=...))), --leases-group admissions at a
    time, then writes their usage records in one record_many (the group commit,
    gateway/recorder.py; the carve out of the slice happens inside it) and tells the book each one
    is settled;
  - a settle thread drains the outbox every 50 ms (drain(limit=500), as gateway/runtime.py
    `_drain`) and every 100 ms retires expired slices and gives unused parts back (`_slices`);
  - a listener thread LISTENs on capgate_slices on its own psycopg connection and, when another
    process was refused on a window, recalls its slices there and gives back (`_listen`).
At the end a process retires all its slices and gives back; its settle thread drains once more.
The parent then drains everything and checks the counters.

The exhaustion run drives a cap worth --exhaust worst cases to exhaustion: every process admits
until it has been refused STOP_AFTER_REFUSALS times in a row (pausing REFUSED_PAUSE after each
refusal, so recalled leftovers can come back), each admission settled at --exhaust-cost times its
worst case. It reports the spend of everything admitted before the first refusal (whichever
process saw it; CLOCK_MONOTONIC is one clock for all processes) as a share of the cap, the final
recorded spend, and what is left reserved.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
from django.conf import settings
from django.db import connection, connections

from bench.admit.cell import Cell, check_cycle, cpu_ticks
from bench.admit.tenant import Tenant, close_db, ensure_tenant, reset
from budgets.errors import BudgetExceeded
from budgets.instances import register, stop
from budgets.models import Window
from gateway.runtime import conninfo
from ledger import slices
from ledger.admission import AdmissionRequest, Admitted, Subject, matching_budgets
from ledger.drain import drain, drain_all
from ledger.recording import Outcome, record_many

MAX_PROCESSES = 16  # each process holds 3 connections (admitting, settle, LISTEN)
STOP_AFTER_REFUSALS = 25  # exhaustion: a process stops after this many refusals in a row ...
REFUSED_PAUSE = 0.02  # ... pausing this long (seconds) after each
EXHAUST_SLUG = "bench-leases-exhaust"


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


@dataclass
class Exhaustion:
    slices_on: bool
    processes: int
    cap: int
    worst: int
    cost: int
    admitted: int = 0
    refused: int = 0
    before_first_refusal: int = 0  # admissions that returned before the first refusal
    first_refusal_s: float = float("nan")  # after the start
    elapsed: float = 0.0
    spent: int = 0
    reserved: int = 0
    slices_taken: int = 0
    from_slices: int = 0
    check: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def at_refusal_pct(self) -> float:
        return 100.0 * self.before_first_refusal * self.cost / self.cap

    @property
    def final_pct(self) -> float:
        return 100.0 * self.spent / self.cap


class Settler(threading.Thread):
    """Drain every 50 ms; retire expired slices and give unused parts back every 100 ms."""

    def __init__(self, book: slices.Book) -> None:
        super().__init__(daemon=True)
        self.book = book
        self.halt = threading.Event()
        self.drained = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            tick = 0
            while True:
                stopping = self.halt.is_set()
                n = drain(limit=500)
                self.drained += n
                if tick % 2 == 0 or stopping:
                    self.book.retire_expired()
                    self.book.give_back_pending()
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
    """LISTEN capgate_slices: another process was refused on these windows, give back here."""

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
                self.ready.set()
                while not self.halt.is_set():
                    for note in conn.notifies(timeout=0.1):
                        self.notes += 1
                        ids = [int(w) for w in note.payload.split(",") if w.strip().isdigit()]
                        if self.book.recall(ids):
                            self.recalled += 1
                            self.book.give_back_pending()
        except Exception as exc:  # reported with the cell, never hidden
            self.error = f"listen: {type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            connection.close()


def _admit(book: slices.Book, plan: Plan, owner: int, request_id: str) -> Admitted:
    return book.admit(
        AdmissionRequest(
            subject=plan.subject,
            request_id=request_id,
            worst_nano=plan.worst,
            owner_id=owner,
            budgets=matching_budgets(plan.subject),
        )
    )


def _record(book: slices.Book, admitted: list[Admitted], cost: int) -> list[str]:
    """One group commit: the records (and carves) in one record_many, then each settled."""
    try:
        results = record_many(items=[(a.reservation, Outcome(status="served", cost_nano=cost)) for a in admitted])
    finally:
        for a in admitted:
            book.settled(a.reservation)
    return [f"record: {type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]


def _run(index: int, barrier, plan: Plan) -> dict:
    book = slices.Book()
    book.processes = plan.processes
    settler, listener = Settler(book), Listener(book)
    try:
        owner = register(name=f"bench-leases-{plan.tag}-{index}").id
        settler.start()
        listener.start()
        listener.ready.wait(30)
        # The key's first request is admitted alone: it tells the book how much room there is.
        warm = _admit(book, plan, owner, f"{plan.tag}-{index}-warm")
        warm_at = time.monotonic()
        warm_errors = _record(book, [warm], plan.cost)
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
                admitted = _admit(book, plan, owner, f"{plan.tag}-{index}-{i}")
            except BudgetExceeded:
                refused += 1
                in_a_row += 1
                first_refused = first_refused or time.monotonic()
                break
            except Exception as exc:  # reported in the table, never hidden
                errors.append(f"{type(exc).__name__}: {exc}")
                break
            lat.append(time.perf_counter() - t0)
            if plan.exhaust:
                stamps.append(time.monotonic())
            in_a_row = 0
            group.append(admitted)
        if group:
            errors += _record(book, group, plan.cost)
        if in_a_row:
            if plan.exhaust and in_a_row >= STOP_AFTER_REFUSALS:
                break
            time.sleep(REFUSED_PAUSE)
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    book.retire_all()  # the process stops: unused parts go back, then its last records drain
    book.give_back_pending()
    for thread in (settler, listener):
        thread.halt.set()
        thread.join(timeout=60)
        if thread.error:
            errors.append(thread.error)
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


def _fork(plan: Plan) -> tuple[list[dict], float]:
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


def run_leases_cell(tenant: Tenant, processes: int, args: argparse.Namespace) -> Cell:
    """Throughput: N processes admit → record → settle on the tenant's ceilings for --duration s."""
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
    )
    cell = Cell(runner="leases", ceilings=tenant.ceilings, clients=processes, mode="leases")
    results, cell.host_cpu_pct = _fork(plan)
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
    return cell


def run_exhaustion(args: argparse.Namespace, *, slices_on: bool) -> Exhaustion:
    """Drive a cap worth --exhaust worst cases to exhaustion with --leases-processes processes."""
    worst = args.worst_nano
    cap = args.exhaust * worst
    cost = int(worst * args.exhaust_cost)
    tenant = ensure_tenant(1, slug=EXHAUST_SLUG, amount_nano=cap)
    reset([tenant])
    plan = Plan(
        subject=tenant.subject,
        worst=worst,
        cost=cost,
        processes=args.leases_processes,
        seconds=float(args.exhaust_timeout),
        group=args.leases_group,
        slices_on=slices_on,
        exhaust=True,
        tag=uuid.uuid4().hex[:12],
    )
    out = Exhaustion(slices_on=slices_on, processes=plan.processes, cap=cap, worst=worst, cost=cost)
    results, _cpu = _fork(plan)
    ok = [r for r in results if "fatal" not in r]
    out.errors = [r["fatal"] for r in results if "fatal" in r] + [e for r in ok for e in r["errors"]]
    out.admitted = sum(len(r["lat"]) + r["warm"] for r in ok)
    out.refused = sum(r["refused"] for r in ok)
    refusals = [r["first_refused"] for r in ok if r["first_refused"] is not None]
    if ok:
        start = min(r["start"] for r in ok)
        out.elapsed = max(r["end"] for r in ok) - start
        if refusals:
            first = min(refusals)
            out.first_refusal_s = first - start
            out.before_first_refusal = sum(1 for r in ok for t in r["stamps"] if t <= first)
        out.slices_taken = sum(r["stats"]["slices_taken"] for r in ok)
        out.from_slices = sum(r["stats"]["admitted_from_slices"] for r in ok)
    drain_all()
    window = Window.objects.get(id=tenant.window_ids[0])
    out.spent, out.reserved = window.spent_nano, window.reserved_nano
    check = check_cycle(tenant, out.admitted, cost)
    if out.spent > cap:
        check = ("FAIL " if check == "ok" else check + "; ") + f"overshoot: spent {out.spent:,} > cap {cap:,}"
    if not refusals:
        check = ("FAIL " if check == "ok" else check + "; ") + "never refused: the cap was not exhausted"
    out.check = check
    reset([tenant])
    return out
