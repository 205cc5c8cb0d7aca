"""The admission benchmark's run, after Django is set up: every cell of the plan (--repeat times),
then the report. bench/admission.py parses the command line and calls `run`."""

from __future__ import annotations

import argparse
import sys
import time

from bench.admit.base import ROOT, RUNNERS, Db
from bench.admit.cell import Cell, background_cpu
from bench.admit.exhaustion import Exhaustion, run_exhaustion
from bench.admit.leases import MAX_PROCESSES, run_leases_cell
from bench.admit.leases_report import print_exhaustion, report_leases
from bench.admit.pgbench import match_admit_script, run_pgbench_cell
from bench.admit.profiling import profile, trace_round_trips
from bench.admit.report import machine_header, report, report_whatif
from bench.admit.tenant import Tenant, close_db, ensure_tenant, reset
from bench.admit.whatif import WHATIF
from bench.admit.workers import run_python_cell


def run_cell(
    runner: str,
    tenants: dict[int, Tenant],
    ceilings: int,
    clients: int,
    mode: str,
    args: argparse.Namespace,
    db: Db,
    label: str,
) -> Cell:
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
        elif runner.startswith("leases"):
            cell = run_leases_cell(tenant, clients, args, cache_budgets=runner == "leases-cached")
        else:
            cell = run_python_cell(runner, tenant, clients, mode, args)
        if cell.count or not cell.errors or attempt:
            break
        print(f"  {label} {runner} {clients} clients failed ({cell.errors[0]}); once more", flush=True)
        reset(list(tenants.values()))
    cell.bg_cpu_pct = bg
    print(
        f"  {label} {ceilings} ceiling(s) {clients:>3} clients {runner:<12} {mode:<10} {cell.rate:>7,.0f}/s  "
        f"p50 {cell.p50_ms:6.1f} ms  p99 {cell.p99_ms:6.1f} ms  lock stmt {cell.lock_stmt_ms:5.1f} held "
        f"{cell.held_ms:5.1f} ms"
        + (" (py {:.1f} + UPDATE {:.1f} + COMMIT {:.1f})".format(*cell.held_split) if cell.held_split else "")
        + "  "
        f"host CPU {cell.host_cpu_pct:3.0f}% (bg {bg:3.0f}%)  "
        f"{cell.note}  {cell.check}" + (f"  errors: {cell.errors[:2]}" if cell.errors else ""),
        flush=True,
    )
    return cell


def run(args: argparse.Namespace, db: Db, argv: list[str] | None) -> int:
    """Every cell, the profile and the report; 1 if any counter check failed."""
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
        header.insert(
            -1,
            (
                f"An admission (matching_budgets + admit()) with {c} ceiling(s) makes {len(tenant.admit_sql)} "
                "round trips; pgbench-admit runs "
                + (
                    f"`{tenant.admit_script.relative_to(ROOT)}` (same statements)."
                    if tenant.admit_script
                    else "nothing: no script matches it."
                )
            ),
        )
    print("\n".join(header), flush=True)

    results: dict = {}
    cycles: list[Cell] = []
    exhaustions: list[Exhaustion] = []
    whatif: dict = {}
    runners = [r for r in RUNNERS if r in args.runners]
    py_runners = [r for r in ("threads", "processes") if r in args.runners]
    for rep in range(args.repeat):
        label = f"[{rep + 1}/{args.repeat}]"
        for ceilings in args.ceilings:
            for clients in args.clients:
                for runner in runners:
                    if runner.startswith("leases") and clients > MAX_PROCESSES:
                        continue  # N processes of 3 connections each: the table shows –
                    cell = run_cell(runner, tenants, ceilings, clients, "admit", args, db, label)
                    results.setdefault((ceilings, clients, runner), []).append(cell)
        for clients in args.cycle_clients:
            for runner in py_runners:
                cycles.append(run_cell(runner, tenants, 3, clients, "cycle", args, db, label))
        for slices_on in args.exhaust_slices if args.exhaust else []:
            reset(list(tenants.values()))
            exhaustions.append(run_exhaustion(args, slices_on=slices_on))
            print_exhaustion(exhaustions[-1])
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
    leases = report_leases(results, exhaustions, args)
    lines += [""] + leases if leases else []
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
    return 1 if any(c.check.startswith("FAIL") for c in [*every, *exhaustions]) else 0
