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

The beat runs it incrementally (`scheduled_audit`): the windows changed since its previous run plus
a rolling sample of the rest, one run at a time, in short batches; `manage.py audit` checks every
live window. Each window's expected spend is read from its own records only (`_applied_spend`).

The audit proves the cap; it is never needed to keep it, and it repairs nothing: drift means a
bug, and a bug is for a person to read. It is logged, stored (AuditRun) and alerted
(an `audit_drift` AlertEvent per window, shown on the dashboard and emailed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q, Sum
from django.utils import timezone

from alerts import alerts
from alerts.models import AuditRun
from core.guards import Guards
from ledger.models import Budget, Hold, UsageRecord, Window
from ledger.scopes import BY_NAME

log = logging.getLogger(__name__)

GUARDS = Guards(one_at_a_time="a scheduled audit runs only while no other holds the audit's lease")


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
    incremental: bool = False
    sample_after_id: int | None = None  # an incremental run's cursor for the next sample

    @property
    def ok(self) -> bool:
        return not self.drifts and not self.request_drifts

    @property
    def windows_checked(self) -> int:
        return len(self.checks)


def audit_counters(*, now: datetime | None = None, record: bool = True, incremental: bool = False) -> AuditReport:
    """Check every live window (holds left, or its period not over; lifetime windows always),
    or with `incremental` the live windows changed since the previous run plus the next sample.

    1. Choose the windows (ids only: no snapshot is held while choosing).
    2. Read them in batches of AUDIT_BATCH, each batch's counters, holds and applied usage in one
       REPEATABLE READ snapshot: admission and the drain change a counter and its rows in one
       transaction, so a consistent snapshot shows them equal even while traffic flows.
    3. Compare; each disagreement is a Drift.
    4. If `record`: store an AuditRun, log each drift and raise an `audit_drift` alert.
    """
    now = now or timezone.now()
    report = AuditReport(started_at=now)
    ids, report.sample_after_id = _incremental_ids(now) if incremental else (_live_ids(now), None)
    report.incremental = incremental
    batch = settings.CAPGATE["AUDIT_BATCH"]
    for i in range(0, len(ids), batch):
        report.checks += _read_checks(ids[i : i + batch])
    for c in report.checks:
        for counter, expected, actual in (
            ("spent", c.expected_spent_nano, c.spent_nano),
            ("reserved", c.expected_reserved_nano, c.reserved_nano),
        ):
            if expected != actual:
                report.drifts.append(Drift(c.window_id, c.budget_id, c.organization_id, counter, expected, actual))
    report.request_drifts = request_drifts()
    report.finished_at = timezone.now()
    if record:
        _record(report)
    return report


def scheduled_audit(*, now: datetime | None = None) -> AuditReport | None:
    """The beat's audit: incremental, and never two at once (None when another holds the lease).

    1. Take the lease: this run's AuditRun row, inserted as the one `running` row (a unique
       constraint); a running row older than AUDIT_LEASE was left by a worker that died
       mid-run and is closed first. A database lease holds behind PgBouncer's transaction
       pooling, where a session's advisory lock would not.
    2. Audit incrementally and record the result on that row, which releases the lease; a run
       that fails closes its row too.
    """
    now = now or timezone.now()
    AuditRun.objects.filter(running=True, started_at__lt=now - settings.CAPGATE["AUDIT_LEASE"]).update(
        running=None, finished_at=now
    )
    lease = None
    if GUARDS.one_at_a_time:
        try:
            with transaction.atomic():
                lease = AuditRun.objects.create(started_at=now, running=True, incremental=True)
        except IntegrityError:
            log.info("audit: another audit is running; this one is skipped")
            return None
    try:
        report = audit_counters(now=now, record=False, incremental=True)
        _record(report, run=lease)
        return report
    finally:
        if lease is not None:
            AuditRun.objects.filter(pk=lease.pk, running=True).update(running=None, finished_at=timezone.now())


def _live_windows(now: datetime):
    idle_since = now - settings.CAPGATE["AUDIT_IDLE_LIFETIME"]
    return Window.objects.filter(
        Q(retired_at__isnull=True, period_end__isnull=True, touched_at__gt=idle_since)
        | Q(retired_at__isnull=True, period_end__gt=now)
        | Exists(Hold.objects.filter(window=OuterRef("pk")))
    )


def _live_ids(now: datetime) -> list[int]:
    return list(_live_windows(now).order_by("id").values_list("id", flat=True))


def _incremental_ids(now: datetime) -> tuple[list[int], int | None]:
    """The live windows changed since the previous run (touched from AUDIT_OVERLAP before it
    began, or holding a reservation: an admission changes `reserved` without touching), and the
    next AUDIT_SAMPLE live windows after the last run's cursor, wrapping around; with the new
    cursor. Without a previous run, every live window."""
    last = AuditRun.objects.filter(finished_at__isnull=False).order_by("-started_at").first()
    if last is None:
        return _live_ids(now), None
    live = _live_windows(now)
    since = last.started_at - settings.CAPGATE["AUDIT_OVERLAP"]
    changed = set(
        live.filter(Q(touched_at__gte=since) | Exists(Hold.objects.filter(window=OuterRef("pk")))).values_list(
            "id", flat=True
        )
    )
    cursor = (
        AuditRun.objects.filter(finished_at__isnull=False, sample_after_id__isnull=False)
        .order_by("-started_at")
        .values_list("sample_after_id", flat=True)
        .first()
    ) or 0
    n = settings.CAPGATE["AUDIT_SAMPLE"]
    sample = list(live.filter(id__gt=cursor).order_by("id").values_list("id", flat=True)[:n])
    if len(sample) < n:  # wrap around to the start
        sample += live.filter(id__lte=cursor).order_by("id").values_list("id", flat=True)[: n - len(sample)]
    return sorted(changed | set(sample)), (sample[-1] if sample else None)


def _read_checks(ids: list[int]) -> list[WindowCheck]:
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer:
            _snapshot()
        windows = list(Window.objects.filter(id__in=ids).select_related("budget").order_by("id"))
        if not windows:
            return []
        held = dict(
            Hold.objects.filter(window_id__in=ids)
            .values("window_id")
            .annotate(s=Sum("amount_nano"))
            .values_list("window_id", "s")
        )
        applied = _applied_spend(windows)
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
        cursor.execute("SET LOCAL statement_timeout = %s", [settings.CAPGATE["AUDIT_STATEMENT_TIMEOUT_MS"]])


def _applied_spend(windows: list[Window]) -> dict[int, int]:
    """Sum of cost_nano of applied records per window they were charged to.

    A record charged to a window belongs to the window's organization and budget subject and
    was admitted inside its period (usage belongs to the period of its admission), so each
    window reads only its own records, through the index its scope has: organization, key and
    end customer by (subject, admitted_at), a run by (organization, run_id). The cost is the
    window's own history, not every record times every window."""
    by_scope: dict[str, list[int]] = {}
    for w in windows:
        by_scope.setdefault(w.budget.scope, []).append(w.id)
    totals: dict[int, int] = {}
    with connection.cursor() as cursor:
        for scope, ids in by_scope.items():
            attname = BY_NAME[scope].attname
            subject = "" if attname is None else f"AND u.{attname} = b.{attname}"
            cursor.execute(
                f"""
                SELECT w.id, (
                    SELECT coalesce(sum(u.cost_nano), 0) FROM {UsageRecord._meta.db_table} u
                     WHERE u.organization_id = b.organization_id {subject}
                       AND u.admitted_at >= w.period_start
                       AND u.admitted_at < coalesce(w.period_end, 'infinity'::timestamptz)
                       AND u.applied AND w.id = ANY(u.window_ids)
                )
                  FROM budgets_window w JOIN budgets_budget b ON b.id = w.budget_id
                 WHERE w.id = ANY(%s::bigint[])
                """,
                [ids],
            )
            totals.update({wid: int(total) for wid, total in cursor.fetchall()})
    return totals


def _label(budget: Budget) -> str:
    return budget.name or f"{budget.scope} {budget.period} {budget.mode}"


def _record(report: AuditReport, *, run: AuditRun | None = None) -> None:
    assert report.finished_at is not None  # audit_counters sets it before recording
    run = run or AuditRun(started_at=report.started_at)
    run.finished_at = report.finished_at
    run.running = None
    run.incremental = report.incremental
    run.sample_after_id = report.sample_after_id
    run.windows_checked = report.windows_checked
    run.drift_count = len(report.drifts) + len(report.request_drifts)
    run.drifts = [d.as_dict() for d in report.drifts] + [d.as_dict() for d in report.request_drifts]
    run.save()
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
