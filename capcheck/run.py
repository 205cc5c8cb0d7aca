"""capcheck's runner: for each scenario at each concurrency, a fresh organization, the burst,
the drain, the verdict (capcheck/__init__.py describes the method)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.utils import timezone

from capcheck import kinds
from capcheck.check import RunReport, check_organization
from capcheck.load import Sampler, fire, wait_settled
from capcheck.plan import INPUT_USD, OUTPUT_USD, CapcheckError, Plan, Sent, Setup, Tokens
from capcheck.restart import DB_RESTART
from capcheck.scenario import Build, Scenario
from capcheck.scenarios import ALL, NAMES
from catalog.models import Connection, Model, Provider, Route, RouteTarget
from ledger.models import Budget, UsageRecord
from tenants.models import ApiKey, Organization, Project


def _scenario(name: str) -> Scenario:
    try:
        return ALL[name]
    except KeyError:
        raise CapcheckError(f"Unknown scenario '{name}' (choose from {', '.join(NAMES)}).") from None


def create_run(*, plan: Plan, scenario: str, concurrency: int) -> Setup:
    """A fresh organization for one run: its own priced model, echo connection, keys, budgets;
    then whatever its scenario adds."""
    shape = _scenario(scenario)
    tokens = Tokens.for_plan(plan)
    slug = f"capcheck-{scenario}-{concurrency}-{timezone.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
    provider, _ = Provider.objects.get_or_create(slug="capcheck", defaults={"name": "capcheck"})
    model = Model.objects.create(
        provider=provider, name=slug, input_usd_per_mtok=INPUT_USD, output_usd_per_mtok=OUTPUT_USD
    )
    org = Organization.objects.create(slug=slug, name=f"capcheck {scenario} x{concurrency}")
    main = Project.objects.create(organization=org, name="Main", slug="main")
    echo = kinds.connection(
        plan=plan,
        organization=org,
        tokens=tokens,
        echo_options={
            "delay_ms": plan.delay_ms,
            "chunk_delay_ms": plan.chunk_delay_ms,
            "chunks": plan.chunks,
            "prompt_tokens": tokens.prompt,
            "completion_tokens": tokens.completion,
            "text": "capcheck ",
            "allow_fault_headers": shape.fault_headers,
        },
    )
    route = Route.objects.create(organization=org, name=f"capcheck-{plan.kind}")
    RouteTarget.objects.create(route=route, connection=echo, model=model, position=0)
    build = Build(
        plan=plan,
        tokens=tokens,
        organization=org,
        concurrency=concurrency,
        project=main,
        model=model,
        echo=echo,
        route_id=route.id,
    )
    build.key("A", main)
    build.budget("capcheck organization cap", Budget.Scope.ORGANIZATION, plan.cap_nano)
    overrides = {**kinds.overrides(plan=plan, tokens=tokens), **shape.prepare(build)}
    return Setup(
        scenario=scenario,
        concurrency=concurrency,
        organization=org,
        route=route.name,
        keys=dict(build.keys),
        connection_id=echo.id,
        tokens=tokens,
        served_model=model.name,
        **overrides,
    )


def finish_run(setup: Setup, *, keep: bool) -> None:
    """Unless kept for poking at, the run's keys stop working; its rows stay as the record."""
    if keep:
        return
    ApiKey.objects.filter(organization=setup.organization, revoked_at__isnull=True).update(revoked_at=timezone.now())
    Connection.objects.filter(pk=setup.connection_id).update(enabled=False)


def plan_requests(setup: Setup) -> list[Sent]:
    labels = sorted(setup.keys)
    mode = _scenario(setup.scenario).mode
    return [Sent(index=i, key=labels[i % len(labels)], mode=mode(i)) for i in range(setup.concurrency)]


def run_one(*, plan: Plan, scenario: str, concurrency: int) -> RunReport:
    setup = create_run(plan=plan, scenario=scenario, concurrency=concurrency)
    shape = _scenario(scenario)
    sent = plan_requests(setup)
    sampler = Sampler(setup.organization.id, plan.sample_interval)
    sampler.start()
    during = shape.during(setup, plan) if shape.during is not None else None
    if during is not None:
        during.start()
    try:
        (shape.send or fire)(setup, plan, sent)
        if during is not None:
            during.join(timeout=60)
        settle_s = wait_settled(organization_id=setup.organization.id, timeout=plan.settle_timeout)
    finally:
        peaks = sampler.stop()
    report = check_organization(
        organization_id=setup.organization.id,
        sent=sent,
        peaks=peaks,
        settle_s=settle_s,
        scenario=scenario,
        worst_nano=setup.tokens.worst_nano,
        actual_nano=setup.tokens.actual_nano,
        unavailable_ok=shape.database_outage,
    )
    books = shape.books(setup, list(UsageRecord.objects.filter(organization=setup.organization)))
    if books:
        report.problems += books
        report.properties[1] = False
    told = shape.refusals(setup, sent)
    if told:
        report.problems += told
        report.properties[2] = False
    if sampler.errors:
        report.problems.append(f"note: {sampler.errors} of {sampler.samples + sampler.errors} samples failed")
    if during is not None:
        report.problems += during.notes()
        if during.error:
            report.inconclusive = f"{during.label} stopped: {during.error}"
    finish_run(setup, keep=plan.keep)
    if plan.keep:
        report.keys = dict(setup.keys)
    return report


def run_capcheck(*, plan: Plan, progress: Callable[[RunReport], None] | None = None) -> list[RunReport]:
    """Every scenario at every concurrency, one fresh organization each."""
    kinds.check_plan(plan)
    for s in plan.scenarios:
        _scenario(s)
        if s == DB_RESTART.name and not plan.restart_db_cluster:
            raise CapcheckError(
                "db-restart restarts PostgreSQL: name the cluster it may restart with --restart-db-cluster DIR."
            )
    reports = []
    for scenario in plan.scenarios:
        for n in plan.concurrency:
            report = run_one(plan=plan, scenario=scenario, concurrency=n)
            reports.append(report)
            if progress is not None:
                progress(report)
    return reports
