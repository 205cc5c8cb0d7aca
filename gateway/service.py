"""The gateway's synchronous steps: authenticate, route, resolve who pays, size the output
ceiling and admit. Runs on the gateway's database threads (gateway/runtime.py)."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from budgets.errors import BudgetExceeded
from budgets.models import Budget, Reservation
from catalog.models import Connection, Model, Route
from catalog.pricing import (
    Rates,
    TokenBound,
    UnpricedFeature,
    UnpricedModel,
    nano_per_output_token,
    nano_to_usd,
    rates_for,
    usd_to_nano,
    worst_case_nano,
)
from core.errors import CapgateError
from gateway import responses, tokens
from gateway.errors import GatewayError, bad_request
from gateway.estimate import Shape
from gateway.limits import enforce_limits
from ledger.admission import AdmissionRequest, Ceiling, Subject, admit, headroom, matching_budgets
from tenants.models import ApiKey, EndCustomer, hash_key

# Which connection kinds can serve which endpoint without translating formats.
COMPATIBLE = {"chat": {"openai", "echo"}, "embeddings": {"openai", "echo"}, "messages": {"anthropic", "echo"},
              "responses": {"openai", "echo"}, "videos": {"openai", "echo"}}
_EXTERNAL_ID = re.compile(r"^[\w.@:+\-]{1,200}$")
MAX_RUN_BUDGET_USD = Decimal("1000000")


@dataclass(frozen=True)
class Target:
    connection: Connection
    model: Model
    route_max_output: int | None = None  # the route's default output ceiling

    def tier(self, requested: str | None) -> str | None:
        """The service tier this target bills a request at: the request's own, or for "auto"
        (and no tier) the tier the connection declares its provider project uses."""
        if requested in (None, "auto"):
            return self.connection.options.get("service_tier") or None
        return requested


@dataclass
class Prepared:
    reservation: Reservation
    targets: list[Target]
    worst_nano: int
    inject_max_output: int | None  # send this output ceiling upstream (None: caller's own)
    governed: bool  # False when unpriced traffic is allowed past blocking budgets
    budgets: list[Budget] = field(default_factory=list)
    remaining_nano: int | None = None  # the tightest ceiling's room after this reservation
    input_bound: str = "bytes"  # how the prompt was bounded: "exact" (its tokenizer) or "bytes"
    input_tokens: int = 0  # the prompt tokens reserved (per sampling pass, before images)


class _TTLCache:
    """A tiny per-process cache for the hot path's lookups (keys, routes).

    Entries live CAPGATE["LOOKUP_CACHE_SECONDS"] (0 disables it): a revoked or re-routed key is
    honoured within that many seconds in every process. Budgets are never cached — a new or
    changed cap takes effect on the next request."""

    def __init__(self) -> None:
        self._data: dict[object, tuple[float, object]] = {}

    def get(self, key: object) -> object | None:
        hit = self._data.get(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, key: object, value: object) -> None:
        ttl = settings.CAPGATE["LOOKUP_CACHE_SECONDS"]
        if ttl > 0:
            if len(self._data) > 10_000:
                self._data.clear()
            self._data[key] = (time.monotonic() + ttl, value)

    def clear(self) -> None:
        self._data.clear()


lookups = _TTLCache()


def authenticate(raw_key: str | None) -> ApiKey:
    if not raw_key:
        raise GatewayError("Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'.",
                           code="invalid_api_key", status=401)
    digest = hash_key(raw_key)
    key = cast(ApiKey | None, lookups.get(("key", digest)))
    if key is None:
        key = ApiKey.objects.select_related("organization", "project").filter(key_hash=digest).first()
        if key is not None:
            lookups.put(("key", digest), key)
    if key is None:
        raise GatewayError("Invalid API key.", code="invalid_api_key", status=401)
    if key.revoked_at is not None:
        raise GatewayError("This API key has been revoked.", code="revoked_api_key", status=401)
    if key.expires_at is not None and key.expires_at <= timezone.now():
        raise GatewayError("This API key has expired.", code="expired_api_key", status=401)
    return key


def resolve_route(*, key: ApiKey, name: str, kind: str) -> list[Target]:
    if not key.allows_model(name):
        raise GatewayError(f"This key may not call model '{name}'.", code="model_not_allowed", status=403, param="model")
    cache_key = ("route", key.organization_id, name)
    routed = cast(list[Target] | None, lookups.get(cache_key))
    if routed is None:
        route = Route.objects.filter(organization_id=key.organization_id, name=name).first()
        if route is None:
            raise GatewayError(f"The model '{name}' does not exist or is not routed for this organization.",
                               code="model_not_found", status=404, param="model")
        routed = [
            Target(connection=t.connection, model=t.model, route_max_output=route.default_max_output_tokens)
            for t in route.targets.select_related("connection", "model", "model__provider").order_by("position", "id")
        ]
        lookups.put(cache_key, routed)
    targets = [t for t in routed if t.connection.enabled and t.connection.kind in COMPATIBLE[kind]]
    if not targets:
        raise GatewayError(f"No enabled connection of a compatible kind serves '{name}' on this endpoint.",
                           code="connection_unavailable", status=503)
    return targets


def list_models(*, key: ApiKey) -> list[str]:
    names = Route.objects.filter(organization_id=key.organization_id).order_by("name").values_list("name", flat=True)
    return [n for n in names if key.allows_model(n)]


def end_customer(*, key: ApiKey, external_id: str | None) -> EndCustomer | None:
    """The end customer named by X-Capgate-Customer, created on first sight. A project's default
    customer cap is materialised as the customer's own budget the first time it is needed."""
    if external_id is None:
        return None
    if not _EXTERNAL_ID.match(external_id):
        raise bad_request("X-Capgate-Customer must be 1-200 letters, digits or . _ @ : + -", code="invalid_customer")
    customer, _ = EndCustomer.objects.get_or_create(project_id=key.project_id, external_id=external_id)
    project = key.project
    if project.default_customer_budget_nano is not None and not Budget.objects.filter(end_customer=customer).exists():
        with transaction.atomic():
            # Serialise racing first requests of one customer on its row: one default budget.
            EndCustomer.objects.select_for_update().get(pk=customer.pk)
            if not Budget.objects.filter(end_customer=customer).exists():
                Budget.objects.create(
                    organization_id=key.organization_id, scope=Budget.Scope.END_CUSTOMER, end_customer=customer,
                    name="project default customer cap", period=project.default_customer_budget_period,
                    mode=project.default_customer_budget_mode, amount_nano=project.default_customer_budget_nano,
                )
    return customer


def run_budget(*, key: ApiKey, run_id: str | None, amount_usd: str | None) -> int | None:
    """Validate a run's headers. Returns the amount of the lifetime budget the run still needs
    (created by `create_run_budget` in the same transaction as its first admission, so a refused
    first call leaves no budget behind), or None when it has one or needs none. A later call
    with a different amount is a 409."""
    if run_id is None:
        if amount_usd is not None:
            raise bad_request("X-Capgate-Run-Budget-Usd needs X-Capgate-Run.", code="invalid_run")
        return None
    if not _EXTERNAL_ID.match(run_id):
        raise bad_request("X-Capgate-Run must be 1-200 letters, digits or . _ @ : + -", code="invalid_run")
    if amount_usd is None:
        amount_nano = key.organization.default_run_budget_nano
        if amount_nano is None:
            return None  # a run label without a cap
    else:
        try:
            amount = Decimal(amount_usd)
        except InvalidOperation:
            raise bad_request("X-Capgate-Run-Budget-Usd must be a decimal USD amount.", code="invalid_run_budget") from None
        if not amount.is_finite() or amount <= 0 or amount > MAX_RUN_BUDGET_USD:
            raise bad_request(f"X-Capgate-Run-Budget-Usd must be > 0 and <= {MAX_RUN_BUDGET_USD}.", code="invalid_run_budget")
        amount_nano = usd_to_nano(amount)
    existing = Budget.objects.filter(organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id).first()
    if existing is None:
        return amount_nano
    _check_run_amount(existing, run_id=run_id, amount_nano=amount_nano if amount_usd is not None else None)
    return None


def _check_run_amount(existing: Budget, *, run_id: str, amount_nano: int | None) -> None:
    if amount_nano is not None and existing.amount_nano != amount_nano:
        raise GatewayError(
            f"Run '{run_id}' already has a budget of ${nano_to_usd(existing.amount_nano):.6f}; "
            f"a different amount (${nano_to_usd(amount_nano):.6f}) cannot be set by a later call.",
            code="run_budget_conflict", status=409,
        )


def create_run_budget(*, key: ApiKey, run_id: str, amount_nano: int, explicit: bool) -> None:
    """Create a run's lifetime budget; call inside the transaction that admits its first call.
    A concurrent first call waits on the unique index, then finds this one and compares."""
    try:
        with transaction.atomic():
            Budget.objects.create(
                organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id, period=Budget.Period.LIFETIME,
                mode=Budget.Mode.BLOCK, amount_nano=amount_nano, name=f"run {run_id}",
            )
    except IntegrityError:  # a concurrent first call created it: compare with that one
        existing = Budget.objects.get(organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id)
        _check_run_amount(existing, run_id=run_id, amount_nano=amount_nano if explicit else None)


def _bound(shape: Shape, target: Target, rates: Rates, output_tokens: int) -> TokenBound:
    """A target's token bound. Each server-side tool use is another sampling pass over the
    context, which by then holds every earlier tool result, so the input is bounded by
    (uses + 1) passes over the body plus every result a use may add."""
    if shape.web_searches and rates.server_tool_result_tokens is None:
        raise UnpricedFeature(target.model, "web search results")
    images = shape.images * (target.model.max_image_tokens or 0)
    results = shape.fetch_tokens + shape.web_searches * (rates.server_tool_result_tokens or 0)
    per_pass = shape.text_tokens + images + results
    return TokenBound(
        input_tokens=per_pass * (1 + shape.server_tool_uses), output_tokens=output_tokens + shape.extra_output,
        choices=shape.choices, web_searches=shape.web_searches, cache_1h=shape.cache_1h,
    )


def _bound_tokens(shape: Shape, output: int) -> int:
    """The tokens a request may use, for tokens-per-minute limits: its input bound plus its
    output ceiling per choice."""
    passes = 1 + shape.server_tool_uses
    return (shape.text_tokens + shape.fetch_tokens) * passes + (output + shape.extra_output) * shape.choices


def _catalog_max_output(targets: list[Target]) -> int:
    caps = [t.model.max_output_tokens for t in targets if t.model.max_output_tokens]
    return min(caps) if caps else settings.CAPGATE["DEFAULT_MAX_OUTPUT_TOKENS"]


def _default_output(key: ApiKey, targets: list[Target]) -> int | None:
    """The configured output ceiling for requests that name none: the tighter of the key's and
    the route's."""
    defaults = [d for d in (key.default_max_output_tokens, targets[0].route_max_output) if d]
    return min(defaults) if defaults else None


@dataclass
class _Priced:
    target: Target
    rates: Rates


def _price_targets(shape: Shape, targets: list[Target]) -> tuple[list[_Priced], UnpricedModel | None,
                                                                 UnpricedFeature | None]:
    """Each target's rates at the tier it would bill this request at, and a bound check; the
    targets that cannot be priced are set aside with the first reason."""
    priced: list[_Priced] = []
    no_model: UnpricedModel | None = None
    no_feature: UnpricedFeature | None = None
    for t in targets:
        try:
            rates = rates_for(model=t.model, connection=t.connection, tier=t.tier(shape.service_tier))
            worst_case_nano(bound=_bound(shape, t, rates, 0), rates=rates)
        except UnpricedModel as exc:
            no_model = no_model or exc
            continue
        except UnpricedFeature as exc:
            no_feature = no_feature or exc
            continue
        priced.append(_Priced(t, rates))
    return priced, no_model, no_feature


_FEATURE_CODES = {"web search": "web_search", "web search results": "web_search", "1-hour cache writes": "cache_control"}


def _feature_code(exc: UnpricedFeature) -> str:
    name = "service_tier" if exc.feature.startswith("service_tier") else _FEATURE_CODES.get(exc.feature, "feature")
    return f"{name}_under_budget"


def prepare(*, key: ApiKey, shape: Shape, targets: list[Target], request_id: str, customer: EndCustomer | None,
            run_id: str | None, owner_id: int | None) -> Prepared:
    """Size the worst case and admit it.

    1. Gather the budgets that cover this key, project, member, customer and run.
    2. Under a blocking budget, refuse fields the billing inventory refuses there
       (docs/billing.md), then price every target at the tier it would bill: a target that
       cannot be priced (no price, or none for a paid feature the request uses) is not tried,
       so a failover can never land on a call the cap does not count. With no priced target
       left: 402 naming the feature, or `unpriced_model_under_budget` unless the organization
       allows unpriced traffic (then blocking budgets do not govern it: worst case 0).
    3. Parts the catalog cannot bound (audio, files; images on a model without an image
       bound): refused under a blocking budget.
    4. Output: the caller's max tokens; else the configured default (key, route) or the
       catalog maximum, and under a blocking budget no more than the tightest ceiling can
       afford (sent upstream so the response cannot outrun it), refused below the floor.
    5. Admit the worst case over every target the request could fail over to.
    """
    subject = Subject(
        organization_id=key.organization_id, project_id=key.project_id, member_id=key.member_id,
        api_key_id=key.id, end_customer_id=customer.id if customer else None, run_id=run_id,
    )
    budgets = matching_budgets(subject)
    blocking = any(b.mode == Budget.Mode.BLOCK for b in budgets)
    if shape.context_ref is not None:
        earlier = responses.context_tokens(organization_id=key.organization_id, ref=shape.context_ref)
        if earlier is None and blocking:
            raise responses.unknown_context(shape.context_ref)
        shape = dataclasses.replace(shape, text_tokens=shape.text_tokens + (earlier or 0))
    if blocking and shape.refused:
        field = shape.refused[0]
        raise GatewayError(
            f"'{field}' buys something whose cost the catalog cannot bound (docs/billing.md), so a blocking "
            "budget cannot admit it.", code=f"{field}_under_budget", status=402, param=field,
        )
    priced, no_model, no_feature = _price_targets(shape, targets)
    if blocking and priced:
        targets = [p.target for p in priced]  # unpriced fallbacks are not tried under a cap
    elif blocking and no_feature is not None:
        raise GatewayError(
            f"Model {no_feature.model} has no catalog price for {no_feature.feature}, so a blocking budget "
            "cannot admit a request that uses it.", code=_feature_code(no_feature), status=402,
        )
    elif blocking and not key.organization.allow_unpriced:
        assert no_model is not None
        raise GatewayError(
            f"Model {no_model.model} has no price, so a blocking budget cannot bound it. Add a price, or allow "
            "unpriced traffic for the organization (blocking budgets then do not govern it).",
            code="unpriced_model_under_budget", status=402,
        )
    governed = blocking and bool(priced)
    if governed and (shape.unbounded_parts or (shape.images and any(not t.model.max_image_tokens for t in targets))):
        raise GatewayError(
            "The request has parts (audio, files, or images for a model without an image bound) whose cost the "
            "catalog cannot bound, so a blocking budget cannot admit it.",
            code="unbounded_input_under_budget", status=402,
        )

    # One unlocked read of the tightest ceiling, shared by the exact count and the output ceiling.
    tightest = headroom(budgets=budgets) if governed and (shape.max_output is None or _countable(shape, priced)) else None
    shape, input_bound = _exact_prompt(shape, priced, tightest)
    cap = _catalog_max_output(targets)
    default = _default_output(key, targets)
    inject = None
    if shape.max_output is not None:
        output = shape.max_output
    else:
        if default is not None:
            cap = min(cap, default)
        output = _affordable_output(shape, priced, tightest, cap) if governed else cap
        if governed or default is not None or shape.kind == "messages":  # Anthropic requires max_tokens
            inject = output
    if shape.kind == "embeddings":
        output, inject = 0, None

    if priced:
        worst = max(worst_case_nano(bound=_bound(shape, p.target, p.rates, output), rates=p.rates) for p in priced)
    else:
        worst = 0
    if not governed:
        # Unpriced traffic allowed past blocking budgets: they do not govern it (the dashboard
        # says so). It still gets a reservation so its outcome is recorded and leased.
        worst = worst if not blocking else 0
        budgets = [b for b in budgets if b.mode == Budget.Mode.ALERT] if blocking else budgets
    enforce_limits(key=key, customer=customer, tokens=_bound_tokens(shape, output), targets=targets)
    admitted = admit(request=AdmissionRequest(
        subject=subject, request_id=request_id, worst_nano=worst, model=shape.model, owner_id=owner_id, budgets=budgets,
    ))
    remaining = min((c.remaining_nano for c in admitted.ceilings), default=None)
    return Prepared(reservation=admitted.reservation, targets=targets, worst_nano=worst, inject_max_output=inject,
                    governed=governed, budgets=budgets,
                    remaining_nano=remaining - worst if remaining is not None else None,
                    input_bound=input_bound, input_tokens=shape.text_tokens)


def _countable(shape: Shape, priced: list[_Priced]) -> bool:
    return shape.prompt is not None and bool(priced) and all(p.target.model.tokenizer for p in priced)


def _exact_prompt(shape: Shape, priced: list[_Priced], tightest: Ceiling | None) -> tuple[Shape, str]:
    """The shape with its prompt counted exactly, when that changes the answer (issue 14).

    Only under a blocking ceiling, when every priced target's model has a local tokenizer
    (a byte-bound target, such as an Anthropic fallback, keeps bytes for all: the count must
    bound each target), and when the byte bound's worst case would take more than
    EXACT_COUNT_SHARE of the tightest ceiling's room — so it also covers every request the
    byte bound would refuse. The count is the largest over the targets' encodings."""
    if tightest is None or not _countable(shape, priced):
        return shape, "bytes"
    assert shape.prompt is not None
    encodings = {cast(str, p.target.model.tokenizer) for p in priced}
    output = shape.max_output or 0
    worst = max(worst_case_nano(bound=_bound(shape, p.target, p.rates, output), rates=p.rates) for p in priced)
    if worst <= settings.CAPGATE["EXACT_COUNT_SHARE"] * max(tightest.remaining_nano, 0):
        return shape, "bytes"
    counts = []
    for name in sorted(encodings):
        enc = tokens.encoding(name)
        if enc is None:  # data missing or altered: fail safe
            return shape, "bytes"
        counts.append(tokens.count(shape.prompt, enc))
    exact = max(counts)
    if exact >= shape.text_tokens:
        return shape, "bytes"
    return dataclasses.replace(shape, text_tokens=exact), "exact"


def _affordable_output(shape: Shape, priced: list[_Priced], tightest: Ceiling | None, cap: int) -> int:
    floor = settings.CAPGATE["MIN_OUTPUT_TOKENS"]
    if tightest is None:
        return cap
    bounds = [(p, _bound(shape, p.target, p.rates, 0)) for p in priced]
    input_worst = max(worst_case_nano(bound=b, rates=p.rates) for p, b in bounds)
    per_token = max(nano_per_output_token(rates=p.rates, input_tokens=b.input_tokens) for p, b in bounds) * shape.choices
    room = tightest.remaining_nano - input_worst
    affordable = int(Decimal(room) / per_token) if per_token > 0 and room > 0 else (cap if per_token == 0 else 0)
    output = min(cap, max(affordable - shape.extra_output, 0))
    if output < floor:
        raise BudgetExceeded(code=tightest.code, budget_id=tightest.budget_id, window_id=tightest.window_id,
                             limit_nano=tightest.limit_nano, remaining_nano=tightest.remaining_nano,
                             worst_nano=input_worst + int(per_token * floor))
    return output


def settle_rates(*, reservation: Reservation) -> tuple[Target | None, Rates | None]:
    """The rates a reservation-API settle prices usage at: its route's first target."""
    route = Route.objects.filter(organization_id=reservation.organization_id, name=reservation.model).first()
    if route is None:
        return None, None
    target = route.targets.select_related("connection", "model").order_by("position", "id").first()
    if target is None:
        return None, None
    return Target(connection=target.connection, model=target.model), rates_for(model=target.model, connection=target.connection)


__all__ = ["CapgateError", "Prepared", "admit_call", "Target", "authenticate", "end_customer", "list_models", "prepare",
           "resolve_route", "run_budget", "settle_rates"]


def admit_call(*, raw_key: str | None, shape: Shape | None, shape_error: CapgateError | None, kind: str,
               request_id: str, customer_id: str | None, run_id: str | None, run_budget_usd: str | None,
               owner_id: int | None, healthy: object) -> tuple[ApiKey, Prepared]:
    """Everything before the provider call, in one trip to a database thread:
    authenticate, validate, route, resolve customer and run, admit."""
    key = authenticate(raw_key)
    if shape_error is not None:
        raise shape_error
    assert shape is not None
    targets = resolve_route(key=key, name=shape.model, kind=kind)
    alive = [t for t in targets if healthy(t.connection.id)]  # type: ignore[operator]
    if not alive:
        raise GatewayError(f"Every connection serving '{shape.model}' is failing; retry later.",
                           code="connection_unavailable", status=503)
    customer = end_customer(key=key, external_id=customer_id)
    new_run_nano = run_budget(key=key, run_id=run_id, amount_usd=run_budget_usd)
    if new_run_nano is None:
        prepared = prepare(key=key, shape=shape, targets=alive, request_id=request_id, customer=customer,
                           run_id=run_id, owner_id=owner_id)
        return key, prepared
    # A run's first call: its budget exists only if the call is admitted (one transaction), so
    # refused first calls leave nothing behind for the audit to carry.
    assert run_id is not None
    with transaction.atomic():
        create_run_budget(key=key, run_id=run_id, amount_nano=new_run_nano, explicit=run_budget_usd is not None)
        prepared = prepare(key=key, shape=shape, targets=alive, request_id=request_id, customer=customer,
                           run_id=run_id, owner_id=owner_id)
    return key, prepared
