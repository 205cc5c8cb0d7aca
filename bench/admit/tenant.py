"""The hot organizations the admission benchmark admits into (1 and 3 stacked ceilings), and the
reset between cells."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection, connections
from django.utils import timezone

from core.money import NANO_PER_USD
from ledger.admission import Subject, matching_budgets
from ledger.models import Budget, Hold, Reservation, UsageRecord, Window
from ledger.windows import ensure_windows
from tenants.models import ApiKey, Organization, Project

BUDGET_NANO = 1_000_000 * NANO_PER_USD  # $1M per budget: never refuses during a run


@dataclass
class Tenant:
    ceilings: int
    subject: Subject
    org_id: int
    project_id: int
    key_id: int
    budget_ids: list[int]
    window_ids: list[int]  # ascending, parallel to budget_ids sorted by window id
    period_start: dt.datetime
    admit_sql: list[str] = field(default_factory=list)  # what one admit() sends (libpq trace)
    admit_script: Path | None = None  # the pgbench script with the same statements


def ensure_tenant(ceilings: int, *, slug: str = "", amount_nano: int = BUDGET_NANO) -> Tenant:
    """The hot organization with `ceilings` blocking budgets of `amount_nano` each (default: the
    never-refusing $1M; the leases exhaustion run passes a small cap and its own slug)."""
    slug = slug or f"bench-{ceilings}-ceiling"
    org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": slug.replace("-", " ").capitalize()})
    project, _ = Project.objects.get_or_create(organization=org, slug="main", defaults={"name": "Main"})
    key = ApiKey.objects.filter(organization=org, name="bench").first()
    if key is None:
        _raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(organization=org, project=project, name="bench", prefix=prefix, key_hash=digest)
    wanted: list[tuple[str, dict[str, Any]]] = [("organization", {})]
    if ceilings == 3:
        wanted += [("project", {"project": project}), ("key", {"api_key": key})]
    for scope, kw in wanted:
        Budget.objects.update_or_create(
            organization=org,
            scope=scope,
            **kw,
            defaults={
                "mode": "block",
                "period": "month",
                "timezone": "UTC",
                "amount_nano": amount_nano,
            },
        )
    # The subject always names its project and key, as the gateway's does; the 1-ceiling
    # organization simply has no project or key budget.
    subject = Subject(organization_id=org.id, project_id=project.id, api_key_id=key.id)
    budgets = matching_budgets(subject)
    assert len(budgets) == ceilings and all(b.mode == "block" for b in budgets), budgets
    window_of = ensure_windows(budgets=budgets, now=timezone.now())
    pairs = sorted((window_of[b.id], b.id) for b in budgets)
    return Tenant(
        ceilings=ceilings,
        subject=subject,
        org_id=org.id,
        project_id=project.id,
        key_id=key.id,
        budget_ids=[b for _, b in pairs],
        window_ids=[w for w, _ in pairs],
        period_start=Window.objects.get(id=pairs[0][0]).period_start,
    )


def reset(tenants: list[Tenant]) -> None:
    """Empty the reservation/hold/usage tables, zero the counters, vacuum the hot rows."""
    tables = ", ".join(f'"{m._meta.db_table}"' for m in (UsageRecord, Hold, Reservation))
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {tables} CASCADE")  # bench database only
        Window.objects.filter(id__in=[w for t in tenants for w in t.window_ids]).update(reserved_nano=0, spent_nano=0)
        cur.execute(f'VACUUM (ANALYZE) "{Window._meta.db_table}", {tables}')


def close_db() -> None:
    """Close this thread's connection and the shared pool (before forking workers)."""
    for conn in connections.all(initialized_only=True):
        conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            close_pool()
