#!/usr/bin/env python
"""Counter audit benchmark: what one audit run costs as history grows.

It seeds one organization with a month cap and `runs` lifetime run budgets, each run charged
`--records` applied usage records (every record charged to its run's window and the month's),
at two sizes (`--runs` and `--scale` times it), and times at each size:

  before       the applied-spend statement the audit used until 2026-12-05 (`window_ids && <every
               live window>`, then unnest): its cost grows as records x windows
  full         `manage.py audit`'s check of every live window (alerts.audit.audit_counters)
  incremental  the scheduled run after 1 % of the runs were charged again (scheduled_audit), with
               the default rolling sample

and prints the seconds and the large/small ratio of each, checking that every audit found no
drift. It uses its own database (default capgate_bench_audit, created and migrated here) and
refuses `capgate` and `test_*` databases; its rows are replaced on every run.

Example: .venv/bin/python bench/audit.py                 (about a minute)
         .venv/bin/python bench/audit.py --runs 2000 --scale 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admit.base import migrated_django  # noqa: E402
from bench.results import write_result  # noqa: E402

DEFAULT_DB_URL = "postgres://capgate:capgate@127.0.0.1:15432/capgate_bench_audit"
COST = 1_000  # nano-USD per record


def seed(*, runs: int, records: int) -> None:
    """One organization, a month cap and `runs` run caps with `records` records each."""
    from django.db import connection  # after django.setup()

    from tenants.models import Organization  # after django.setup()

    with connection.cursor() as c:
        c.execute("TRUNCATE tenants_organization, usage_auditrun CASCADE")
    org = Organization.objects.create(name="Bench", slug="bench")
    budget_cols = (
        "organization_id, name, scope, run_id, period, timezone, mode, amount_nano, thresholds, recipients,"
        " version, version_at, created_at, updated_at"
    )
    window_cols = (
        "budget_id, budget_version, period_start, period_end, spent_nano, reserved_nano, seed_spent_nano,"
        " seed_reserved_nano, blocking, touched_at"
    )
    with connection.cursor() as c:
        c.execute(
            f"""INSERT INTO budgets_budget ({budget_cols})
                SELECT %(org)s, '', 'organization', NULL, 'month', 'UTC', 'block', 10^15, '[]', '[]', 1, now(),
                       now(), now()""",
            {"org": org.id},
        )
        c.execute(
            f"""INSERT INTO budgets_budget ({budget_cols})
                SELECT %(org)s, '', 'run', 'run-' || g, 'lifetime', 'UTC', 'block', 10^12, '[]', '[]', 1, now(),
                       now(), now()
                  FROM generate_series(1, %(runs)s) g""",
            {"org": org.id, "runs": runs},
        )
        c.execute(
            f"""INSERT INTO budgets_window ({window_cols})
                SELECT b.id, 1,
                       CASE b.scope WHEN 'run' THEN '1970-01-01'::timestamptz ELSE date_trunc('month', now()) END,
                       CASE b.scope WHEN 'run' THEN NULL ELSE date_trunc('month', now()) + interval '1 month' END,
                       CASE b.scope WHEN 'run' THEN %(records)s * %(cost)s ELSE %(runs)s * %(records)s * %(cost)s END,
                       0, 0, 0, true, now()
                  FROM budgets_budget b WHERE b.organization_id = %(org)s""",
            {"org": org.id, "records": records, "cost": COST, "runs": runs},
        )
        c.execute(
            """INSERT INTO usage_usagerecord (organization_id, run_id, request_id, subject, model, provider_model,
                       status, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_nano,
                       reserved_nano, excess_nano, error, input_bound, admitted_at, created_at, applied, applied_at,
                       window_ids)
                SELECT %(org)s, b.run_id, b.run_id || '-' || g, '{}', 'm', 'm', 'served', 0, 0, 0, 0, %(cost)s,
                       %(cost)s, 0, '', '', now(), now(), true, now(), ARRAY[rw.id, mw.id]
                  FROM budgets_budget b
                  JOIN budgets_window rw ON rw.budget_id = b.id
                  CROSS JOIN (SELECT w.id FROM budgets_window w JOIN budgets_budget m ON m.id = w.budget_id
                               WHERE m.organization_id = %(org)s AND m.scope = 'organization') mw
                  CROSS JOIN generate_series(1, %(records)s) g
                 WHERE b.organization_id = %(org)s AND b.scope = 'run'""",
            {"org": org.id, "records": records, "cost": COST},
        )
        c.execute("ANALYZE")


def before_seconds() -> float:
    """The statement the audit used before, over every live window."""
    from django.db import connection  # after django.setup()

    from ledger.models import Window  # after django.setup()

    ids = list(Window.objects.values_list("id", flat=True))
    started = time.perf_counter()
    with connection.cursor() as c:
        c.execute(
            """SELECT wid, SUM(r.cost_nano) FROM usage_usagerecord r, unnest(r.window_ids) AS wid
                WHERE r.applied AND r.window_ids && %s::bigint[] AND wid = ANY(%s::bigint[]) GROUP BY wid""",
            [ids, ids],
        )
        c.fetchall()
    return time.perf_counter() - started


def full_seconds() -> float:
    from alerts.audit import audit_counters  # after django.setup()

    started = time.perf_counter()
    report = audit_counters(record=True)
    elapsed = time.perf_counter() - started
    assert report.ok, report.drifts[:5]
    return elapsed


def incremental_seconds(*, runs: int) -> float:
    from django.db import connection  # after django.setup()

    from alerts.audit import scheduled_audit  # after django.setup()

    with connection.cursor() as c:  # 1 % of the runs charged again since the full run
        c.execute(
            """UPDATE budgets_window SET touched_at = now() + interval '1 second'
                WHERE id IN (SELECT id FROM budgets_window ORDER BY id LIMIT %s)""",
            [max(runs // 100, 1)],
        )
    started = time.perf_counter()
    report = scheduled_audit()
    elapsed = time.perf_counter() - started
    assert report is not None and report.ok, report and report.drifts[:5]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db-url", default=DEFAULT_DB_URL)
    parser.add_argument("--runs", type=int, default=1000, help="run budgets at the small size")
    parser.add_argument("--records", type=int, default=20, help="records per run")
    parser.add_argument("--scale", type=int, default=5, help="the large size is this many times the small")
    args = parser.parse_args()
    migrated_django(args.db_url)
    rows = []
    for runs in (args.runs, args.runs * args.scale):
        seed(runs=runs, records=args.records)
        rows.append((runs, runs * args.records, before_seconds(), full_seconds(), incremental_seconds(runs=runs)))
    lines = [f"{'size':<6} {'windows':>8} {'records':>9} {'before s':>9} {'full s':>8} {'incremental s':>14}"]
    for name, (runs, records, before, full, inc) in zip(("small", "large"), rows, strict=True):
        lines.append(f"{name:<6} {runs + 1:>8} {records:>9} {before:>9.2f} {full:>8.2f} {inc:>14.2f}")
    (_, _, b0, f0, i0), (_, _, b1, f1, i1) = rows
    lines.append(f"{'ratio':<6} {args.scale:>7}x {args.scale:>8}x {b1 / b0:>8.1f}x {f1 / f0:>7.1f}x {i1 / i0:>13.1f}x")
    print("\n".join(lines))
    path = write_result("audit", " ".join(sys.argv[1:]), "\n".join(lines))
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
