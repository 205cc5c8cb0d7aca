"""Admission: reserve a request's worst case on every ceiling it falls under, or refuse it.

The invariant (DESIGN §1): for each blocking window, spent + reserved never exceeds the budget
by admission — only a provider billing above a reserved worst case can push spent past it.

Why this holds under concurrency: every admission that touches a ceiling locks that ceiling's
window row (in ascending id order, so overlapping ceiling sets cannot deadlock), reads its
counters, and adds its worst case to `reserved` before committing. A competing admission waits
on the lock and then reads counters that already include the first one's hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet, Sum
from django.utils import timezone

from budgets.errors import BudgetExceeded
from budgets.models import Budget, Hold, Reservation, Window
from budgets.periods import period_bounds

# Narrowest first: when several ceilings refuse, the user is told the most specific one.
_SCOPE_ORDER = {s: i for i, s in enumerate(["run", "end_customer", "key", "member", "project", "organization"])}


@dataclass(frozen=True)
class Subject:
    """Who a request is charged to."""

    organization_id: int
    project_id: int | None = None
    member_id: int | None = None
    api_key_id: int | None = None
    end_customer_id: int | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class AdmissionRequest:
    subject: Subject
    request_id: str
    worst_nano: int
    model: str = ""
    owner_id: int | None = None
    lease: timedelta | None = None
    now: datetime | None = None  # tests pin the clock (e.g. 23:59:59)
    budgets: Sequence[Budget] | None = None  # matching budgets, when the caller already has them


@dataclass
class Ceiling:
    window_id: int
    budget_id: int
    scope: str
    code: str
    limit_nano: int
    spent_nano: int
    reserved_nano: int

    @property
    def remaining_nano(self) -> int:
        return self.limit_nano - self.spent_nano - self.reserved_nano


@dataclass
class Admitted:
    reservation: Reservation
    ceilings: list[Ceiling] = field(default_factory=list)


def matching_budgets(subject: Subject) -> list[Budget]:
    """Every budget (alert or block) whose scope covers the subject."""
    match = Q(scope=Budget.Scope.ORGANIZATION)
    for scope, attr, fk in [
        (Budget.Scope.PROJECT, "project_id", "project_id"),
        (Budget.Scope.MEMBER, "member_id", "member_id"),
        (Budget.Scope.KEY, "api_key_id", "api_key_id"),
        (Budget.Scope.END_CUSTOMER, "end_customer_id", "end_customer_id"),
        (Budget.Scope.RUN, "run_id", "run_id"),
    ]:
        value = getattr(subject, attr)
        if value is not None:
            match |= Q(scope=scope, **{fk: value})
    return list(Budget.objects.filter(match, organization_id=subject.organization_id).order_by("id"))


def ensure_windows(*, budgets: Sequence[Budget], now: datetime) -> dict[int, int]:
    """Return {budget_id: window_id} for the period containing `now`, creating missing windows.

    Creation is INSERT .. ON CONFLICT DO NOTHING, so racing first requests agree on one row.
    A window created mid-period starts with the period's already-recorded spend for its scope.
    Runs outside the admission transaction: it takes no lock the admission needs.
    """
    if not budgets:
        return {}
    bounds = {b.id: period_bounds(period=b.period, tz=b.timezone, now=now) for b in budgets}
    wanted = Q()
    for b in budgets:
        wanted |= Q(budget_id=b.id, period_start=bounds[b.id][0])
    found = dict(Window.objects.filter(wanted).values_list("budget_id", "id"))
    missing = [b for b in budgets if b.id not in found]
    if missing:
        seeds = {b.id: _recorded_spend(b, *bounds[b.id]) for b in missing}
        Window.objects.bulk_create(
            [
                Window(
                    budget_id=b.id,
                    period_start=bounds[b.id][0],
                    period_end=bounds[b.id][1],
                    spent_nano=seeds[b.id],
                    seed_spent_nano=seeds[b.id],
                )
                for b in missing
            ],
            ignore_conflicts=True,
        )
        again = Q()
        for b in missing:
            again |= Q(budget_id=b.id, period_start=bounds[b.id][0])
        found.update(Window.objects.filter(again).values_list("budget_id", "id"))
    return found


def _recorded_spend(budget: Budget, start: datetime, end: datetime | None) -> int:
    # Looked up by name: usage builds on budgets, not the reverse (imports flow one way).
    usage_record = apps.get_model("usage", "UsageRecord")
    filters: dict[str, dict[str, object]] = {
        Budget.Scope.ORGANIZATION: {},
        Budget.Scope.PROJECT: {"project_id": budget.project_id},
        Budget.Scope.MEMBER: {"member_id": budget.member_id},
        Budget.Scope.KEY: {"api_key_id": budget.api_key_id},
        Budget.Scope.END_CUSTOMER: {"end_customer_id": budget.end_customer_id},
        Budget.Scope.RUN: {"run_id": budget.run_id},
    }
    scope_filter = filters[Budget.Scope(budget.scope)]
    qs = usage_record.objects.filter(organization_id=budget.organization_id, admitted_at__gte=start, **scope_filter)
    if end is not None:
        qs = qs.filter(admitted_at__lt=end)
    return qs.aggregate(total=Sum("cost_nano"))["total"] or 0


def windows_for_update(ids: Sequence[int]) -> QuerySet[Window]:
    """Lock windows in ascending id order (the one global order: no deadlocks).

    FOR NO KEY UPDATE, not FOR UPDATE: holds reference windows by foreign key, and inserting one
    takes FOR KEY SHARE on the window, which FOR UPDATE would conflict with (two admissions that
    inserted holds and then waited on each other's windows would deadlock). We only change
    counters, never the key, so NO KEY UPDATE is the exact strength needed.
    """
    return Window.objects.select_for_update(no_key=True, of=("self",)).filter(id__in=ids).order_by("id")


def read_ceilings(ids: Sequence[int]) -> list[Ceiling]:
    """Lock and read the ceilings' counters (inside the admission transaction)."""
    rows = windows_for_update(ids).values_list(
        "id", "budget_id", "budget__scope", "budget__amount_nano", "spent_nano", "reserved_nano"
    )
    return [
        Ceiling(
            window_id=wid,
            budget_id=bid,
            scope=scope,
            code="customer_budget" if scope == Budget.Scope.END_CUSTOMER else f"{scope}_budget",
            limit_nano=amount,
            spent_nano=spent,
            reserved_nano=reserved,
        )
        for wid, bid, scope, amount, spent, reserved in rows
    ]


def _refusal(ceilings: list[Ceiling], worst_nano: int) -> BudgetExceeded | None:
    failing = [c for c in ceilings if c.spent_nano + c.reserved_nano + worst_nano > c.limit_nano]
    if not failing:
        return None
    c = min(failing, key=lambda c: (_SCOPE_ORDER[c.scope], c.remaining_nano))
    return BudgetExceeded(
        code=c.code,
        budget_id=c.budget_id,
        window_id=c.window_id,
        limit_nano=c.limit_nano,
        remaining_nano=c.remaining_nano,
        worst_nano=worst_nano,
    )


# Test hook point (Saleor's RunAfter idea): called between the ceiling read and the write.
# Race tests set it to widen the window a broken guard would leave open. None in production.
after_ceiling_read: Callable[[], None] | None = None


def admit(*, request: AdmissionRequest) -> Admitted:
    """Reserve `request.worst_nano` on every ceiling, or raise BudgetExceeded.

    1. Find the matching budgets and make sure each has its current window (no locks).
    2. In one transaction: insert the reservation and its holds (invisible until commit and
       rolled back on refusal, so they are written before the lock to keep it short), lock the
       blocking windows in id order, check each has room, add the worst case to `reserved`.
    Alert budgets never refuse; they get a zero hold so the drain charges their window of the
    admitting period.
    """
    now = request.now or timezone.now()
    subject = request.subject
    budgets = request.budgets if request.budgets is not None else matching_budgets(subject)
    window_of = ensure_windows(budgets=budgets, now=now)
    blocking = sorted(window_of[b.id] for b in budgets if b.mode == Budget.Mode.BLOCK)
    lease = request.lease or settings.CAPGATE["LEASE"]
    worst = request.worst_nano
    if worst < 0:
        raise ValueError("worst case must be >= 0")

    with transaction.atomic():
        reservation = Reservation.objects.create(
            request_id=request.request_id,
            organization_id=subject.organization_id,
            project_id=subject.project_id,
            member_id=subject.member_id,
            api_key_id=subject.api_key_id,
            end_customer_id=subject.end_customer_id,
            run_id=subject.run_id,
            model=request.model,
            amount_nano=worst,
            owner_id=request.owner_id,
            created_at=now,
            expires_at=now + lease,
            deadline_at=now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
        )
        blocking_set = set(blocking)
        Hold.objects.bulk_create(
            Hold(reservation=reservation, window_id=wid, amount_nano=worst if wid in blocking_set else 0)
            for wid in sorted(window_of.values())
        )
        ceilings: list[Ceiling] = []
        if blocking:
            ceilings = read_ceilings(blocking)
            if after_ceiling_read is not None:
                after_ceiling_read()
            refusal = _refusal(ceilings, worst)
            if refusal is not None:
                raise refusal
            Window.objects.filter(id__in=blocking).update(reserved_nano=F("reserved_nano") + worst)
    return Admitted(reservation=reservation, ceilings=ceilings)


def renew(*, owner_ids: Sequence[int], now: datetime | None = None, lease: timedelta | None = None) -> int:
    """Extend the leases of reservations owned by live gateway processes, never past the
    hard deadline. One statement; safe to run concurrently (last writer wins, same value)."""
    now = now or timezone.now()
    lease = lease or settings.CAPGATE["LEASE"]
    return Reservation.objects.filter(owner_id__in=list(owner_ids), deadline_at__gt=now).update(
        expires_at=now + lease
    )


def headroom(*, budgets: Sequence[Budget], now: datetime | None = None) -> Ceiling | None:
    """The tightest blocking ceiling's current state, read without locks.

    Used to pick an output ceiling a budget can afford before admission; admission re-checks
    under the lock, so a stale read can only cause a refusal, never an overrun.
    """
    now = now or timezone.now()
    budgets = [b for b in budgets if b.mode == Budget.Mode.BLOCK]
    if not budgets:
        return None
    window_of = ensure_windows(budgets=budgets, now=now)
    ceilings = [
        Ceiling(
            window_id=w.id, budget_id=w.budget_id, scope=w.budget.scope, code=w.budget.error_code,
            limit_nano=w.budget.amount_nano, spent_nano=w.spent_nano, reserved_nano=w.reserved_nano,
        )
        for w in Window.objects.select_related("budget").filter(id__in=window_of.values())
    ]
    return min(ceilings, key=lambda c: c.remaining_nano)
