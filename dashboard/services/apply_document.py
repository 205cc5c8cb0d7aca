"""Configuration as code: `manage.py apply FILE` declares organizations and everything in them.

apply_config(data=..., dry_run=...):
1. Walks the document in dependency order (prices, then per organization: the organization,
   projects, members, keys, connections, routes, budgets, rate limits; then the operator's
   classifications of what the billing inventory does not list), matching each item to
   an existing row by its natural key (slug, email, name). Each item's fields go through the
   management API's serializer (the API's rules and messages), then the same service as the
   dashboard and API, so every change is validated and audited (actor "apply").
2. Runs in one transaction, each item in a savepoint: a bad item is undone and recorded with its
   path, and the walk goes on, so one run reports every error in the file (an organization that
   cannot be created is reported alone: its items are checked once it can be). If any item is
   bad, ApplyError lists them all and nothing is changed. A dry run does the same work and rolls
   back, so its diff is exactly what a real run would do.
3. Applying twice changes nothing the second time: a field is written only if it differs.

Apply adds and updates; it never deletes what the file does not mention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import transaction

from budgets.api import OrganizationSerializer, ProjectSerializer
from core.errors import InvalidChange
from dashboard.services.apply import (
    APPLY,
    ApplyError,
    ApplyResult,
    Change,
    Problem,
    _find_member,
    _find_project,
    _guard,
    _Item,
    _record,
    _unique,
    pk,
    validated,
)
from dashboard.services.apply_budgets import BUDGET_FIELDS, apply_budget
from dashboard.services.apply_catalog import (
    CONNECTION_FIELDS,
    PRICE_FIELDS,
    ROUTE_FIELDS,
    apply_connection,
    apply_price,
    apply_route,
)
from dashboard.services.apply_classifications import FIELDS as CLASSIFICATION_FIELDS
from dashboard.services.apply_classifications import REQUIRED as CLASSIFICATION_REQUIRED
from dashboard.services.apply_classifications import apply_classification
from dashboard.services.apply_rate_limits import FIELDS as RATE_LIMIT_FIELDS
from dashboard.services.apply_rate_limits import apply_rate_limit
from tenants.api.views import EndCustomerSerializer, KeySerializer, MemberSerializer
from tenants.members import add_member, change_member_role, find_or_create_user
from tenants.models import ApiKey, Organization, hash_key
from tenants.services import (
    create_end_customer,
    create_key,
    create_organization,
    create_project,
    update_key,
    update_organization,
    update_project,
)

T = TypeVar("T")


def apply_config(*, data: Any, dry_run: bool = False) -> ApplyResult:
    """Apply the document; raises ApplyError listing every bad item (then nothing changed)."""
    result = ApplyResult(dry_run=dry_run)
    root = _Item(data, "$", {"organizations", "prices", "classifications"})
    result.errors += root.problems
    with transaction.atomic():
        for i, price in enumerate(_attempt(result, "$.prices", root.list, "prices") or []):
            _attempt(result, f"prices[{i}]", _apply_price, price, f"prices[{i}]", result)
        for i, org in enumerate(_attempt(result, "$.organizations", root.list, "organizations") or []):
            _apply_organization(org, f"organizations[{i}]", result)
        # After the organizations: a classification may name one the file creates.
        for i, raw in enumerate(_attempt(result, "$.classifications", root.list, "classifications") or []):
            where = f"classifications[{i}]"
            _attempt(result, where, _apply_classification, raw, where, result)
        if result.errors:
            raise ApplyError.of(result.errors)  # leaving the block rolls every item back
        if dry_run:
            transaction.set_rollback(True)
    return result


def _attempt(result: ApplyResult, path: str, fn: Callable[..., T], *args: Any) -> T | None:
    """Run one item in a savepoint. A refusal (the serializer's or the service's) undoes the
    item, is recorded with its path, and the walk goes on to the next item."""
    try:
        with transaction.atomic():
            return fn(*args)
    except ApplyError as exc:
        result.errors += exc.problems
    except InvalidChange as exc:
        result.errors.append((f"{path}.{exc.param}" if exc.param else path, exc.message))
    return None


ORG_FIELDS = {
    "slug",
    "name",
    "allow_unpriced",
    "default_run_budget_usd",
    "projects",
    "members",
    "keys",
    "connections",
    "routes",
    "budgets",
    "rate_limits",
}


def _apply_organization(data: Any, path: str, result: ApplyResult) -> None:
    item = _attempt(result, path, _Item, data, path, ORG_FIELDS, {"slug"})
    org = _attempt(result, path, _organization, item, result) if item is not None else None
    if item is None or org is None:
        return  # its items cannot be looked up in an organization that does not exist
    for name, allowed, required, apply_one in _LISTS:
        for i, raw in enumerate(_attempt(result, path, item.list, name) or []):
            where = f"{path}.{name}[{i}]"
            _attempt(result, where, _apply_item, apply_one, org, raw, where, allowed, required, result)


def _apply_classification(data: Any, path: str, result: ApplyResult) -> None:
    apply_classification(_Item(data, path, CLASSIFICATION_FIELDS, CLASSIFICATION_REQUIRED), result)


def _apply_price(data: Any, path: str, result: ApplyResult) -> None:
    apply_price(_Item(data, path, PRICE_FIELDS, {"model"}), result)


def _apply_item(
    apply_one: Callable[[Organization, _Item, ApplyResult], None],
    org: Organization,
    data: Any,
    path: str,
    allowed: set[str],
    required: set[str],
    result: ApplyResult,
) -> None:
    apply_one(org, _Item(data, path, allowed, required), result)


def _organization(item: _Item, result: ApplyResult) -> Organization:
    slug = item.str("slug") or ""
    data: dict[str, Any] = {"name": item.data.get("name", slug)}
    for name in ("allow_unpriced", "default_run_budget_usd"):
        if item.has(name):
            data[name] = item.data[name]
    fields = validated(item, OrganizationSerializer, data)
    org = Organization.objects.filter(slug=slug).first()
    if org is None:
        org = create_organization(slug=slug, actor=APPLY, **fields)
        result.changes.append(Change("create", "organization", slug))
    else:
        _record(result, "organization", slug, update_organization(organization=org, actor=APPLY, **fields))
    return org


# The project's default end-customer cap is a mapping in the file, three fields in the API.
_CAP_NAMES = {
    "default_customer_budget_usd": "default_customer_budget.amount_usd",
    "default_customer_budget_period": "default_customer_budget.period",
    "default_customer_budget_mode": "default_customer_budget.mode",
}


def _apply_project(org: Organization, item: _Item, result: ApplyResult) -> None:
    slug = item.str("slug") or ""
    label = f"{org.slug}/{slug}"
    data: dict[str, Any] = {"slug": slug, "name": item.data.get("name", slug)}
    problems: list[Problem] = []
    if item.has("default_customer_budget"):
        cap = item.data["default_customer_budget"]
        if cap is None:
            data["default_customer_budget_usd"] = None
        else:
            cap_item = _Item(
                cap, f"{item.path}.default_customer_budget", {"amount_usd", "period", "mode"}, {"amount_usd"}
            )
            problems += cap_item.problems
            data["default_customer_budget_usd"] = cap.get("amount_usd")
            data["default_customer_budget_period"] = cap.get("period", "month")
            data["default_customer_budget_mode"] = cap.get("mode", "block")
    fields = validated(item, ProjectSerializer, data, names=_CAP_NAMES, problems=problems)
    del fields["slug"]
    project = org.projects.filter(slug=slug).first()
    with _guard(item.path):
        if project is None:
            project = create_project(organization=org, slug=slug, actor=APPLY, **fields)
            result.changes.append(Change("create", "project", label))
        else:
            _record(result, "project", label, update_project(project=project, actor=APPLY, **fields))
    for j, external_id in enumerate(item.list("end_customers")):
        where = _Item({}, f"{item.path}.end_customers[{j}]", set())
        customer = validated(
            where,
            EndCustomerSerializer,
            {"project": project.pk, "external_id": external_id},
            organization=org,
            names={"external_id": ""},
        )
        if not project.end_customers.filter(external_id=customer["external_id"]).exists():
            with _guard(where.path):
                create_end_customer(project=project, external_id=customer["external_id"], actor=APPLY)
            result.changes.append(Change("create", "end customer", f"{label}/{external_id}"))


def _apply_member(org: Organization, item: _Item, result: ApplyResult) -> None:
    email = (item.str("email") or "").strip().lower()
    password = item.str("password")
    fields = validated(
        item, MemberSerializer, {"email": email, "role": item.data.get("role", "member")}, organization=org
    )
    role = fields["role"]
    label = f"{org.slug}/{email}"
    user = get_user_model().objects.filter(email__iexact=email).order_by("id").first()
    with _guard(item.path):
        if user is None:
            user = find_or_create_user(email=email, password=password)
            result.changes.append(Change("create", "user", email))
        elif password is not None and not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
            result.changes.append(Change("update", "user", email, {"password": ["(changed)", "(changed)"]}))
        member = org.members.filter(user=user).first()
        if member is None:
            add_member(organization=org, email=email, role=role, actor=APPLY)
            result.changes.append(Change("create", "member", f"{label} ({role})"))
        else:
            _record(result, "member", label, change_member_role(member=member, role=role, actor=APPLY))


def _apply_key(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    data: dict[str, Any] = {
        "name": name,
        "allowed_models": item.data.get("allowed_models") or [],
        "expires_at": item.data.get("expires_at"),
        "default_max_output_tokens": item.data.get("default_max_output_tokens"),
    }
    problems: list[Problem] = []
    for field, find in (("project", _find_project), ("member", _find_member)):
        try:
            data[field] = pk(find(org, item.str(field), f"{item.path}.{field}"))
        except ApplyError as exc:
            problems += exc.problems
    fields = validated(item, KeySerializer, data, organization=org, problems=problems)
    del fields["name"]
    raw = item.str("secret")
    key = _unique(ApiKey.objects.filter(organization=org, name=name).order_by("id"), item.path, "keys")
    with _guard(item.path):
        if key is None:
            _, secret = create_key(organization=org, name=name, actor=APPLY, raw=raw, **fields)
            result.changes.append(Change("create", "key", label))
            if raw is None:
                result.secrets.append((label, secret))
        else:
            if raw is not None and hash_key(raw) == key.key_hash:
                raw = None
            _record(result, "key", label, update_key(key=key, actor=APPLY, raw=raw, **fields))


# Each list of an organization: the fields of its items, those required, and who applies one.
_LISTS: list[tuple[str, set[str], set[str], Callable[[Organization, _Item, ApplyResult], None]]] = [
    ("projects", {"slug", "name", "default_customer_budget", "end_customers"}, {"slug"}, _apply_project),
    ("members", {"email", "role", "password"}, {"email"}, _apply_member),
    (
        "keys",
        {"name", "project", "member", "allowed_models", "expires_at", "secret", "default_max_output_tokens"},
        {"name", "project"},
        _apply_key,
    ),
    ("connections", CONNECTION_FIELDS, {"name", "kind"}, apply_connection),
    ("routes", ROUTE_FIELDS, {"name", "targets"}, apply_route),
    ("budgets", BUDGET_FIELDS, {"name", "scope", "amount_usd"}, apply_budget),
    ("rate_limits", RATE_LIMIT_FIELDS, {"name", "scope"}, apply_rate_limit),
]
