"""capcheck's verdict: the four properties (docs/architecture.md) decided from one organization's rows.

The client's view is used only to know what each request was told (served, refused, failed);
every property is decided by rows in the database.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from django.utils import timezone

from capcheck.plan import Sent
from ledger.models import Budget, Hold, Reservation, UsageRecord, Window
from ledger.periods import period_bounds
from tenants.models import Organization

# Refusals that happen before the provider call and are not a ceiling: no healthy connection
# left (health ejection after injected failures) and the database being unreachable. The second
# is a problem of the run unless the database really was away (`unavailable_ok`): with it up, a
# request with room must be admitted, whatever edits race it.
REFUSED_503 = {"connection_unavailable", "budget_unavailable"}
UNAVAILABLE = "budget_unavailable"


@dataclass
class CeilingReport:
    label: str
    window_id: int
    amount_nano: int
    spent_nano: int  # the window's counter
    booked_nano: int  # the usage records charged to it (the book of record)
    excess_nano: int  # billed above reserved worst cases, on those records
    reserved_nano: int
    peak_nano: int | None  # highest spent + reserved the sampler saw (None: not sampled)
    # Where the window started (spent + reserved carried in when created mid-period): above the
    # amount only when requests were admitted while no cap, or a looser one, stood (a cap deleted
    # and created again, say). From there it admits nothing until it is back under its amount.
    start_nano: int = 0

    @property
    def limit_nano(self) -> int:
        return max(self.amount_nano, self.start_nano) + self.excess_nano

    @property
    def ok(self) -> bool:
        return max(self.spent_nano, self.booked_nano, self.peak_nano or 0) <= self.limit_nano


@dataclass
class RunReport:
    scenario: str
    concurrency: int
    organization: str
    worst_nano: int
    actual_nano: int
    ceilings: list[CeilingReport]
    sent: int
    served: int
    refused: dict[str, int]
    failed: int
    undelivered: int
    records: dict[str, int]  # by status
    served_with_row: int
    reservations_left: int
    holds_left: int
    unapplied_left: int
    excess_nano: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    settle_s: float | None  # None: did not settle in time
    properties: dict[int, bool]
    problems: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)  # only when kept
    inconclusive: str = ""  # why the run proves nothing (e.g. no request got a response)

    @property
    def ok(self) -> bool:
        return all(self.properties.values()) and not self.inconclusive

    def as_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "ceilings"}
        data["ceilings"] = [{**c.__dict__, "ok": c.ok} for c in self.ceilings]
        data["properties"] = {str(k): v for k, v in self.properties.items()}
        data["ok"] = self.ok
        return data


def _truth_problems(organization_id: int, records: list[UsageRecord]) -> list[str]:
    """P1 read from the book of record, not the counters: for each organization cap, every usage
    record admitted in its current period (whatever window it was charged to) fits the cap plus
    the excess billed on those records. Counters that miss in-flight spend after an edit cannot
    hide from this."""
    out = []
    now = timezone.now()
    for b in Budget.objects.filter(
        organization_id=organization_id, scope=Budget.Scope.ORGANIZATION, mode=Budget.Mode.BLOCK
    ):
        start, end = period_bounds(period=b.period, tz=b.timezone, now=now)
        inside = [r for r in records if r.admitted_at >= start and (end is None or r.admitted_at < end)]
        booked, excess = sum(r.cost_nano for r in inside), sum(r.excess_nano for r in inside)
        # A cap created (or switched on) mid-period starts where its window did: the period's
        # spend and the requests in flight that were admitted before it stood.
        window = Window.objects.filter(budget=b, budget_version=b.version, period_start=start).first()
        began = window.seed_spent_nano + window.seed_reserved_nano if window is not None else 0
        if booked > max(b.amount_nano, began) + excess:
            out.append(
                f"P1: organization cap: the period's records add to {booked} nano-USD, over the cap "
                f"{b.amount_nano} (its window started at {began}) + excess {excess}"
            )
    return out


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _ceilings(organization_id: int, records: list[UsageRecord], peaks: dict[int, int] | None) -> list[CeilingReport]:
    out = []
    windows = (
        Window.objects.select_related("budget")
        .filter(budget__organization_id=organization_id, budget__mode=Budget.Mode.BLOCK, blocking=True)
        .order_by("budget_id", "period_start")
    )
    for w in windows:
        charged = [r for r in records if w.id in (r.window_ids or [])]
        b = w.budget
        out.append(
            CeilingReport(
                label=b.scope if b.period == Budget.Period.MONTH else f"{b.scope} ({b.period})",
                window_id=w.id,
                amount_nano=b.amount_nano,
                spent_nano=w.spent_nano,
                booked_nano=sum(r.cost_nano for r in charged),
                excess_nano=sum(r.excess_nano for r in charged),
                reserved_nano=w.reserved_nano,
                peak_nano=None if peaks is None else peaks.get(w.id, 0),
                start_nano=w.seed_spent_nano + w.seed_reserved_nano,
            )
        )
    return out


def check_organization(
    *,
    organization_id: int,
    sent: list[Sent],
    peaks: dict[int, int] | None = None,
    settle_s: float | None = 0.0,
    scenario: str = "",
    worst_nano: int = 0,
    actual_nano: int = 0,
    unavailable_ok: bool = True,
) -> RunReport:
    """Decide the four properties for one organization from its rows.

    1. Every blocking window: its counter, the usage records charged to it, and the highest
       spent + reserved sampled during the run are <= its amount + the excess billed on it.
    2. Every request the client saw is served with a row, refused before the provider call
       (402 naming a ceiling, or 503 before admission) with no row and no reservation, or
       failed upstream with its own row; rows no response names are at most the requests that
       got no response.
    3. No request answered 200 is without a usage row.
    4. No reservation, hold, held amount or unapplied record is left.
    """
    org = Organization.objects.get(pk=organization_id)
    records = list(UsageRecord.objects.filter(organization_id=organization_id))
    by_id = {r.request_id: r for r in records}
    live = set(Reservation.objects.filter(organization_id=organization_id).values_list("request_id", flat=True))
    ceilings = _ceilings(organization_id, records, peaks)
    ceiling_codes = {
        b.error_code for b in Budget.objects.filter(organization_id=organization_id, mode=Budget.Mode.BLOCK)
    }
    problems: list[str] = []
    served = failed = undelivered = served_with_row = 0
    refused: Counter[str] = Counter()
    seen: set[str] = set()
    for s in sent:
        rec = by_id.get(s.request_id) if s.request_id else None
        seen.add(s.request_id)
        what = f"request {s.index} ({s.mode}, {s.request_id or 'no id'})"
        if s.status == 200:
            served += 1
            if rec is None:
                problems.append(f"P3: {what} was served without a usage row")
            elif rec.status not in (UsageRecord.Status.SERVED, UsageRecord.Status.ESTIMATED):
                problems.append(f"P2: {what} was served but its row says {rec.status}")
            else:
                served_with_row += 1
        elif s.status in (402, 503):
            refused[s.code or str(s.status)] += 1
            if s.status == 402 and s.code not in ceiling_codes:
                problems.append(f"P2: {what} refused with 402 '{s.code}', which names no ceiling of this run")
            if s.status == 503 and (s.code not in REFUSED_503 or (s.code == UNAVAILABLE and not unavailable_ok)):
                problems.append(f"P2: {what} got 503 '{s.code}'")
            if rec is not None or s.request_id in live:
                problems.append(f"P2: {what} was refused but has a usage row or reservation")
        elif s.status in (500, 502, 504):
            # 500: the provider's own error relayed (its body, from the last target tried); a
            # capgate bug after admission would leave an estimated row, not a failed one.
            failed += 1
            if rec is None:
                problems.append(f"P2: {what} failed upstream ({s.status} {s.code}) without its own usage row")
            elif s.status in (500, 502) and rec.status != UsageRecord.Status.FAILED_UPSTREAM:
                problems.append(f"P2: {what} failed upstream but its row says {rec.status}")
        elif s.status == 0:
            undelivered += 1
        else:
            problems.append(f"P2: {what} got an unexpected {s.status} '{s.code}'")
    # A lapsed headroom slice's row (`slice-...`, estimated) is a process's charge, not a request's.
    unnamed = [r for r in records if r.request_id not in seen and not r.request_id.startswith("slice-")]
    if len(unnamed) > undelivered:
        problems.append(
            f"P2: {len(unnamed)} usage rows belong to no request the client sent (only {undelivered} got no response)"
        )
    problems += _truth_problems(organization_id, records)
    for c in ceilings:
        if not c.ok:
            problems.append(
                f"P1: {c.label}: recorded {c.booked_nano}, counter {c.spent_nano}, peak held "
                f"{c.peak_nano} nano-USD over the cap {c.amount_nano} (started at {c.start_nano}) + excess "
                f"{c.excess_nano}"
            )
    holds_left = Hold.objects.filter(reservation__organization_id=organization_id).count()
    unapplied = sum(1 for r in records if not r.applied)
    reserved_left = sum(c.reserved_nano for c in ceilings)
    if live or holds_left or unapplied or reserved_left or settle_s is None:
        problems.append(
            f"P4: left behind: {len(live)} reservations, {holds_left} holds, {unapplied} unapplied "
            f"records, {reserved_left} nano-USD still reserved"
        )
    latencies = [s.latency_s for s in sent if s.status]
    inconclusive = ""
    if sent and not latencies:
        errors = Counter(s.error.split(":")[0] for s in sent)
        inconclusive = (
            f"no request got a response ({', '.join(f'{k} {v}' for k, v in errors.items())}): is the URL right?"
        )
    # What the gateway actually reserved (the planned worst case if nothing was admitted).
    worst_nano = max((r.reserved_nano for r in records), default=worst_nano)
    return RunReport(
        scenario=scenario,
        concurrency=len(sent),
        organization=org.slug,
        worst_nano=worst_nano,
        actual_nano=actual_nano,
        ceilings=ceilings,
        sent=len(sent),
        served=served,
        refused=dict(refused),
        failed=failed,
        undelivered=undelivered,
        records=dict(Counter(r.status for r in records)),
        served_with_row=served_with_row,
        reservations_left=len(live),
        holds_left=holds_left,
        unapplied_left=unapplied,
        excess_nano=sum(r.excess_nano for r in records),
        latency_p50_s=_percentile(latencies, 50),
        latency_p95_s=_percentile(latencies, 95),
        settle_s=settle_s,
        properties={n: not any(p.startswith(f"P{n}:") for p in problems) for n in (1, 2, 3, 4)},
        problems=problems,
        inconclusive=inconclusive,
    )
