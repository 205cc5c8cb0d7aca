"""capcheck: the four-property method (DESIGN §1) run against a live capgate.

For each scenario at each concurrency, `run_capcheck`:

1. creates a fresh organization with its own priced catalog model, an `echo` connection whose
   responses cost a known amount, its keys and the scenario's blocking budgets;
2. sends N requests at once over N connections (httpx, one event loop) while a sampler thread
   reads the ceilings' counters and keeps the highest `spent + reserved` it saw;
3. waits for the outbox to drain (no unapplied record, no reservation; bounded);
4. reads the database and decides the four properties (`check_organization`).

The client's view is used only to know what each request was told (served, refused, failed);
every property is decided by rows in the database. Nothing is deleted: the run's rows are the
record of the proof. Unless `keep`, the run's keys are revoked and its connection disabled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import httpx
from django.db import connection
from django.utils import timezone

from budgets.models import Budget, Hold, Reservation, Window
from budgets.periods import period_bounds
from catalog.models import Connection, Model, Provider, Route, RouteTarget
from config.errors import CapgateError
from gateway import capcheck_billing
from gateway.estimate import shape_chat
from tenants.models import ApiKey, Organization, Project
from tenants.services import Actor
from usage.models import UsageRecord

SCENARIOS = ("basic", "stream", "multi", "failures", "admin-actions", *capcheck_billing.SCENARIOS)
CHAT = "/v1/chat/completions"
# The run's catalog model is priced here so worst and actual costs are exact and independent
# of the shared catalog: nano-USD per token at $15 / $75 per 1M tokens (no cache prices, so the
# most expensive input rate is the plain one).
INPUT_USD, OUTPUT_USD = Decimal(15), Decimal(75)
INPUT_NANO, OUTPUT_NANO = 15_000, 75_000
# Refusals that happen before the provider call and are not a ceiling: no healthy connection
# left (health ejection after injected failures) and the database being unreachable.
REFUSED_503 = {"connection_unavailable", "budget_unavailable"}


class CapcheckError(CapgateError):
    def __init__(self, message: str):
        super().__init__(message, code="capcheck_error", status=400)


@dataclass(frozen=True)
class Plan:
    url: str
    scenarios: tuple[str, ...] = SCENARIOS
    concurrency: tuple[int, ...] = (50, 200, 500)
    cap_nano: int = 1_000_000_000
    key_cap_nano: int = 300_000_000  # multi: key A, per day
    project_cap_nano: int = 500_000_000  # multi: keys A and B's project
    worst_nano: int = 37_000_000
    actual_nano: int = 12_000_000
    delay_ms: int = 100  # echo: time before the response (or the first stream chunk)
    chunk_delay_ms: int = 50
    chunks: int = 4
    request_timeout: float = 120.0
    settle_timeout: float = 60.0
    sample_interval: float = 0.01
    keep: bool = False


@dataclass(frozen=True)
class Tokens:
    """Request shape that makes the gateway's worst case and the echo's bill what the plan asks."""

    max_tokens: int  # sent by the client: the output half of the worst case
    input_bound: int  # the gateway's byte bound on input tokens, reached by padding the prompt
    prompt: int  # what echo reports
    completion: int

    @classmethod
    def for_plan(cls, plan: Plan) -> Tokens:
        if not 0 < plan.actual_nano <= plan.worst_nano:
            raise CapcheckError("Need 0 < actual <= worst per request.")
        max_tokens = max(1, plan.worst_nano * 4 // 5 // OUTPUT_NANO)
        input_bound = math.ceil((plan.worst_nano - max_tokens * OUTPUT_NANO) / INPUT_NANO)
        completion = min(max_tokens, max(1, plan.actual_nano // 2 // OUTPUT_NANO))
        prompt = max(0, round((plan.actual_nano - completion * OUTPUT_NANO) / INPUT_NANO))
        return cls(max_tokens=max_tokens, input_bound=input_bound, prompt=prompt, completion=completion)

    @property
    def worst_nano(self) -> int:
        return self.input_bound * INPUT_NANO + self.max_tokens * OUTPUT_NANO

    @property
    def actual_nano(self) -> int:
        return self.prompt * INPUT_NANO + self.completion * OUTPUT_NANO

    def body(self, model: str, *, stream: bool) -> dict:
        """A chat body padded so the gateway's input bound is exactly `input_bound`."""

        def make(pad: int) -> dict:
            body = {"model": model, "messages": [{"role": "user", "content": "x" * pad}], "max_tokens": self.max_tokens}
            return {**body, "stream": True} if stream else body

        base = shape_chat(make(0)).text_tokens
        if base > self.input_bound:
            raise CapcheckError(f"The worst case cannot cover the request body's own {base}-token input bound: "
                                "raise --worst-usd.")
        body = make(self.input_bound - base)
        assert shape_chat(body).text_tokens == self.input_bound
        return body


@dataclass
class Sent:
    """One request and what its client was told (status 0: no response arrived)."""

    index: int
    key: str
    mode: str  # plain | stream | disconnect (leaves after the first chunk) | fault
    status: int = 0
    code: str = ""
    request_id: str = ""
    latency_s: float = 0.0
    error: str = ""


@dataclass
class Setup:
    scenario: str
    concurrency: int
    organization: Organization
    route: str
    keys: dict[str, str]  # label -> raw key
    connection_id: int
    tokens: Tokens
    # Billing scenarios (gateway/capcheck_billing.py): endpoint, extra body fields and headers.
    path: str = CHAT
    body_extra: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    served_model: str = ""


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

    @property
    def limit_nano(self) -> int:
        return self.amount_nano + self.excess_nano

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


# --- 1. setup --------------------------------------------------------------------------------


def create_run(*, plan: Plan, scenario: str, concurrency: int) -> Setup:
    """A fresh organization for one run: its own priced model, echo connection, keys, budgets."""
    if scenario not in SCENARIOS:
        raise CapcheckError(f"Unknown scenario '{scenario}' (choose from {', '.join(SCENARIOS)}).")
    tokens = Tokens.for_plan(plan)
    slug = f"capcheck-{scenario}-{concurrency}-{timezone.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
    provider, _ = Provider.objects.get_or_create(slug="capcheck", defaults={"name": "capcheck"})
    model = Model.objects.create(provider=provider, name=slug, input_usd_per_mtok=INPUT_USD,
                                 output_usd_per_mtok=OUTPUT_USD)
    org = Organization.objects.create(slug=slug, name=f"capcheck {scenario} x{concurrency}")
    main = Project.objects.create(organization=org, name="Main", slug="main")
    echo = Connection.objects.create(organization=org, name="echo", kind=Connection.Kind.ECHO, options={
        "delay_ms": plan.delay_ms, "chunk_delay_ms": plan.chunk_delay_ms, "chunks": plan.chunks,
        "prompt_tokens": tokens.prompt, "completion_tokens": tokens.completion, "text": "capcheck ",
        "allow_fault_headers": scenario == "failures",
    })
    route = Route.objects.create(organization=org, name="capcheck-echo")
    RouteTarget.objects.create(route=route, connection=echo, model=model, position=0)

    def key(label: str, project: Project) -> tuple[str, ApiKey]:
        raw, prefix, digest = ApiKey.generate()
        return raw, ApiKey.objects.create(organization=org, project=project, name=f"capcheck {label}",
                                          prefix=prefix, key_hash=digest)

    # No threshold alerts: a capcheck run is not news. (A first refusal still makes an event.)
    def budget(name: str, scope: str, amount: int, period: str = Budget.Period.MONTH, **subject) -> None:
        Budget.objects.create(organization=org, name=name, scope=scope, period=period, mode=Budget.Mode.BLOCK,
                              amount_nano=amount, thresholds=[], **subject)

    raw_a, key_a = key("A", main)
    keys = {"A": raw_a}
    budget("capcheck organization cap", Budget.Scope.ORGANIZATION, plan.cap_nano)
    if scenario == "multi":
        other = Project.objects.create(organization=org, name="Other", slug="other")
        keys["B"] = key("B", main)[0]
        keys["C"] = key("C", other)[0]
        budget("capcheck project cap", Budget.Scope.PROJECT, plan.project_cap_nano, project=main)
        budget("capcheck key A daily cap", Budget.Scope.KEY, plan.key_cap_nano, Budget.Period.DAY, api_key=key_a)
    overrides = capcheck_billing.adjust(scenario=scenario, plan=plan, tokens=tokens, model=model, echo=echo,
                                        route_id=route.id)
    return Setup(scenario=scenario, concurrency=concurrency, organization=org, route=route.name, keys=keys,
                 connection_id=echo.id, tokens=tokens, served_model=model.name, **overrides)


# --- admin-actions: the organization cap edited mid-burst -------------------------------------

CUSTOMER = "capcheck-customer"  # half the admin-actions requests name it; it is deleted mid-burst
ADMIN = Actor(label="capcheck")


class AdminActions(threading.Thread):
    """While the burst is in flight: lower and raise the organization cap, change its timezone
    and period (and back), delete and recreate it, and delete the end customer half the
    requests are charged to — through the same services the dashboard and API use."""

    def __init__(self, organization_id: int, amount_nano: int, timeout: float = 10.0):
        super().__init__(name="capcheck-admin", daemon=True)
        self.organization_id = organization_id
        self.amount_nano = amount_nano
        self.timeout = timeout
        self.done: list[str] = []
        self.error = ""

    def run(self) -> None:
        from budgets.services import create_budget, delete_budget, update_budget
        from tenants.models import EndCustomer
        from tenants.services import delete_end_customer

        def delete_customers() -> None:
            for c in EndCustomer.objects.filter(project__organization_id=self.organization_id):
                delete_end_customer(customer=c, actor=ADMIN)

        def cap() -> Budget:
            return Budget.objects.get(organization_id=self.organization_id, scope=Budget.Scope.ORGANIZATION)

        try:
            deadline = time.monotonic() + self.timeout
            while not Reservation.objects.filter(organization_id=self.organization_id).exists():
                if time.monotonic() > deadline:
                    self.error = "no request was in flight to act during"
                    return
                time.sleep(0.005)
            steps: list[tuple[str, Callable[[], object]]] = [
                ("lower", lambda: update_budget(budget=cap(), actor=ADMIN, amount_nano=self.amount_nano // 2)),
                ("raise", lambda: update_budget(budget=cap(), actor=ADMIN, amount_nano=self.amount_nano)),
                ("timezone", lambda: update_budget(budget=cap(), actor=ADMIN, timezone="Pacific/Kiritimati")),
                ("timezone back", lambda: update_budget(budget=cap(), actor=ADMIN, timezone="UTC")),
                ("period", lambda: update_budget(budget=cap(), actor=ADMIN, period=Budget.Period.WEEK)),
                ("period back", lambda: update_budget(budget=cap(), actor=ADMIN, period=Budget.Period.MONTH)),
                ("delete", lambda: delete_budget(budget=cap(), actor=ADMIN)),
                ("recreate", lambda: create_budget(
                    organization=Organization.objects.get(pk=self.organization_id), actor=ADMIN,
                    scope=Budget.Scope.ORGANIZATION, amount_nano=self.amount_nano, name="capcheck organization cap",
                    period=Budget.Period.MONTH, mode=Budget.Mode.BLOCK, thresholds=[])),
                ("delete customer", lambda: delete_customers()),
            ]
            for name, step in steps:
                step()
                self.done.append(name)
                time.sleep(0.01)
        except Exception as exc:  # reported as a problem of the run, never silently
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            connection.close()


def _truth_problems(organization_id: int, records: list[UsageRecord]) -> list[str]:
    """P1 read from the book of record, not the counters: for each organization cap, every usage
    record admitted in its current period (whatever window it was charged to) fits the cap plus
    the excess billed on those records. Counters that miss in-flight spend after an edit cannot
    hide from this."""
    out = []
    now = timezone.now()
    for b in Budget.objects.filter(organization_id=organization_id, scope=Budget.Scope.ORGANIZATION,
                                   mode=Budget.Mode.BLOCK):
        start, end = period_bounds(period=b.period, tz=b.timezone, now=now)
        inside = [r for r in records if r.admitted_at >= start and (end is None or r.admitted_at < end)]
        booked, excess = sum(r.cost_nano for r in inside), sum(r.excess_nano for r in inside)
        if booked > b.amount_nano + excess:
            out.append(f"P1: organization cap: the period's records add to {booked} nano-USD, over the cap "
                       f"{b.amount_nano} + excess {excess}")
    return out


def finish_run(setup: Setup, *, keep: bool) -> None:
    """Unless kept for poking at, the run's keys stop working; its rows stay as the record."""
    if keep:
        return
    ApiKey.objects.filter(organization=setup.organization, revoked_at__isnull=True).update(revoked_at=timezone.now())
    Connection.objects.filter(pk=setup.connection_id).update(enabled=False)


# --- 2. load ---------------------------------------------------------------------------------


def plan_requests(setup: Setup) -> list[Sent]:
    labels = sorted(setup.keys)
    out = []
    for i in range(setup.concurrency):
        mode = "plain"
        if setup.scenario == "admin-actions" and i % 2:
            mode = "customer"
        elif setup.scenario == "stream":
            mode = "disconnect" if i % 5 == 4 else "stream"
        elif setup.scenario == "failures" and i % 3 == 2:
            mode = "fault"
        out.append(Sent(index=i, key=labels[i % len(labels)], mode=mode))
    return out


def fire(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    """Send every request at once, each on its own connection; fills in what each was told."""
    quiet = logging.getLogger("httpx")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # not a line per request
    try:
        asyncio.run(_fire(setup, plan, sent))
    finally:
        quiet.setLevel(level)


async def _fire(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    limits = httpx.Limits(max_connections=len(sent), max_keepalive_connections=0)
    bodies = {s: capcheck_billing.body(setup, stream=s) for s in (False, True)}
    start = asyncio.Event()
    async with httpx.AsyncClient(base_url=plan.url, limits=limits, timeout=plan.request_timeout) as client:
        tasks = [asyncio.create_task(_one(client, setup, s, bodies[s.mode in ("stream", "disconnect")], start))
                 for s in sent]
        await asyncio.sleep(0)  # every task waits at the start line
        start.set()
        await asyncio.gather(*tasks)


async def _one(client: httpx.AsyncClient, setup: Setup, s: Sent, body: dict, start: asyncio.Event) -> None:
    headers = {"authorization": f"Bearer {setup.keys[s.key]}", **setup.headers}
    if s.mode == "fault":
        headers["x-capgate-echo-fail"] = "500"
    elif s.mode == "customer":
        headers["x-capgate-customer"] = CUSTOMER
    await start.wait()
    began = time.perf_counter()
    try:
        async with client.stream("POST", setup.path, json=body, headers=headers) as resp:
            s.status = resp.status_code
            s.request_id = resp.headers.get("x-capgate-request-id", "")
            if resp.status_code != 200:
                s.code = _error_code(await resp.aread())
            elif s.mode == "disconnect":
                async for _ in resp.aiter_raw():
                    break  # leaving the block closes the connection mid-stream
            else:
                data = await resp.aread()
                if s.mode == "stream" and b"[DONE]" not in data:
                    s.error = "stream ended without [DONE]"
    except httpx.HTTPError as exc:
        s.error = f"{type(exc).__name__}: {exc}"[:300]
    s.latency_s = time.perf_counter() - began


def _error_code(raw: bytes) -> str:
    try:
        return str((json.loads(raw).get("error") or {}).get("code") or "")
    except (ValueError, AttributeError):
        return ""


class Sampler(threading.Thread):
    """Reads the organization's blocking windows every `interval`, keeping each one's highest
    committed amount (spent + reserved): admission promises it never passes the cap."""

    def __init__(self, organization_id: int, interval: float):
        super().__init__(name="capcheck-sampler", daemon=True)
        self.organization_id = organization_id
        self.interval = interval
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        windows = Window.objects.filter(budget__organization_id=self.organization_id, budget__mode=Budget.Mode.BLOCK)
        try:
            while not self._halt.is_set():
                try:
                    for wid, spent, reserved in windows.values_list("id", "spent_nano", "reserved_nano"):
                        self.peaks[wid] = max(self.peaks.get(wid, 0), spent + reserved)
                    self.samples += 1
                except Exception:  # a sampler must not end the run; the count is reported
                    self.errors += 1
                    connection.close()
                self._halt.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> dict[int, int]:
        self._halt.set()
        self.join(timeout=30)
        return self.peaks


# --- 3. settle -------------------------------------------------------------------------------


def wait_settled(*, organization_id: int, timeout: float) -> float | None:
    """Seconds until the organization's outbox is empty and no reservation is left; None if
    that did not happen within `timeout`."""
    began = time.monotonic()
    while True:
        busy = (UsageRecord.objects.filter(organization_id=organization_id, applied=False).exists()
                or Reservation.objects.filter(organization_id=organization_id).exists())
        elapsed = time.monotonic() - began
        if not busy:
            return elapsed
        if elapsed > timeout:
            return None
        time.sleep(0.1)


# --- 4. check --------------------------------------------------------------------------------


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _ceilings(organization_id: int, records: list[UsageRecord], peaks: dict[int, int] | None) -> list[CeilingReport]:
    out = []
    windows = Window.objects.select_related("budget").filter(
        budget__organization_id=organization_id, budget__mode=Budget.Mode.BLOCK).order_by("budget_id", "period_start")
    for w in windows:
        charged = [r for r in records if w.id in (r.window_ids or [])]
        b = w.budget
        out.append(CeilingReport(
            label=b.scope if b.period == Budget.Period.MONTH else f"{b.scope} ({b.period})",
            window_id=w.id, amount_nano=b.amount_nano, spent_nano=w.spent_nano,
            booked_nano=sum(r.cost_nano for r in charged), excess_nano=sum(r.excess_nano for r in charged),
            reserved_nano=w.reserved_nano, peak_nano=None if peaks is None else peaks.get(w.id, 0),
        ))
    return out


def check_organization(*, organization_id: int, sent: list[Sent], peaks: dict[int, int] | None = None,
                       settle_s: float | None = 0.0, scenario: str = "", worst_nano: int = 0,
                       actual_nano: int = 0) -> RunReport:
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
    ceiling_codes = {b.error_code for b in Budget.objects.filter(organization_id=organization_id, mode=Budget.Mode.BLOCK)}
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
            if s.status == 503 and s.code not in REFUSED_503:
                problems.append(f"P2: {what} got 503 '{s.code}'")
            if rec is not None or s.request_id in live:
                problems.append(f"P2: {what} was refused but has a usage row or reservation")
        elif s.status in (502, 504):
            failed += 1
            if rec is None:
                problems.append(f"P2: {what} failed upstream ({s.status} {s.code}) without its own usage row")
            elif s.status == 502 and rec.status != UsageRecord.Status.FAILED_UPSTREAM:
                problems.append(f"P2: {what} failed upstream but its row says {rec.status}")
        elif s.status == 0:
            undelivered += 1
        else:
            problems.append(f"P2: {what} got an unexpected {s.status} '{s.code}'")
    unnamed = [r for r in records if r.request_id not in seen]
    if len(unnamed) > undelivered:
        problems.append(f"P2: {len(unnamed)} usage rows belong to no request the client sent "
                        f"(only {undelivered} got no response)")
    problems += _truth_problems(organization_id, records)
    for c in ceilings:
        if not c.ok:
            problems.append(f"P1: {c.label}: recorded {c.booked_nano}, counter {c.spent_nano}, peak held "
                            f"{c.peak_nano} nano-USD over the cap {c.amount_nano} + excess {c.excess_nano}")
    holds_left = Hold.objects.filter(reservation__organization_id=organization_id).count()
    unapplied = sum(1 for r in records if not r.applied)
    reserved_left = sum(c.reserved_nano for c in ceilings)
    if live or holds_left or unapplied or reserved_left or settle_s is None:
        problems.append(f"P4: left behind: {len(live)} reservations, {holds_left} holds, {unapplied} unapplied "
                        f"records, {reserved_left} nano-USD still reserved")
    latencies = [s.latency_s for s in sent if s.status]
    inconclusive = ""
    if sent and not latencies:
        errors = Counter(s.error.split(":")[0] for s in sent)
        inconclusive = f"no request got a response ({', '.join(f'{k} {v}' for k, v in errors.items())}): is the URL right?"
    # What the gateway actually reserved (the planned worst case if nothing was admitted).
    worst_nano = max((r.reserved_nano for r in records), default=worst_nano)
    return RunReport(
        scenario=scenario, concurrency=len(sent), organization=org.slug, worst_nano=worst_nano, actual_nano=actual_nano,
        ceilings=ceilings, sent=len(sent), served=served, refused=dict(refused), failed=failed, undelivered=undelivered,
        records=dict(Counter(r.status for r in records)), served_with_row=served_with_row,
        reservations_left=len(live), holds_left=holds_left, unapplied_left=unapplied,
        excess_nano=sum(r.excess_nano for r in records), latency_p50_s=_percentile(latencies, 50),
        latency_p95_s=_percentile(latencies, 95), settle_s=settle_s,
        properties={n: not any(p.startswith(f"P{n}:") for p in problems) for n in (1, 2, 3, 4)}, problems=problems,
        inconclusive=inconclusive,
    )


# --- the whole run ---------------------------------------------------------------------------


def run_one(*, plan: Plan, scenario: str, concurrency: int) -> RunReport:
    setup = create_run(plan=plan, scenario=scenario, concurrency=concurrency)
    sent = plan_requests(setup)
    sampler = Sampler(setup.organization.id, plan.sample_interval)
    sampler.start()
    admin = AdminActions(setup.organization.id, plan.cap_nano) if scenario == "admin-actions" else None
    if admin is not None:
        admin.start()
    try:
        fire(setup, plan, sent)
        if admin is not None:
            admin.join(timeout=60)
        settle_s = wait_settled(organization_id=setup.organization.id, timeout=plan.settle_timeout)
    finally:
        peaks = sampler.stop()
    report = check_organization(organization_id=setup.organization.id, sent=sent, peaks=peaks, settle_s=settle_s,
                                scenario=scenario, worst_nano=setup.tokens.worst_nano,
                                actual_nano=setup.tokens.actual_nano)
    books = capcheck_billing.problems(setup, list(UsageRecord.objects.filter(organization=setup.organization)),
                                      setup.served_model)
    if books:
        report.problems += books
        report.properties[1] = False
    if sampler.errors:
        report.problems.append(f"note: {sampler.errors} of {sampler.samples + sampler.errors} samples failed")
    if admin is not None:
        report.problems.append(f"note: admin actions done mid-burst: {', '.join(admin.done) or 'none'}")
        if admin.error:
            report.inconclusive = f"admin actions stopped: {admin.error}"
    finish_run(setup, keep=plan.keep)
    if plan.keep:
        report.keys = dict(setup.keys)
    return report


def run_capcheck(*, plan: Plan, progress: Callable[[RunReport], None] | None = None) -> list[RunReport]:
    """Every scenario at every concurrency, one fresh organization each."""
    for s in plan.scenarios:
        if s not in SCENARIOS:
            raise CapcheckError(f"Unknown scenario '{s}' (choose from {', '.join(SCENARIOS)}).")
    reports = []
    for scenario in plan.scenarios:
        for n in plan.concurrency:
            report = run_one(plan=plan, scenario=scenario, concurrency=n)
            reports.append(report)
            if progress is not None:
                progress(report)
    return reports
