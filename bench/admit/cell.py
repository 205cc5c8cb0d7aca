"""One cell of the admission benchmark (a runner at a client count): what it measured, the host
CPU around it, and the counter checks run after it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.db.models import Sum

from bench.admit.tenant import Tenant
from ledger.models import Hold, Reservation, UsageRecord, Window


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat (0, 0 where unavailable)."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def background_cpu(seconds: float = 0.4) -> float:
    """Host CPU busy % while this benchmark is idle: the noise from whatever else runs."""
    busy0, total0 = cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = cpu_ticks()
    return 100.0 * (busy1 - busy0) / (total1 - total0) if total1 > total0 else float("nan")


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


@dataclass
class Cell:
    runner: str
    ceilings: int
    clients: int
    mode: str = "admit"  # admit | cycle
    count: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds
    py_cpu: float = 0.0  # CPU seconds spent by the Python workers (threads: their own threads)
    host_cpu_pct: float = float("nan")
    bg_cpu_pct: float = float("nan")  # host CPU busy just before the cell: other people's load
    lock_stmt_ms: float = float("nan")  # mean duration of the statement that locks the windows
    held_ms: float = float("nan")  # mean time the lock stayed held after that statement returned
    # ... split into: Python until the UPDATE was sent, the UPDATE round trip, UPDATE return -> committed
    held_split: tuple[float, float, float] | None = None
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    check: str = ""
    note: str = ""

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed else 0.0

    @property
    def p50_ms(self) -> float:
        return pct(self.latencies, 0.50) * 1e3

    @property
    def p99_ms(self) -> float:
        return pct(self.latencies, 0.99) * 1e3


def check_reserved(tenant: Tenant, admitted: int, worst: int) -> str:
    """reserved == sum of live holds == admitted x worst on every ceiling; one reservation each."""
    problems = []
    for w in Window.objects.filter(id__in=tenant.window_ids).order_by("id"):
        held = Hold.objects.filter(window_id=w.id).aggregate(s=Sum("amount_nano"))["s"] or 0
        if not (w.reserved_nano == held == admitted * worst):
            problems.append(f"window {w.id}: reserved {w.reserved_nano}, holds {held}, expected {admitted * worst}")
    n = Reservation.objects.filter(organization_id=tenant.org_id).count()
    if n != admitted:
        problems.append(f"{n} reservations for {admitted} admissions")
    return "ok" if not problems else "FAIL " + "; ".join(problems)


def check_cycle(tenant: Tenant, admitted: int, cost: int) -> str:
    """After the drain: nothing reserved, spent == recorded cost, no reservation or hold left,
    one applied usage row per admission (the four properties, read from the database)."""
    problems = []
    for w in Window.objects.filter(id__in=tenant.window_ids).order_by("id"):
        if w.reserved_nano != 0 or w.spent_nano != admitted * cost:
            problems.append(
                f"window {w.id}: reserved {w.reserved_nano}, spent {w.spent_nano}, expected spent {admitted * cost}"
            )
    left = Reservation.objects.filter(organization_id=tenant.org_id).count()
    holds = Hold.objects.filter(window_id__in=tenant.window_ids).count()
    rows = UsageRecord.objects.filter(organization_id=tenant.org_id)
    n_rows, n_unapplied = rows.count(), rows.filter(applied=False).count()
    if left or holds:
        problems.append(f"{left} reservations / {holds} holds left")
    if n_rows != admitted or n_unapplied:
        problems.append(f"{n_rows} usage rows ({n_unapplied} unapplied) for {admitted} admissions")
    return "ok" if not problems else "FAIL " + "; ".join(problems)
