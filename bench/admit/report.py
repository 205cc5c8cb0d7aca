"""The admission benchmark's report: markdown tables of every cell, the what-if engines, and the
machine it ran on."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import django
import psycopg
from django.conf import settings
from django.db import connection

from bench.admit.base import RUNNERS, Db
from bench.admit.cell import Cell


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
                    row.append(
                        f"{statistics.median(c.rate for c in cells) / base_rate:.0%}" if cells and base_rate else "–"
                    )
            out.append("| " + " | ".join(row) + " |")
    if cycles:
        out.append("")
        out.append(
            "admit → record → drain cycles (3 ceilings; workers admit then record, one drainer thread "
            "applies the outbox every ~50 ms; rate = completed admit+record pairs/s):"
        )
        out.append("")
        out.append("| runner | clients | cycles/s | p50 / p99 ms | drain | check |")
        out.append("|---|---:|---:|---:|---|---|")
        by: dict = {}
        for c in cycles:
            by.setdefault((c.runner, c.clients), []).append(c)
        for (runner, clients), cells in by.items():
            out.append(
                f"| {runner} | {clients} | {_fmt_rate(cells)} | {_fmt_lat(cells)} | {_median_cell(cells).note} | "
                f"{', '.join(sorted({c.check for c in cells}))} |"
            )
    # Details: CPU and checks, every cell.
    out.append("")
    out.append(
        "Per cell: Python CPU per admission (sum of the workers' own CPU time / admissions); the mean "
        "duration of the statement that locks the windows (mostly waiting for the hot rows under "
        "contention) and the mean time the lock stays held after it returns, split into Python until the "
        "UPDATE is sent + the UPDATE's round trip + from its return until COMMIT returned, as Python "
        "sees them (a round trip includes getting the GIL / a CPU back); for pgbench the UPDATE + COMMIT "
        "statement latencies from -r. One hot row admits at most ~1000 / (that hold) per second; host CPU "
        "busy (both cores, /proc/stat) during the cell and in "
        "the 0.4 s before it while the benchmark was idle (other people's load: noise); the counter check."
    )
    out.append("")
    out.append(
        "| ceilings | clients | runner | adm/s | py CPU ms/adm | locking stmt ms | lock held after it ms (py "
        "+ UPDATE + COMMIT) | host CPU % | background CPU % before | check | errors / refusals |"
    )
    out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
    for (ceilings, clients, runner), cells in sorted(
        results.items(), key=lambda kv: (kv[0][0], kv[0][1], RUNNERS.index(kv[0][2]))
    ):
        med = _median_cell(cells)
        cpu = (
            f"{statistics.median(c.py_cpu / c.count * 1e3 for c in cells if c.count):.2f}"
            if not runner.startswith("pgbench") and med.count
            else "–"
        )
        host = statistics.median(c.host_cpu_pct for c in cells)
        checks = ", ".join(sorted({c.check for c in cells}))
        errs = [e for c in cells for e in c.errors]
        refused = sum(c.refused for c in cells)
        extra = (f"{len(errs)} errors, first: {errs[0][:80]}" if errs else "") + (
            f" {refused} refused" if refused else ""
        )
        bg = statistics.median(c.bg_cpu_pct for c in cells)
        lock = statistics.median(c.lock_stmt_ms for c in cells)
        held = statistics.median(c.held_ms for c in cells)
        out.append(
            f"| {ceilings} | {clients} | {runner} | {_fmt_rate(cells)} | {cpu} | {lock:.1f} | "
            f"{held:.1f}{_fmt_split(med)} | {host:.0f} | {bg:.0f} | {checks} | {extra.strip() or '–'} |"
        )
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
                out.append(
                    f"Target (3 ceilings, 32 clients, >= half of pgbench's {base_rate:,.0f}/s = "
                    f"{base_rate / 2:,.0f}/s): "
                    f"{r} {rate:,.0f}/s = {rate / base_rate:.0%} of pgbench -> **{verdict}**."
                )
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
        "What-if engines (3 ceilings, written in bench/admit/whatif.py, not in the engine; the same counter "
        "checks pass after every cell) — to size the engine suggestions:",
        "",
        "| engine | runner | clients | adm/s | p50 / p99 ms | py CPU ms/adm | locking stmt ms | lock held "
        "after it ms (py + UPDATE + COMMIT) | host CPU % | check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for clients in args.whatif_clients:
        for (engine, c, runner), cells in whatif.items():
            if c != clients:
                continue
            cpu = (
                f"{statistics.median(x.py_cpu / x.count * 1e3 for x in cells if x.count):.2f}"
                if runner != "pgbench" and any(x.count for x in cells)
                else "–"
            )
            out.append(
                f"| {ENGINE_SHAPE.get(engine, engine)} | {runner} | {clients} | {_fmt_rate(cells)} | "
                f"{_fmt_lat(cells)} | "
                f"{cpu} | {statistics.median(x.lock_stmt_ms for x in cells):.1f} | "
                f"{statistics.median(x.held_ms for x in cells):.1f}{_fmt_split(_median_cell(cells))} | "
                f"{statistics.median(x.host_cpu_pct for x in cells):.0f} | "
                f"{', '.join(sorted({x.check for x in cells}))} |"
            )
    return out


def machine_header(args: argparse.Namespace, db: Db) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT version(), current_setting('synchronous_commit'), current_setting('shared_buffers'), "
            "current_setting('max_connections')"
        )
        version, sync, shared, maxconn = cur.fetchone()
    try:
        cpu_model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu_model = platform.processor() or "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    pgb = (
        subprocess.run([args.pgbench, "--version"], capture_output=True, text=True).stdout.strip()
        if "pgbench" in ",".join(args.runners)
        else ""
    )
    return [
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: {os.cpu_count()} CPUs ({cpu_model}), "
        f"Python {platform.python_version()}, Django {django.get_version()}, psycopg {psycopg.__version__} "
        f"({psycopg.pq.__impl__}), "
        f"{version.split(' on ')[0]} (synchronous_commit={sync}, shared_buffers={shared}, "
        f"max_connections={maxconn}), {pgb}.",
        f"Settings {args.settings} (DEBUG={settings.DEBUG}, "
        f"pool={'pool' in settings.DATABASES['default'].get('OPTIONS', {})}), "
        f"database {db.name} on {db.host}:{db.port}; GIL switch interval {sys.getswitchinterval() * 1e3:g} ms; "
        f"{args.duration} s per cell, repeat {args.repeat}, "
        f"worst case {args.worst_nano:,} nano-USD; load average at start {', '.join(f'{x:.2f}' for x in load)}"
        + (
            f"; each cell waited up to {args.quiet_wait:.0f} s for background CPU < {args.quiet_below:.0f}%."
            if args.quiet_below < 100
            else "."
        ),
        "",
    ]
