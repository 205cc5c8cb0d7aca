#!/usr/bin/env python
"""Request log benchmark: what one page of the log costs with a year of history.

It seeds one organization with `--records` usage records spread over 365 days (95 % served,
3 % failed upstream, 1.5 % estimated, 0.5 % released; a tenth of them in 1,000 runs; 5 keys,
200 customers) and `--refusals` refusal rows over the last 90 days, then times, best of
`--repeat`, each reader's first page of 50 rows, unfiltered and with each filter:

  before   what the Requests page and the API did until 2026-12-05: the `requestlog_entry` view
           ordered by (time, request id), counted (Paginator, LimitOffsetPagination), sliced
           (on today's schema and filters: the new indexes and the customer filter's id lookup
           help it where the planner can use them through the view)
  after    requestlog.pages.request_log_page: each side's newest 51 under its own LIMIT, merged;
           also a page deep in the history (`after deep`, the cursor of a row half a year old)

and prints milliseconds per case. It uses its own database (default capgate_bench_requestlog,
created and migrated here) and refuses `capgate` and `test_*` databases; its rows are replaced
on every run.

Example: .venv/bin/python bench/requestlog.py                 (about a minute)
         .venv/bin/python bench/requestlog.py --records 1000000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admit.base import migrated_django  # noqa: E402
from bench.results import write_result  # noqa: E402

DEFAULT_DB_URL = "postgres://capgate:capgate@127.0.0.1:15432/capgate_bench_requestlog"
PAGE = 50


def seed(*, records: int, refusals: int) -> int:
    """The organization's id, with its year of records and 90 days of refusals."""
    from django.db import connection  # after django.setup()

    from tenants.models import ApiKey, Organization, Project  # after django.setup()

    with connection.cursor() as c:
        c.execute("TRUNCATE tenants_organization CASCADE")
    org = Organization.objects.create(name="Bench", slug="bench")
    project = Project.objects.create(organization=org, name="Main", slug="main")
    for i in range(5):
        _raw, prefix, digest = ApiKey.generate()
        ApiKey.objects.create(organization=org, project=project, name=f"k{i}", prefix=prefix, key_hash=digest)
    args = {"org": org.id, "project": project.id, "records": records, "refusals": refusals}
    with connection.cursor() as c:
        c.execute(
            """INSERT INTO tenants_endcustomer (project_id, external_id, created_at)
               SELECT %(project)s, 'cust-' || g, now() FROM generate_series(0, 199) g""",
            args,
        )
        c.execute(
            """INSERT INTO usage_usagerecord (organization_id, project_id, api_key_id, end_customer_id, run_id,
                       request_id, subject, model, provider_model, status, input_tokens, output_tokens,
                       cache_read_tokens, cache_write_tokens, cost_nano, reserved_nano, excess_nano, error,
                       input_bound, admitted_at, created_at, applied, applied_at, window_ids)
               SELECT %(org)s, %(project)s, k.ids[1 + g %% 5], c.ids[1 + g %% 200],
                      CASE WHEN g %% 10 = 0 THEN 'run-' || (g / 10) %% 1000 END,
                      'req_u' || g, '{}', 'model-' || g %% 4, 'model-' || g %% 4,
                      CASE WHEN g %% 200 = 1 THEN 'released' WHEN g %% 200 < 5 THEN 'estimated'
                           WHEN g %% 200 < 11 THEN 'failed_upstream' ELSE 'served' END,
                      100, 100, 0, 0, 1000, 2000, 0, '', 'exact',
                      now() - (g * interval '365 days') / %(records)s, now(), true, now(), '{}'
                 FROM generate_series(1, %(records)s) g,
                      (SELECT array_agg(id ORDER BY id) ids FROM tenants_apikey WHERE organization_id = %(org)s) k,
                      (SELECT array_agg(id ORDER BY id) ids FROM tenants_endcustomer
                        WHERE project_id = %(project)s) c""",
            args,
        )
        c.execute(
            """INSERT INTO requestlog_refusal (request_id, organization_id, project_id, api_key_id, end_customer_id,
                       run_id, model, endpoint, status, code, http_status, reserved_nano, latency_ms, message,
                       created_at)
               SELECT 'req_r' || g, %(org)s, %(project)s, k.ids[1 + g %% 5], c.ids[1 + g %% 200], '',
                      'model-' || g %% 4, 'chat',
                      CASE WHEN g %% 3 = 0 THEN 'refused' WHEN g %% 3 = 1 THEN 'rate_limited' ELSE 'rejected' END,
                      'code', 402, 0, 1, '', now() - (g * interval '90 days') / %(refusals)s
                 FROM generate_series(1, %(refusals)s) g,
                      (SELECT array_agg(id ORDER BY id) ids FROM tenants_apikey WHERE organization_id = %(org)s) k,
                      (SELECT array_agg(id ORDER BY id) ids FROM tenants_endcustomer
                        WHERE project_id = %(project)s) c""",
            args,
        )
        c.execute("VACUUM ANALYZE usage_usagerecord")
        c.execute("VACUUM ANALYZE requestlog_refusal")
    return org.id


def cases(org_id: int) -> dict[str, dict[str, str]]:
    from tenants.models import ApiKey  # after django.setup()

    key = ApiKey.objects.filter(organization_id=org_id).order_by("id").first()
    assert key is not None
    return {
        "no filter": {},
        "status=served": {"status": "served"},
        "status=released": {"status": "released"},
        "status=refused": {"status": "refused"},
        "run": {"run": "run-7"},
        "key": {"api_key": str(key.id)},
        "customer": {"customer": "cust-7"},
        "model": {"model": "model-1"},
        "request id": {"request_id": "req_u123"},
        "last week": {"since": "2000-01-01T00:00:00Z"},  # replaced in main(): a week before now
    }


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db-url", default=DEFAULT_DB_URL)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--refusals", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reuse", action="store_true", help="time the rows a previous run seeded")
    args = parser.parse_args()
    migrated_django(args.db_url)
    from django.core.paginator import Paginator  # after django.setup()
    from django.utils import timezone  # after django.setup()

    from requestlog.filters import RequestLogFilter  # after django.setup()
    from requestlog.pages import Cursor, request_log_page  # after django.setup()
    from requestlog.selectors import request_log  # after django.setup()
    from tenants.models import Organization  # after django.setup()

    if not args.reuse:
        seed(records=args.records, refusals=args.refusals)
    org = Organization.objects.get(slug="bench")
    deep = request_log(organization=org).filter(source="usage", at__lte=timezone.now() - timedelta(days=182)).first()
    assert deep is not None
    lines = [f"{'filter':<16} {'before ms':>10} {'after ms':>9} {'after deep ms':>14} {'rows':>5}"]
    for name, data in cases(org.id).items():
        if name == "last week":
            data = {"since": (timezone.now() - timedelta(days=7)).isoformat()}
        fs = RequestLogFilter(data or None, queryset=request_log(organization=org), organization=org)
        assert not fs.is_bound or fs.is_valid(), fs.errors
        qs = fs.qs.select_related("project", "api_key", "end_customer")
        old = qs.order_by("-at", "-request_id")

        def before(old=old) -> list:
            page = Paginator(old, PAGE).get_page(1)
            return list(page)

        filters = fs.form.cleaned_data if fs.is_bound else {}

        def after(filters=filters, cursor=None) -> list:
            return request_log_page(organization=org, filters=filters, limit=PAGE, cursor=cursor).rows

        rows = after()
        assert [r.request_id for r in before()] == [r.request_id for r in rows], name  # the seed's times are distinct
        b = best_ms(before, args.repeat)
        a = best_ms(after, args.repeat)

        def after_deep(filters=filters) -> list:
            return after(filters, Cursor.of(deep))

        d = best_ms(after_deep, args.repeat)
        lines.append(f"{name:<16} {b:>10.1f} {a:>9.1f} {d:>14.1f} {len(rows):>5}")
    print("\n".join(lines))
    header = f"{args.records} usage records over 365 days, {args.refusals} refusals over 90 days, one organization"
    path = write_result("requestlog", " ".join(sys.argv[1:]), header + "\n\n" + "\n".join(lines))
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
