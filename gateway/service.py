"""The gateway's synchronous steps: authenticate, route, resolve who pays, size the output
ceiling and admit. Runs on the gateway's database threads (gateway/runtime.py)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from budgets.admission import AdmissionRequest, Subject, admit, headroom, matching_budgets
from budgets.errors import BudgetExceeded
from budgets.models import Budget, Reservation
from catalog.models import Connection, Model, Route
from catalog.pricing import (
    Rates,
    TokenBound,
    UnpricedModel,
    rates_for,
    usd_to_nano,
    worst_case_nano,
)
from config.errors import CapgateError
from gateway.errors import GatewayError, bad_request
from gateway.estimate import Shape
from tenants.models import ApiKey, EndCustomer, hash_key

# Which connection kinds can serve which endpoint without translating formats.
COMPATIBLE = {"chat": {"openai", "echo"}, "embeddings": {"openai", "echo"}, "messages": {"anthropic", "echo"}}
_EXTERNAL_ID = re.compile(r"^[\w.@:+\-]{1,200}$")
MAX_RUN_BUDGET_USD = Decimal("1000000")


@dataclass(frozen=True)
class Target:
    connection: Connection
    model: Model


@dataclass
class Prepared:
    reservation: Reservation
    targets: list[Target]
    worst_nano: int
    inject_max_output: int | None  # send this output ceiling upstream (None: caller's own)
    governed: bool  # False when unpriced traffic is allowed past blocking budgets
    budgets: list[Budget] = field(default_factory=list)


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
            Target(connection=t.connection, model=t.model)
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


def run_budget(*, key: ApiKey, run_id: str | None, amount_usd: str | None) -> None:
    """A run's lifetime budget: created by its first call; a later different amount is a 409."""
    if run_id is None:
        if amount_usd is not None:
            raise bad_request("X-Capgate-Run-Budget-Usd needs X-Capgate-Run.", code="invalid_run")
        return
    if not _EXTERNAL_ID.match(run_id):
        raise bad_request("X-Capgate-Run must be 1-200 letters, digits or . _ @ : + -", code="invalid_run")
    if amount_usd is None:
        amount_nano = key.organization.default_run_budget_nano
        if amount_nano is None:
            return  # a run label without a cap
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
        try:
            with transaction.atomic():
                Budget.objects.create(
                    organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id, period=Budget.Period.LIFETIME,
                    mode=Budget.Mode.BLOCK, amount_nano=amount_nano, name=f"run {run_id}",
                )
            return
        except IntegrityError:  # a concurrent first call created it: compare with that one
            existing = Budget.objects.get(organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id)
    if amount_usd is not None and existing.amount_nano != amount_nano:
        raise GatewayError(
            f"Run '{run_id}' already has a budget of ${existing.amount_nano / 1e9:.6f}; "
            f"a different amount (${amount_nano / 1e9:.6f}) cannot be set by a later call.",
            code="run_budget_conflict", status=409,
        )


def _bound(shape: Shape, target: Target, output_tokens: int) -> TokenBound:
    images = shape.images * (target.model.max_image_tokens or 0)
    return TokenBound(input_tokens=shape.text_tokens + images, output_tokens=output_tokens, choices=shape.choices)


def _catalog_max_output(targets: list[Target]) -> int:
    caps = [t.model.max_output_tokens for t in targets if t.model.max_output_tokens]
    return min(caps) if caps else settings.CAPGATE["DEFAULT_MAX_OUTPUT_TOKENS"]


def prepare(*, key: ApiKey, shape: Shape, targets: list[Target], request_id: str, customer: EndCustomer | None,
            run_id: str | None, owner_id: int | None) -> Prepared:
    """Size the worst case and admit it.

    1. Gather the budgets that cover this key, project, member, customer and run.
    2. Unpriced targets: refused under a blocking budget unless the organization allows
       unpriced traffic (then blocking budgets do not govern it: worst case 0).
    3. Parts the catalog cannot bound (audio, files; images on a model without an image
       bound): refused under a blocking budget.
    4. Output: the caller's max tokens; else, under a blocking budget, the most the tightest
       ceiling can afford up to the catalog maximum (sent upstream so the response cannot
       outrun it), refused below the configured floor; else the catalog maximum.
    5. Admit the worst case over every target the request could fail over to.
    """
    subject = Subject(
        organization_id=key.organization_id, project_id=key.project_id, member_id=key.member_id,
        api_key_id=key.id, end_customer_id=customer.id if customer else None, run_id=run_id,
    )
    budgets = matching_budgets(subject)
    blocking = any(b.mode == Budget.Mode.BLOCK for b in budgets)
    org = key.organization
    try:
        rates = [rates_for(model=t.model, connection=t.connection) for t in targets]
        priced = True
    except UnpricedModel as exc:
        if blocking and not org.allow_unpriced:
            raise GatewayError(
                f"Model {exc.model} has no price, so a blocking budget cannot bound it. Add a price, or allow "
                "unpriced traffic for the organization (blocking budgets then do not govern it).",
                code="unpriced_model_under_budget", status=402,
            ) from None
        priced, rates = False, []
    governed = blocking and priced
    if governed and (shape.unbounded_parts or (shape.images and any(not t.model.max_image_tokens for t in targets))):
        raise GatewayError(
            "The request has parts (audio, files, or images for a model without an image bound) whose cost the "
            "catalog cannot bound, so a blocking budget cannot admit it.",
            code="unbounded_input_under_budget", status=402,
        )

    catalog_max = _catalog_max_output(targets)
    inject = None
    if shape.max_output is not None:
        output = shape.max_output
    elif governed:
        output = _affordable_output(shape, targets, rates, budgets, catalog_max)
        inject = output
    else:
        output = catalog_max
        if shape.kind == "messages":
            inject = output  # Anthropic requires max_tokens
    if shape.kind == "embeddings":
        output, inject = 0, None

    if priced:
        worst = max(worst_case_nano(bound=_bound(shape, t, output), rates=r) for t, r in zip(targets, rates, strict=True))
    else:
        # Allowed unpriced traffic: nothing to reserve, and blocking budgets do not govern it.
        # It still gets a reservation (zero) so its outcome is recorded and leased like any other.
        worst = 0
        budgets = [b for b in budgets if b.mode == Budget.Mode.ALERT]
    admitted = admit(request=AdmissionRequest(
        subject=subject, request_id=request_id, worst_nano=worst, model=shape.model, owner_id=owner_id, budgets=budgets,
    ))
    return Prepared(reservation=admitted.reservation, targets=targets, worst_nano=worst, inject_max_output=inject,
                    governed=governed, budgets=budgets)


def _affordable_output(shape: Shape, targets: list[Target], rates: list, budgets: list[Budget], catalog_max: int) -> int:
    tightest = headroom(budgets=budgets)
    floor = settings.CAPGATE["MIN_OUTPUT_TOKENS"]
    if tightest is None:
        return catalog_max
    input_worst = max(worst_case_nano(bound=_bound(shape, t, 0), rates=r) for t, r in zip(targets, rates, strict=True))
    per_token = max(r.output for r in rates) * 1000 * shape.choices  # nano-USD per output token
    room = tightest.remaining_nano - input_worst
    affordable = int(Decimal(room) / per_token) if per_token > 0 and room > 0 else (catalog_max if per_token == 0 else 0)
    output = min(catalog_max, affordable)
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
    run_budget(key=key, run_id=run_id, amount_usd=run_budget_usd)
    prepared = prepare(key=key, shape=shape, targets=alive, request_id=request_id, customer=customer,
                       run_id=run_id, owner_id=owner_id)
    return key, prepared
