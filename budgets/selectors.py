"""Reads on budgets: each budget's current window as the dashboard and API show it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from ledger.models import Budget, Reservation, UsageRecord, Window
from ledger.periods import period_bounds
from ledger.scopes import subject_filter


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    period_start: datetime
    period_end: datetime | None
    spent_nano: int
    reserved_nano: int

    @property
    def remaining_nano(self) -> int:
        return self.budget.amount_nano - self.spent_nano - self.reserved_nano

    @property
    def used_nano(self) -> int:
        return self.spent_nano + self.reserved_nano

    @property
    def percent_used(self) -> Decimal:
        """Spent + reserved as a percent of the amount (may pass 100: excess is shown, not hidden)."""
        if self.budget.amount_nano <= 0:
            return Decimal(100) if self.used_nano > 0 else Decimal(0)
        return (Decimal(self.used_nano) * 100 / Decimal(self.budget.amount_nano)).quantize(Decimal("0.01"))

    @property
    def percent_reserved(self) -> Decimal:
        return self.percent_used - self.percent_spent

    @property
    def percent_spent(self) -> Decimal:
        if self.budget.amount_nano <= 0:
            return Decimal(100) if self.spent_nano > 0 else Decimal(0)
        return (Decimal(self.spent_nano) * 100 / Decimal(self.budget.amount_nano)).quantize(Decimal("0.01"))


def statuses(*, budgets: Sequence[Budget], now: datetime) -> list[BudgetStatus]:
    """Each budget's window for the period containing `now`, read without locks and without
    creating windows (a budget with no window yet shows the period's recorded spend, which is
    what its first window will start with)."""
    bounds = {b.id: period_bounds(period=b.period, tz=b.timezone, now=now) for b in budgets}
    windows = {
        (w.budget_id, w.budget_version, w.period_start): w
        for w in Window.objects.filter(
            budget_id__in=[b.id for b in budgets], period_start__in={s for s, _ in bounds.values()}
        )
    }
    recorded = _recorded_spends(
        [b for b in budgets if (b.id, b.version, bounds[b.id][0]) not in windows], bounds=bounds
    )
    out = []
    for b in budgets:
        start, end = bounds[b.id]
        w = windows.get((b.id, b.version, start))
        spent, reserved = (w.spent_nano, w.reserved_nano) if w else (recorded[b.id], 0)
        out.append(BudgetStatus(budget=b, period_start=start, period_end=end, spent_nano=spent, reserved_nano=reserved))
    return out


def current_status(*, budget: Budget, now: datetime) -> BudgetStatus:
    return statuses(budgets=[budget], now=now)[0]


def _recorded_spends(
    budgets: Sequence[Budget], *, bounds: dict[int, tuple[datetime, datetime | None]]
) -> dict[int, int]:
    """Each windowless budget's recorded spend in its period: one grouped query per organization,
    subject column and period, however many budgets share them (a page of a thousand end-customer
    caps is one query, not a thousand)."""
    groups: dict[tuple[int, str | None, datetime, datetime | None], list[Budget]] = defaultdict(list)
    for b in budgets:
        column = next(iter(subject_filter(b)), None)
        groups[(b.organization_id, column, *bounds[b.id])].append(b)
    spends: dict[int, int] = {}
    for (organization_id, column, start, end), members in groups.items():
        qs = UsageRecord.objects.filter(organization_id=organization_id, admitted_at__gte=start)
        if end is not None:
            qs = qs.filter(admitted_at__lt=end)
        if column is None:
            total = qs.aggregate(total=Sum("cost_nano"))["total"] or 0
            spends.update((b.id, total) for b in members)
            continue
        by_subject = dict(
            qs.filter(**{f"{column}__in": {getattr(b, column) for b in members}})
            .values(column)
            .annotate(total=Sum("cost_nano"))
            .values_list(column, "total")
        )
        spends.update((b.id, by_subject.get(getattr(b, column)) or 0) for b in members)
    return spends


def live_reservations(*, organization_id: int):
    return (
        Reservation.objects.filter(organization_id=organization_id)
        .select_related("project", "api_key", "end_customer")
        .order_by("-created_at")
    )
