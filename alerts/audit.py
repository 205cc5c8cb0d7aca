"""The counter audit: every live window's counters equal the rows behind them.

    reserved_nano == sum of the window's live holds
    spent_nano    == seed + sum of cost_nano of applied usage records charged to the window

where the seed is the spend a window was created with (a budget created mid-period starts with
the period's already-recorded spend; ledger.windows.ensure_windows).

A window can agree with its own rows and still be wrong about the request behind them (a
proxied call's cost replaced by someone else's $0 settle). So beside the windows there is a
check per request:

    every record's cost_nano == what was reported for it (reported_cost_nano), where reported

A report that reaches an already-final record is kept on it rather than dropped
(ledger.recording), so a lost cost shows here.

Live windows: those with holds, and those not retired whose period is not over; a lifetime
window with no holds leaves the set after CAPGATE["AUDIT_IDLE_LIFETIME"] without a charge (a
finished run's), and stays in history.

The audit proves the cap; it is never needed to keep it, and it repairs nothing: drift means a
bug, and a bug is for a person to read. It is logged, stored (AuditRun) and alerted
(an `audit_drift` AlertEvent per window, shown on the dashboard and emailed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, Sum
from django.utils import timezone

from alerts import alerts
from alerts.models import AuditRun
from ledger.models import Budget, Hold, UsageRecord, Window

log = logging.getLogger(__name__)

# The field holding a window's creation-time spend. Until budgets.Window has it, windows are
# taken to start at zero (a budget created mid-period would then show as drift).


@dataclass(frozen=True)
class WindowCheck:
    window_id: int
    budget_id: int
    organization_id: int
    budget_label: str
    spent_nano: int
    expected_spent_nano: int
    reserved_nano: int
    expected_reserved_nano: int

    @property
    def ok(self) -> bool:
        return self.spent_nano == self.expected_spent_nano and self.reserved_nano == self.expected_reserved_nano


@dataclass(frozen=True)
class Drift:
    window_id: int
    budget_id: int
    organization_id: int
    counter: str  # "spent" | "reserved"
    expected_nano: int
    actual_nano: int

    @property
    def delta_nano(self) -> int:
        return self.actual_nano - self.expected_nano

    def as_dict(self) -> dict:
        return {
            "window_id": self.window_id,
            "budget_id": self.budget_id,
            "organization_id": self.organization_id,
            "counter": self.counter,
            "expected_nano": self.expected_nano,
            "actual_nano": self.actual_nano,
        }


@dataclass(frozen=True)
class RequestDrift:
    """A request whose recorded cost is not what was reported for it."""

    record_id: int
    request_id: str
    organization_id: int
    reported_nano: int
    recorded_nano: int

    def as_dict(self) -> dict:
        return {
            "record_id": self.record_id,
            "request_id": self.request_id,
            "organization_id": self.organization_id,
            "counter": "request_cost",
            "expected_nano": self.reported_nano,
            "actual_nano": self.recorded_nano,
        }


@dataclass
class AuditReport:
    started_at: datetime
    finished_at: datetime | None = None
    checks: list[WindowCheck] = field(default_factory=list)
    drifts: list[Drift] = field(default_factory=list)
    request_drifts: list[RequestDrift] = field(default_factory=list)
    run_id: int | None = None

    @property
    def ok(self) -> bool:
        return not self.drifts and not self.request_drifts

    @property
    def windows_checked(self) -> int:
        return len(self.checks)


def audit_counters(*, now: datetime | None = None, record: bool = True) -> AuditReport:
    """Check every live window (holds left, or its period not over; lifetime windows always).

    1. Read counters, holds and applied usage in one REPEATABLE READ snapshot: admission and
       the drain change a counter and its rows in one transaction, so a consistent snapshot
       shows them equal even while traffic flows.
    2. Compare; each disagreement is a Drift.
    3. If `record`: store an AuditRun, log each drift and raise an `audit_drift` alert.
    """
    now = now or timezone.now()
    report = AuditReport(started_at=now)
    report.checks = _read_checks(now)
    for c in report.checks:
        if c.spent_nano != c.expected_spent_nano:
            report.drifts.append(
                Drift(
                    c.window_id,
                    c.budget_id,
                    c.organization_id,
                    "spent",
                    c.expected_spent_nano,
                    c.spent_nano,
                )
            )
        if c.reserved_nano != c.expected_reserved_nano:
            report.drifts.append(
                Drift(
                    c.window_id,
                    c.budget_id,
                    c.organization_id,
                    "reserved",
                    c.expected_reserved_nano,
                    c.reserved_nano,
                )
            )
    report.request_drifts = request_drifts()
    report.finished_at = timezone.now()
    if record:
        _record(report)
    return report


def _read_checks(now: datetime) -> list[WindowCheck]:
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer:
            _snapshot()
        idle_since = now - settings.CAPGATE["AUDIT_IDLE_LIFETIME"]
        live = (
            Window.objects.filter(
                Q(retired_at__isnull=True, period_end__isnull=True, touched_at__gt=idle_since)
                | Q(retired_at__isnull=True, period_end__gt=now)
                | Exists(Hold.objects.filter(window=OuterRef("pk")))
            )
            .select_related("budget")
            .order_by("id")
        )
        windows = list(live)
        ids = [w.id for w in windows]
        if not ids:
            return []
        held = dict(
            Hold.objects.filter(window_id__in=ids)
            .values("window_id")
            .annotate(s=Sum("amount_nano"))
            .values_list("window_id", "s")
        )
        applied = _applied_spend(ids)
    return [
        WindowCheck(
            window_id=w.id,
            budget_id=w.budget_id,
            organization_id=w.budget.organization_id,
            budget_label=_label(w.budget),
            spent_nano=w.spent_nano,
            expected_spent_nano=w.seed_spent_nano + applied.get(w.id, 0),
            reserved_nano=w.reserved_nano,
            expected_reserved_nano=held.get(w.id) or 0,
        )
        for w in windows
    ]


def request_drifts(*, limit: int = 1000) -> list[RequestDrift]:
    """Applied records whose cost differs from what was reported for them (partial index)."""
    rows = (
        UsageRecord.objects.filter(applied=True, reported_cost_nano__isnull=False)
        .exclude(reported_cost_nano=F("cost_nano"))
        .order_by("id")
        .values_list("id", "request_id", "organization_id", "reported_cost_nano", "cost_nano")[:limit]
    )
    return [RequestDrift(rid, request_id, org, reported or 0, cost) for rid, request_id, org, reported, cost in rows]


def _snapshot() -> None:
    # Must be the transaction's first statement; skipped when the caller already runs in a
    # transaction (tests), which then provides its own consistent view.
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def _applied_spend(window_ids: list[int]) -> dict[int, int]:
    """Sum of cost_nano of applied records per window they were charged to."""
    sql = f"""
        SELECT wid, SUM(r.cost_nano)
          FROM {UsageRecord._meta.db_table} r, unnest(r.window_ids) AS wid
         WHERE r.applied AND r.window_ids && %s::bigint[] AND wid = ANY(%s::bigint[])
         GROUP BY wid
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [window_ids, window_ids])
        return {wid: int(total) for wid, total in cursor.fetchall()}


def _label(budget: Budget) -> str:
    return budget.name or f"{budget.scope} {budget.period} {budget.mode}"


def _record(report: AuditReport) -> None:
    assert report.finished_at is not None  # audit_counters sets it before recording
    run = AuditRun.objects.create(
        started_at=report.started_at,
        finished_at=report.finished_at,
        windows_checked=report.windows_checked,
        drift_count=len(report.drifts) + len(report.request_drifts),
        drifts=[d.as_dict() for d in report.drifts] + [d.as_dict() for d in report.request_drifts],
    )
    for rd in report.request_drifts:
        log.error(
            "audit: request %s (organization %s) recorded at %s nano, reported at %s nano",
            rd.request_id,
            rd.organization_id,
            rd.recorded_nano,
            rd.reported_nano,
        )
    report.run_id = run.id
    by_window: dict[int, list[Drift]] = {}
    for d in report.drifts:
        log.error(
            "audit: window %s (budget %s, organization %s) %s counter is %s, its rows say %s (drift %+d nano)",
            d.window_id,
            d.budget_id,
            d.organization_id,
            d.counter,
            d.actual_nano,
            d.expected_nano,
            d.delta_nano,
        )
        by_window.setdefault(d.window_id, []).append(d)
    for window_id, drifts in by_window.items():
        detail = "; ".join(
            f"{d.counter}: counter {d.actual_nano} nano, rows {d.expected_nano} nano ({d.delta_nano:+d})"
            for d in drifts
        )
        alerts.note_drift(window_id=window_id, detail=f"audit run {run.id}: {detail}")
