"""The admission benchmark's profile of one admission: the round trips one admit() sends (libpq
trace) and where its time goes, statement by statement (Python before each, the round trip,
the driver's CPU in it)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from unittest import mock

from django.db import connection, connections
from psycopg import pq

from bench.admit.base import ROOT
from bench.admit.pgbench import pgbench_script, script_signatures, signature
from bench.admit.tenant import Tenant
from bench.admit.workers import production_admit

_LABELS = [
    ("budgets_budget", "SELECT", "matching_budgets(): the subject's budgets"),
    ("budgets_window", "SELECT", "ensure_windows(): current window ids (no lock)"),
    ("budgets_reservation", "INSERT", "BEGIN + INSERT reservation (psycopg sends BEGIN first)"),
    ("budgets_hold", "INSERT", "INSERT holds (one statement, UNNEST)"),
    ("budgets_window", "SELECT", "lock the windows: SELECT .. FOR NO KEY UPDATE, id order"),
    ("budgets_window", "UPDATE", "UPDATE windows SET reserved += worst"),
]


def trace_round_trips(tenant: Tenant, worst: int) -> list[str]:
    """The protocol messages one admit() sends (libpq trace): every Query is one round trip."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as f:
        pgconn.trace(f.fileno())
        try:
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
    # COMMIT is not a statement Django's execute_wrapper sees: time it by wrapping the method.
    with mock.patch.object(wrapped, "commit", timed_commit), connection.execute_wrapper(wrapper):
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
            label = (
                "the admission statement (autocommit): lock windows in id order, check room, "
                "reserved += worst, insert reservation + holds; COMMIT inside"
            )
        labels.append(f"{k + 1}. {label}" if sql != "COMMIT" else f"{k + 1}. COMMIT")
    labels.append("   Python after the last statement (build the result)")
    out.append(
        f"### One admission profiled: matching_budgets() + admit(), as the gateway calls them "
        f"({tenant.ceilings} ceilings, {n} sequential calls, medians)"
    )
    out.append("")
    out.append(
        f"Round trips per admission: **{len(sent)}** (libpq trace of one call; each is one simple-protocol Query; "
        "psycopg sends BEGIN/COMMIT as their own):"
    )
    out.append("")
    for k, q in enumerate(sent, 1):
        text = q.strip('"')
        out.append(f"{k}. `{text[:150]}{' …' if len(text) > 150 else ''}`")
    out.append("")
    out.append(
        "| step | Python before it, wall ms | Python before it, CPU ms | statement round trip, wall ms | "
        "driver CPU in it, ms |"
    )
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
    matching = [
        path for kind in ("stmt", "full") if script_signatures(path := pgbench_script(tenant.ceilings, kind)) == got
    ]
    out.append("")
    if matching:
        out.append(
            f"Script check: `{matching[0].relative_to(ROOT)}` has admit()'s statements (verb and table, in order); "
            "pgbench-admit runs it."
        )
    else:
        out.append(
            f"Script check: NO script in bench/pgbench has admit()'s statements {got}; pgbench-admit was skipped. "
            "Add one mirroring the trace above."
        )
    return out
