"""capcheck's billing scenarios: paid features and route aliases under a blocking cap.

- server-tools: /v1/messages with a web-search tool (max_uses 2). The echo provider bills every
  allowed search at the catalog's per-use price, on top of tokens.
- service-tier: chat with service_tier "priority" on a model whose priority tier costs twice
  its list price; echo reports the tier that served it.
- route-alias: a route whose name is not a model, failing over from a pricier model (its
  connection answers 500) to a cheaper one; each attempt is priced at the model called.

Beside the four properties, each checks the books against the provider's bill: every served
record costs exactly what echo billed for it (tokens at the served model's rates and tier, plus
every search), and none was billed above its reserved worst case. A feature dropped from pricing
or from the bound shows up as a P1 problem even when the counters agree with themselves.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from capcheck.scenario import MESSAGES, Build, Scenario
from catalog.models import Connection, Model, RouteTarget
from core.money import usd_to_nano

if TYPE_CHECKING:
    from capcheck.plan import Setup
    from ledger.models import UsageRecord

SEARCHES = 2
SEARCH_USD = Decimal("0.001")  # per search: 1,000,000 nano-USD
SEARCH_RESULT_TOKENS = 50


def _rate(value: Decimal | None) -> Decimal:
    assert value is not None  # the run's model is always priced (capcheck.run.create_run)
    return value


def _server_tools(build: Build) -> dict[str, Any]:
    model = build.model
    model.web_search_usd_per_use = SEARCH_USD
    model.server_tool_result_tokens = SEARCH_RESULT_TOKENS
    model.save(update_fields=["web_search_usd_per_use", "server_tool_result_tokens"])
    return {
        "path": MESSAGES,
        "body_extra": {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": SEARCHES}]},
    }


def _service_tier(build: Build) -> dict[str, Any]:
    # Half the plan's rates at list price, twice that at priority: the plan's numbers exactly.
    model = build.model
    model.input_usd_per_mtok = _rate(model.input_usd_per_mtok) / 2
    model.output_usd_per_mtok = _rate(model.output_usd_per_mtok) / 2
    model.priority_multiplier = Decimal(2)
    model.save(update_fields=["input_usd_per_mtok", "output_usd_per_mtok", "priority_multiplier"])
    return {"body_extra": {"service_tier": "priority"}}


def _route_alias(build: Build) -> dict[str, Any]:
    # First target: a pricier model on a connection that fails every call it gets.
    model, echo = build.model, build.echo
    pricey = Model.objects.create(
        provider=model.provider,
        name=f"{model.name}-pricey",
        input_usd_per_mtok=_rate(model.input_usd_per_mtok) * 2,
        output_usd_per_mtok=_rate(model.output_usd_per_mtok) * 2,
    )
    failing = Connection.objects.create(
        organization=echo.organization,
        name="echo-failing",
        kind="echo",
        options={**echo.options, "allow_fault_headers": True},
    )
    RouteTarget.objects.filter(route_id=build.route_id).update(position=1)
    RouteTarget.objects.create(route_id=build.route_id, connection=failing, model=pricey, position=0)
    return {"headers": {"x-capgate-echo-fail": "500"}}


def problems(setup: Setup, records: list[UsageRecord]) -> list[str]:
    """The books against the provider's bill, for every record echo served."""
    per_search = usd_to_nano(SEARCH_USD) if setup.scenario == "server-tools" else 0
    expected = setup.tokens.actual_nano + SEARCHES * per_search
    out = []
    for r in records:
        if r.status != "served":
            continue
        if r.cost_nano != expected:
            out.append(f"P1: {r.request_id} recorded {r.cost_nano} nano-USD; the provider billed {expected}")
        if r.excess_nano > 0:
            # Echo never bills past a correct bound here: any excess is a paid feature the worst
            # case left out, and the cap then holds only by that excess.
            out.append(f"P1: {r.request_id} billed {r.excess_nano} nano-USD above its reserved worst case")
        if setup.scenario == "route-alias" and r.provider_model != setup.served_model:
            out.append(
                f"P1: {r.request_id} was served as '{r.provider_model}', not the target's '{setup.served_model}'"
            )
    return out


SERVER_TOOLS = Scenario(name="server-tools", prepare=_server_tools, books=problems)
SERVICE_TIER = Scenario(name="service-tier", prepare=_service_tier, books=problems)
ROUTE_ALIAS = Scenario(name="route-alias", prepare=_route_alias, books=problems)
