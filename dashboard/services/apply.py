"""Configuration as code: `manage.py apply FILE` declares organizations and everything in them.

apply_config(data=..., dry_run=...):
1. Walks the document in dependency order (prices, then per organization: the organization,
   projects, members, keys, connections, routes, budgets), matching each item to an existing row
   by its natural key (slug, email, name) and calling the same services as the dashboard and API,
   so every change is validated and audited (actor "apply").
2. Runs in one transaction: any bad item raises ApplyError naming it and nothing is changed.
   A dry run does the same work and rolls back, so its diff is exactly what a real run would do.
3. Applying twice changes nothing the second time: a field is written only if it differs.

Apply adds and updates; it never deletes what the file does not mention.
"""

from __future__ import annotations

import builtins  # `builtins.str` in _Item: its own `str` method shadows the name there
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.dateparse import parse_datetime

from budgets.models import Budget
from budgets.services import create_budget, update_budget
from catalog.models import Connection
from catalog.pricing import usd_to_nano
from catalog.services import (
    FEATURE_DECIMAL_FIELDS,
    FEATURE_INT_FIELDS,
    RATE_FIELDS,
    create_connection,
    find_model,
    set_model_price,
    set_route,
    update_connection,
)
from dashboard.money import format_usd
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project, hash_key
from tenants.services import (
    APPLY,
    InvalidChange,
    add_member,
    change_member_role,
    create_end_customer,
    create_key,
    create_organization,
    create_project,
    find_or_create_user,
    update_key,
    update_organization,
    update_project,
)


class ApplyError(Exception):
    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass
class Change:
    action: str  # "create" | "update"
    kind: str
    label: str
    fields: dict[str, list[Any]] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.action == "create":
            return f"+ {self.kind} {self.label}"
        parts = [f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in self.fields.items()]
        return f"~ {self.kind} {self.label}: " + ", ".join(parts)


@dataclass
class ApplyResult:
    changes: list[Change] = field(default_factory=list)
    secrets: list[tuple[str, str]] = field(default_factory=list)  # (key label, raw secret)
    dry_run: bool = False


def _show(value: Any) -> str:
    return "—" if value is None else str(value)


def _usd_fields(changes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Show nano-USD fields as USD to the reader."""
    out = {}
    for k, (a, b) in changes.items():
        if k.endswith("_nano"):
            k = k[: -len("_nano")] + "_usd"
            a = None if a is None else format_usd(a)
            b = None if b is None else format_usd(b)
        out[k] = [a, b]
    return out


# --- reading the document ----------------------------------------------------------------------


class _Item:
    """One mapping of the document, with its path for error messages and a check for typos."""

    def __init__(self, data: Any, path: str, allowed: set[str], required: set[str] = frozenset()):  # type: ignore[assignment]
        if not isinstance(data, dict):
            raise ApplyError(path, "expected a mapping")
        unknown = set(data) - allowed
        if unknown:
            raise ApplyError(path, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        missing = required - set(data)
        if missing:
            raise ApplyError(path, f"missing field(s) {', '.join(sorted(missing))}")
        self.data, self.path = data, path

    def has(self, key: str) -> bool:
        return key in self.data

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is not None and not isinstance(value, str):
            raise ApplyError(f"{self.path}.{key}", "expected text")
        return value

    def bool(self, key: builtins.str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ApplyError(f"{self.path}.{key}", "expected true or false")
        return value

    def list(self, key: builtins.str) -> list[Any]:
        value = self.data.get(key) or []
        if not isinstance(value, list):
            raise ApplyError(f"{self.path}.{key}", "expected a list")
        return value

    def usd(self, key: builtins.str) -> int | None:
        value = self.data.get(key)
        return None if value is None else usd_nano(value, f"{self.path}.{key}")

    def rate(self, key: builtins.str) -> Decimal | None:
        value = self.data.get(key)
        return None if value is None else _decimal(value, f"{self.path}.{key}")

    def when(self, key: builtins.str) -> datetime | None:
        value = self.data.get(key)
        if value is None:
            return None
        parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
        if parsed is None:
            raise ApplyError(f"{self.path}.{key}", f"{value!r} is not an ISO 8601 date-time")
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _decimal(value: Any, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ApplyError(path, "expected a decimal number")
    try:
        amount = Decimal(str(value))
    except InvalidOperation as exc:
        raise ApplyError(path, f"{value!r} is not a decimal number") from exc
    if not amount.is_finite() or amount < 0:
        raise ApplyError(path, "expected a non-negative amount")
    return amount


def usd_nano(value: Any, path: str) -> int:
    amount = _decimal(value, path)
    if amount.as_tuple().exponent < -9:  # type: ignore[operator]
        raise ApplyError(path, "at most 9 decimal places (1 nano-USD)")
    return usd_to_nano(amount)


# --- applying -----------------------------------------------------------------------------------


def apply_config(*, data: Any, dry_run: bool = False) -> ApplyResult:
    result = ApplyResult(dry_run=dry_run)
    root = _Item(data, "$", {"organizations", "prices"})
    with transaction.atomic():
        for i, price in enumerate(root.list("prices")):
            _apply_price(_Item(price, f"prices[{i}]", {"model", *RATE_FIELDS, "per_request_usd",
                                                       "max_output_tokens", "context_window",
                                                       "max_image_tokens", *FEATURE_DECIMAL_FIELDS,
                                                       *FEATURE_INT_FIELDS, "tokenizer"}, {"model"}), result)
        for i, org in enumerate(root.list("organizations")):
            _apply_organization(org, f"organizations[{i}]", result)
        if dry_run:
            transaction.set_rollback(True)
    return result


@contextmanager
def _guard(path: str) -> Iterator[None]:
    """Turn a service's InvalidChange into an ApplyError naming the item."""
    try:
        yield
    except InvalidChange as exc:
        raise ApplyError(f"{path}.{exc.param}" if exc.param else path, exc.message) from exc


def _apply_price(item: _Item, result: ApplyResult) -> None:
    ref = item.str("model") or ""
    fields: dict[str, Any] = {}
    for name in (*RATE_FIELDS, "per_request_usd", *FEATURE_DECIMAL_FIELDS):
        if item.has(name):
            fields[name] = item.rate(name)
    for name in ("max_output_tokens", "context_window", "max_image_tokens", *FEATURE_INT_FIELDS):
        if item.has(name):
            value = item.data[name]
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ApplyError(f"{item.path}.{name}", "expected a whole number")
            fields[name] = value
    if item.has("tokenizer"):
        fields["tokenizer"] = item.data["tokenizer"]  # set_model_price checks it (null: bytes)
    with _guard(item.path):
        existed = _model_exists(ref)
        _, changes = set_model_price(ref=ref, **fields)
    if not existed:
        result.changes.append(Change("create", "model price", ref))
    elif changes:
        result.changes.append(Change("update", "model price", ref, changes))


def _model_exists(ref: str) -> bool:
    try:
        find_model(ref)
    except InvalidChange:
        return False
    return True


def _apply_organization(data: Any, path: str, result: ApplyResult) -> None:
    item = _Item(
        data, path,
        {"slug", "name", "allow_unpriced", "default_run_budget_usd", "projects", "members", "keys",
         "connections", "routes", "budgets", "rate_limits"},
        {"slug"},
    )
    slug = item.str("slug") or ""
    fields: dict[str, Any] = {"name": item.str("name", slug)}
    if item.has("allow_unpriced"):
        fields["allow_unpriced"] = item.bool("allow_unpriced", False)
    if item.has("default_run_budget_usd"):
        fields["default_run_budget_nano"] = item.usd("default_run_budget_usd")
    org = Organization.objects.filter(slug=slug).first()
    with _guard(path):
        if org is None:
            org = create_organization(slug=slug, actor=APPLY, **fields)
            result.changes.append(Change("create", "organization", slug))
        else:
            _record(result, "organization", slug, update_organization(organization=org, actor=APPLY, **fields))
    for i, p in enumerate(item.list("projects")):
        _apply_project(org, _Item(p, f"{path}.projects[{i}]", {"slug", "name", "default_customer_budget",
                                                               "end_customers"}, {"slug"}), result)
    for i, m in enumerate(item.list("members")):
        _apply_member(org, _Item(m, f"{path}.members[{i}]", {"email", "role", "password"}, {"email"}), result)
    for i, k in enumerate(item.list("keys")):
        _apply_key(org, _Item(k, f"{path}.keys[{i}]", {"name", "project", "member", "allowed_models",
                                                       "expires_at", "secret", "default_max_output_tokens"},
                              {"name", "project"}), result)
    for i, c in enumerate(item.list("connections")):
        _apply_connection(org, _Item(c, f"{path}.connections[{i}]", {"name", "kind", "base_url", "secret",
                                                                     "secret_env", "rates", "options",
                                                                     "enabled"}, {"name", "kind"}), result)
    for i, r in enumerate(item.list("routes")):
        _apply_route(org, _Item(r, f"{path}.routes[{i}]", {"name", "targets", "default_max_output_tokens"},
                                {"name", "targets"}), result)
    for i, b in enumerate(item.list("budgets")):
        _apply_budget(org, _Item(b, f"{path}.budgets[{i}]", {"name", "scope", "project", "member", "key",
                                                             "end_customer", "run", "period", "timezone",
                                                             "mode", "amount_usd", "thresholds",
                                                             "recipients"}, {"name", "scope", "amount_usd"}),
                      result)
    from dashboard.services.apply_rate_limits import FIELDS, apply_rate_limit  # imports this module

    for i, r in enumerate(item.list("rate_limits")):
        apply_rate_limit(org, _Item(r, f"{path}.rate_limits[{i}]", FIELDS, {"name", "scope"}), result)


def _record(result: ApplyResult, kind: str, label: str, changes: dict[str, list[Any]]) -> None:
    if changes:
        result.changes.append(Change("update", kind, label, _usd_fields(changes)))


def _apply_project(org: Organization, item: _Item, result: ApplyResult) -> None:
    slug = item.str("slug") or ""
    label = f"{org.slug}/{slug}"
    fields: dict[str, Any] = {"name": item.str("name", slug)}
    if item.has("default_customer_budget"):
        cap = item.data["default_customer_budget"]
        if cap is None:
            fields["default_customer_budget_nano"] = None
        else:
            cap_item = _Item(cap, f"{item.path}.default_customer_budget", {"amount_usd", "period", "mode"},
                             {"amount_usd"})
            fields["default_customer_budget_nano"] = cap_item.usd("amount_usd")
            fields["default_customer_budget_period"] = cap_item.str("period", "month")
            fields["default_customer_budget_mode"] = cap_item.str("mode", "block")
    project = org.projects.filter(slug=slug).first()
    with _guard(item.path):
        if project is None:
            project = create_project(organization=org, slug=slug, actor=APPLY, **fields)
            result.changes.append(Change("create", "project", label))
        else:
            _record(result, "project", label, update_project(project=project, actor=APPLY, **fields))
        for j, external_id in enumerate(item.list("end_customers")):
            if not isinstance(external_id, str):
                raise ApplyError(f"{item.path}.end_customers[{j}]", "expected text")
            if not project.end_customers.filter(external_id=external_id).exists():
                create_end_customer(project=project, external_id=external_id, actor=APPLY)
                result.changes.append(Change("create", "end customer", f"{label}/{external_id}"))


def _apply_member(org: Organization, item: _Item, result: ApplyResult) -> None:
    email = (item.str("email") or "").strip().lower()
    role = item.str("role", "member") or ""
    password = item.str("password")
    label = f"{org.slug}/{email}"
    with _guard(item.path):
        user = get_user_model().objects.filter(email__iexact=email).order_by("id").first()
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


def _find_member(org: Organization, email: str | None, path: str) -> Member | None:
    if email is None:
        return None
    member = org.members.filter(user__email__iexact=email).first()
    if member is None:
        raise ApplyError(path, f"no member {email!r} in {org.slug} (declare it under members)")
    return member


def _find_project(org: Organization, slug: str | None, path: str) -> Project:
    project = org.projects.filter(slug=slug).first()
    if project is None:
        raise ApplyError(path, f"no project {slug!r} in {org.slug} (declare it under projects)")
    return project


def _unique(qs: Any, path: str, what: str) -> Any:
    found = list(qs[:2])
    if len(found) > 1:
        raise ApplyError(path, f"several {what} share this name; rename them so apply can tell them apart")
    return found[0] if found else None


def _apply_key(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    allowed = item.list("allowed_models")
    fields: dict[str, Any] = {
        "project": _find_project(org, item.str("project"), f"{item.path}.project"),
        "member": _find_member(org, item.str("member"), f"{item.path}.member"),
        "allowed_models": allowed,
        "expires_at": item.when("expires_at"),
        "default_max_output_tokens": item.data.get("default_max_output_tokens"),
    }
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


def _apply_connection(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    secret = item.str("secret")
    env_name = item.str("secret_env")
    if env_name is not None:
        if secret is not None:
            raise ApplyError(item.path, "give secret or secret_env, not both")
        if env_name not in os.environ:
            raise ApplyError(f"{item.path}.secret_env", f"environment variable {env_name} is not set")
        secret = os.environ[env_name]
    fields: dict[str, Any] = {
        "kind": item.str("kind"),
        "base_url": item.str("base_url", "") or "",
        "options": item.data.get("options") or {},
        "enabled": item.bool("enabled", True),
    }
    if item.has("rates"):
        rates = _Item(item.data["rates"] or {}, f"{item.path}.rates", {r.removesuffix("_usd_per_mtok") for r in
                                                                       RATE_FIELDS})
        for r in RATE_FIELDS:
            fields[r] = rates.rate(r.removesuffix("_usd_per_mtok"))
    connection = org.connections.filter(name=name).first()
    with _guard(item.path):
        if connection is None:
            create_connection(organization=org, actor=APPLY, name=name, secret=secret or "", **fields)
            result.changes.append(Change("create", "connection", label))
        else:
            changes = update_connection(connection=connection, actor=APPLY, secret=secret, **fields)
            _record(result, "connection", label, changes)


def _apply_route(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    targets = []
    for j, t in enumerate(item.list("targets")):
        target = _Item(t, f"{item.path}.targets[{j}]", {"connection", "model"}, {"connection", "model"})
        connection = Connection.objects.filter(organization=org, name=target.str("connection")).first()
        if connection is None:
            raise ApplyError(f"{target.path}.connection",
                             f"no connection {target.str('connection')!r} (declare it under connections)")
        with _guard(target.path):
            targets.append((connection, find_model(target.str("model") or "")))
    existed = org.routes.filter(name=name).exists()
    with _guard(item.path):
        _, changed = set_route(organization=org, name=name, targets=targets, actor=APPLY,
                               default_max_output_tokens=item.data.get("default_max_output_tokens"))
    if changed:
        result.changes.append(Change("update" if existed else "create", "route", f"{org.slug}/{name}",
                                     {"targets": ["(previous)", " → ".join(f"{c.name}:{m}" for c, m in targets)]}
                                     if existed else {}))


def find_subjects(org: Organization, item: _Item) -> dict[str, Any]:
    """The subjects an item names (budgets, rate limits): project by slug, member by email, key
    by name, end customer as project/external_id; each must be declared in the organization."""
    subject: dict[str, Any] = {}
    if item.has("project"):
        subject["project"] = _find_project(org, item.str("project"), f"{item.path}.project")
    if item.has("member"):
        subject["member"] = _find_member(org, item.str("member"), f"{item.path}.member")
    if item.has("key"):
        key = _unique(ApiKey.objects.filter(organization=org, name=item.str("key")), item.path, "keys")
        if key is None:
            raise ApplyError(f"{item.path}.key", f"no key {item.str('key')!r} (declare it under keys)")
        subject["api_key"] = key
    if item.has("end_customer"):
        project_slug, _, external_id = (item.str("end_customer") or "").partition("/")
        customer = EndCustomer.objects.filter(project__organization=org, project__slug=project_slug,
                                              external_id=external_id).first()
        if customer is None:
            raise ApplyError(f"{item.path}.end_customer",
                             "write project/external_id of a declared end customer")
        subject["end_customer"] = customer
    return subject


def _apply_budget(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    scope = item.str("scope") or ""
    subject = find_subjects(org, item)
    if item.has("run"):
        subject["run_id"] = item.str("run")
    fields: dict[str, Any] = {
        "period": item.str("period", "month"),
        "timezone": item.str("timezone", "UTC"),
        "mode": item.str("mode", "block"),
        "amount_nano": item.usd("amount_usd"),
    }
    if item.has("thresholds"):
        fields["thresholds"] = item.list("thresholds")
    if item.has("recipients"):
        fields["recipients"] = item.list("recipients")
    budget = _unique(Budget.objects.filter(organization=org, name=name).order_by("id"), item.path, "budgets")
    with _guard(item.path):
        if budget is None:
            create_budget(organization=org, actor=APPLY, name=name, scope=scope, **subject, **fields)
            result.changes.append(Change("create", "budget", label))
        else:
            _record(result, "budget", label,
                    update_budget(budget=budget, actor=APPLY, scope=scope, **{**_UNNAMED, **subject},
                                  **fields))


# Subject fields the file leaves out are "not named", so moving a budget shows up as an error.
_UNNAMED = {"project": None, "member": None, "api_key": None, "end_customer": None, "run_id": None}
