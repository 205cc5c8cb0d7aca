"""A run budget's first window is seeded with the run's recorded spend, found through the run's
own index: the first call of a new run costs the same in an organization with years of history."""

import json

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import UsageRecord
from ledger.windows import ensure_windows
from tests.conftest import usd, window_of


def _records(acme, *, n: int, run_id: str | None, cost_nano: int) -> None:
    now = timezone.now()
    UsageRecord.objects.bulk_create(
        UsageRecord(
            organization=acme.org,
            request_id=f"{run_id or 'plain'}-{i}",
            status=UsageRecord.Status.SERVED,
            run_id=run_id,
            cost_nano=cost_nano,
            applied=True,
            admitted_at=now,
        )
        for i in range(n)
    )


def test_run_window_seed_reads_the_run_index(acme):
    # given: an organization's history of records without a run, and three of run r1
    _records(acme, n=5000, run_id=None, cost_nano=1)
    _records(acme, n=3, run_id="r1", cost_nano=usd("0.01"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE usage_usagerecord")
    budget = acme.budget(amount="1", scope="run", run_id="r1", period="lifetime")
    # when: the run's window is created
    with CaptureQueriesContext(connection) as queries:
        ensure_windows(budgets=[budget], now=timezone.now())
    # then: it starts with the run's spend, and the seed reads the run's index, not the history
    assert window_of(budget).spent_nano == 3 * usd("0.01")
    (seed,) = [q["sql"] for q in queries.captured_queries if "INSERT INTO budgets_window" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {seed}")
        plan = json.dumps(cursor.fetchone()[0])
    assert "usage_run_idx" in plan, plan
