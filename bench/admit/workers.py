"""The admission benchmark's Python runners: N threads (one connection each, one GIL) or N
forked processes admitting in a loop as the gateway does, released together by a barrier; in
cycle mode each admission is recorded and a drainer thread applies the outbox every ~50 ms."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time
import uuid

from django.db import connection, connections

from bench.admit.cell import Cell, check_cycle, check_reserved, cpu_ticks
from bench.admit.tenant import Tenant, close_db
from bench.admit.whatif import WHATIF
from ledger.admission import AdmissionRequest, Admitted, Subject, admit, matching_budgets
from ledger.drain import drain, drain_all
from ledger.errors import BudgetExceeded
from ledger.recording import Outcome, record


def production_admit(subject: Subject, request_id: str, worst: int) -> Admitted:
    """Admit the way the gateway does (gateway/admission/service.py): look up the subject's budgets, then
    admit(request=AdmissionRequest(..., budgets=budgets))."""
    budgets = matching_budgets(subject)
    return admit(request=AdmissionRequest(subject=subject, request_id=request_id, worst_nano=worst, budgets=budgets))


def _admit_once(subject: Subject, worst: int, cost: int, mode: str, request_id: str) -> float:
    """One admission (and its usage record in cycle mode); returns when the admission committed."""
    if mode in WHATIF:
        WHATIF[mode](subject, request_id, worst)
        return time.perf_counter()
    admitted = production_admit(subject, request_id, worst)
    committed = time.perf_counter()
    if mode == "cycle":
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
        updating = (
            self.lock_returned is not None and self.update_sent is None and sql.lstrip().upper().startswith("UPDATE")
        )
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
                sent, returned = timer.update_sent, timer.update_returned
                if sent is not None and returned is not None:
                    split.append((sent - timer.lock_returned, returned - sent, committed - returned))
    end = time.monotonic()
    return {
        "lat": lat,
        "refused": refused,
        "errors": errors,
        "start": start,
        "end": end,
        "cpu": time.thread_time() - cpu0,
        "warm": 1,
        "lock_stmt": lock_stmt,
        "held": held,
        "split": split,
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
    try:
        results[i] = _worker(i, *args)
    except BaseException as exc:
        results[i] = {"fatal": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()


def _process_target(queue, i: int, *args) -> None:
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
        threads = [threading.Thread(target=_thread_target, args=(results, i, barrier, *common)) for i in range(clients)]
        for t in threads:
            t.start()
        if drainer:
            drainer.start()
        busy0, total0 = _release(barrier)
        for t in threads:
            t.join()
    else:
        ctx = mp.get_context("fork")
        close_db()  # children must not share the parent's sockets or pool
        barrier = ctx.Barrier(clients + 1)
        queue = ctx.Queue()
        processes = [ctx.Process(target=_process_target, args=(queue, i, barrier, *common)) for i in range(clients)]
        for p in processes:
            p.start()
        if drainer:
            drainer.start()  # after forking: no pool threads in the parent at fork time
        busy0, total0 = _release(barrier)
        results = []
        for _ in processes:
            try:
                results.append(queue.get(timeout=args.duration + 300))
            except Exception as exc:  # a worker died without reporting
                results.append({"fatal": f"no result: {exc!r}"})
        for p in processes:
            p.join(timeout=30)
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
        py, update, commit = (statistics.fmean(x[k] for x in split) * 1e3 for k in range(3))
        cell.held_split = (py, update, commit)
    if ok:
        cell.elapsed = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    admitted = cell.count + sum(r.get("warm", 0) for r in results if r)
    if mode == "cycle":
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
