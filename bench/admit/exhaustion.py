"""The leases exhaustion run (bench/admit/leases.py has the processes).

The exhaustion run drives a cap worth --exhaust worst cases to exhaustion: every process admits
until it has been refused STOP_AFTER_REFUSALS times in a row (pausing REFUSED_PAUSE after each
refusal, so recalled leftovers can come back), each admission settled at --exhaust-cost times its
worst case. It reports the spend of everything admitted before the first refusal (whichever
process saw it; CLOCK_MONOTONIC is one clock for all processes) as a share of the cap, the final
recorded spend, and what is left reserved.
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field

from bench.admit.cell import check_cycle
from bench.admit.leases import Plan, fork
from bench.admit.tenant import Tenant, ensure_tenant, reset
from ledger.drain import drain_all
from ledger.models import Hold, Reservation, UsageRecord, Window

EXHAUST_SLUG = "bench-leases-exhaust"


@dataclass
class Exhaustion:
    slices_on: bool
    processes: int
    cap: int
    worst: int
    cost: int
    admitted: int = 0
    refused: int = 0
    before_first_refusal: int = 0  # admissions that returned before the first refusal
    first_refusal_s: float = float("nan")  # after the start
    elapsed: float = 0.0
    spent: int = 0
    reserved: int = 0
    slices_taken: int = 0
    from_slices: int = 0
    check: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def at_refusal_pct(self) -> float:
        return 100.0 * self.before_first_refusal * self.cost / self.cap

    @property
    def final_pct(self) -> float:
        return 100.0 * self.spent / self.cap


def run_exhaustion(args: argparse.Namespace, *, slices_on: bool) -> Exhaustion:
    """Drive a cap worth --exhaust worst cases to exhaustion with --leases-processes processes."""
    worst = args.worst_nano
    cap = args.exhaust * worst
    cost = int(worst * args.exhaust_cost)
    tenant = ensure_tenant(1, slug=EXHAUST_SLUG, amount_nano=cap)
    reset([tenant])
    plan = Plan(
        subject=tenant.subject,
        worst=worst,
        cost=cost,
        processes=args.leases_processes,
        seconds=float(args.exhaust_timeout),
        group=args.leases_group,
        slices_on=slices_on,
        exhaust=True,
        tag=uuid.uuid4().hex[:12],
    )
    out = Exhaustion(slices_on=slices_on, processes=plan.processes, cap=cap, worst=worst, cost=cost)
    results, _cpu = fork(plan)
    ok = [r for r in results if "fatal" not in r]
    out.errors = [r["fatal"] for r in results if "fatal" in r] + [e for r in ok for e in r["errors"]]
    out.admitted = sum(len(r["lat"]) + r["warm"] for r in ok)
    out.refused = sum(r["refused"] for r in ok)
    refusals = [r["first_refused"] for r in ok if r["first_refused"] is not None]
    if ok:
        start = min(r["start"] for r in ok)
        out.elapsed = max(r["end"] for r in ok) - start
        if refusals:
            first = min(refusals)
            out.first_refusal_s = first - start
            out.before_first_refusal = sum(1 for r in ok for t in r["stamps"] if t <= first)
        out.slices_taken = sum(r["stats"]["slices_taken"] for r in ok)
        out.from_slices = sum(r["stats"]["admitted_from_slices"] for r in ok)
    drain_all()
    window = Window.objects.get(id=tenant.window_ids[0])
    out.spent, out.reserved = window.spent_nano, window.reserved_nano
    check = check_cycle(tenant, out.admitted, cost)
    if out.spent > cap:
        check = ("FAIL " if check == "ok" else check + "; ") + f"overshoot: spent {out.spent:,} > cap {cap:,}"
    if not refusals:
        check = ("FAIL " if check == "ok" else check + "; ") + "never refused: the cap was not exhausted"
    if check != "ok":
        check += "; left: " + _leftovers(tenant)
    out.check = check
    reset([tenant])
    return out


def _leftovers(tenant: Tenant) -> str:
    """The reservations (and their holds) a failed check found, to tell what was left behind."""
    rows = []
    for r in Reservation.objects.filter(organization_id=tenant.org_id).order_by("created_at")[:5]:
        holds = list(Hold.objects.filter(reservation_id=r.id).values_list("amount_nano", flat=True))
        recorded = UsageRecord.objects.filter(request_id=r.request_id).exists()
        rows.append(
            f"{r.origin} {r.request_id[:24]} amount {r.amount_nano:,} holds {holds} recorded {recorded} "
            f"owner {r.owner_id} expires {r.expires_at:%H:%M:%S}"
        )
    return ", ".join(rows) or "none"
