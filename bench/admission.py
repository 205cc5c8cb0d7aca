#!/usr/bin/env python
"""Admission benchmark: how fast can one hot organization be admitted, next to what pgbench
reaches on the same Postgres with the same SQL (the database's own limit on this machine).

For 1 ceiling (an organization cap) and 3 stacked ceilings (organization + project + key caps)
at each client count, it runs for a fixed duration:

  threads     N Python threads in this process, each with its own DB connection, released by
              one barrier, admitting in a loop as the gateway does: matching_budgets(subject), then
              ledger.admission.admit(request=AdmissionRequest(..., budgets=budgets))
  processes   N forked processes doing the same, one connection each (the gateway runs several
              processes; threads share one GIL)
  leases      N forked processes, each a gateway process in miniature with its own headroom-slice
              Book (ledger/slices.py), owner and connections: admit from slices in memory, record in
              groups (record_many carves each out of its slice), settle, drain every ~50 ms, give
              unused parts back; LISTEN for other processes' refusals (bench/admit/leases.py). The
              rate counts admit -> record -> settle, recording included; at most 16 processes
  leases-cached  what-if, only when named: the same with each process's budgets read once instead of
              per request (what a budget cache would buy; not what the gateway does today)
  pgbench     pgbench -c N -j N on bench/pgbench/admission_{1,3}.sql: the classic admission
              transaction (BEGIN; insert reservation; insert holds; SELECT .. FOR NO KEY UPDATE;
              UPDATE reserved; COMMIT) with Django's SQL: the issue's reference and the target's base
  pgbench-admit  pgbench on the script that issues exactly what admit() issues today, every round
              trip (found by comparing a libpq trace of admit() with bench/pgbench/admission_N_stmt.sql,
              the one-statement engine, and admission_N_full.sql, the classic one)

and, as extra rows, an exhaustion run of the leases runner (--exhaust: a cap worth that many
worst cases driven to exhaustion by --leases-processes processes, with slices on and off: the spend
at the first refusal as a share of the cap, the final spend, what is left reserved), and admit ->
record -> drain cycles (workers admit and record; one drainer
thread applies the outbox every ~50 ms, as a gateway process does). It prints admissions/s and
p50/p99 latency per cell, checks the counters after every cell (reserved == sum of holds ==
admitted x worst case; after a cycle run: nothing reserved, spent == recorded cost, no
reservation left), and profiles one admit() (statements, round trips, Python vs database time).
With --whatif it also runs leaner admission engines (bench/admit/whatif.py: hand-written SQL;
budgets and windows cached per process; the classic transaction with that cache, for contrast)
and pgbench on the bare admission statement (bench/pgbench/admission_3_onestmt.sql), to size
engine suggestions.

Budgets are $1,000,000 each (never refuse); reservations, holds and usage rows are truncated
and counters zeroed between cells. It uses its own database (default capgate_bench, created and
migrated here); it refuses to touch `capgate` or `test_*` databases.

Examples: .venv/bin/python bench/admission.py                      (about 6 minutes)
          .venv/bin/python bench/admission.py --clients 4 --ceilings 1 --runners leases,pgbench
          .venv/bin/python bench/admission.py --clients 32 --ceilings 3 --repeat 3
          .venv/bin/python bench/admission.py --clients 1,32 --ceilings 3 --whatif
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a script (python bench/admission.py), the repository root is not on the path yet.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.admit.base import DEFAULT_DB_URL, OPT_IN, RUNNERS, create_database, parse_db_url, setup_django  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/admission.py",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--duration",
        type=int,
        default=3,
        help="seconds per cell (default 3; pgbench -T takes whole seconds)",
    )
    p.add_argument(
        "--clients",
        type=_ints,
        default=[1, 4, 8, 32, 64],
        help="client counts, comma separated (default 1,4,8,32,64; the leases runner skips those over 16)",
    )
    p.add_argument(
        "--ceilings",
        type=_ints,
        default=[1, 3],
        help="stacked ceilings per admission: 1 and/or 3 (default 1,3)",
    )
    p.add_argument(
        "--runners",
        default=",".join(r for r in RUNNERS if r not in OPT_IN),
        help=f"comma separated subset of {','.join(RUNNERS)} (default: all but {','.join(OPT_IN)})",
    )
    p.add_argument(
        "--cycle-clients",
        type=_ints,
        default=[32],
        help="client counts for the admit->record->drain rows (3 ceilings; default 32; empty to skip)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every cell N times; the table shows medians and the adm/s range (default 1)",
    )
    p.add_argument(
        "--worst-nano",
        type=int,
        default=37_000_000,
        help="worst case reserved per admission, nano-USD (default 37,000,000 = $0.037)",
    )
    p.add_argument(
        "--leases-group",
        type=int,
        default=16,
        help="leases: admissions per record_many (the group commit's batch; default 16)",
    )
    p.add_argument(
        "--leases-processes",
        type=int,
        default=4,
        help="leases: processes of the exhaustion run, and the client count of its throughput target (default 4)",
    )
    p.add_argument(
        "--exhaust",
        type=int,
        default=20_000,
        help="leases exhaustion run: the cap in worst cases (default 20,000; 0 skips it)",
    )
    p.add_argument(
        "--exhaust-cost",
        type=float,
        default=1.0,
        help="exhaustion: each admission is settled at this fraction of its worst case (default 1.0)",
    )
    p.add_argument(
        "--exhaust-slices",
        default="on,off",
        help="exhaustion with slices on and/or off (default on,off)",
    )
    p.add_argument(
        "--exhaust-timeout",
        type=int,
        default=900,
        help="exhaustion: the longest a run may take, seconds (default 900)",
    )
    p.add_argument(
        "--profile-calls",
        type=int,
        default=300,
        help="sequential admit() calls timed for the profile (0 skips the profile; default 300)",
    )
    p.add_argument(
        "--whatif",
        action="store_true",
        help=(
            "also measure leaner admission engines (bench/admit/whatif.py: hand-written SQL, cached "
            "budgets/windows, the classic transaction for contrast) at --whatif-clients, 3 ceilings, to size "
            "engine suggestions (adds ~100 s)"
        ),
    )
    p.add_argument(
        "--whatif-clients",
        type=_ints,
        default=[1, 32],
        help="client counts for --whatif (default 1,32)",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help=(
            "sys.setswitchinterval() for the workers, seconds (default: Python's 0.005); shows how much of "
            "the threads' lock hold is GIL waiting"
        ),
    )
    p.add_argument(
        "--quiet-below",
        type=float,
        default=100.0,
        help="before each cell, wait until the host's background CPU busy %% is below this (default 100: never wait)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="longest wait per cell for --quiet-below, seconds (default 60)",
    )
    p.add_argument(
        "--db-url",
        default=DEFAULT_DB_URL,
        help=f"benchmark database, created if missing (default {DEFAULT_DB_URL})",
    )
    p.add_argument(
        "--settings",
        default="config.settings.prod",
        help="Django settings module (default config.settings.prod: DEBUG off, psycopg pool on)",
    )
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
    words = [w.strip() for w in args.exhaust_slices.split(",") if w.strip()]
    if set(words) - {"on", "off"}:
        p.error("--exhaust-slices takes on and/or off")
    args.exhaust_slices = [w == "on" for w in words]
    if not 0 <= args.exhaust_cost <= 1 or args.leases_group < 1 or args.exhaust < 0:
        p.error("--exhaust-cost must be in [0, 1], --leases-group >= 1, --exhaust >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    db = parse_db_url(args.db_url)
    create_database(db)
    setup_django(args)
    from bench.admit.run import run  # after django.setup(): the benchmark's modules import models

    return run(args, db, argv)


if __name__ == "__main__":
    sys.exit(main())
