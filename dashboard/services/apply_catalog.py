"""`manage.py apply`: list prices, and an organization's connections and routes, each item
checked by the API's serializer (PriceSerializer, ConnectionSerializer, RouteSerializer) before
its catalog service runs.

    prices:
      - {model: openai/gpt-4o, input_usd_per_mtok: "2.50", output_usd_per_mtok: "10", tokenizer: o200k_base}
    connections:
      - {name: oa, kind: openai, secret_env: OPENAI_KEY, rates: {input: "2", output: "8"}}
    routes:
      - {name: gpt-4o, targets: [{connection: oa, model: openai/gpt-4o}], default_max_output_tokens: 4096}
"""

from __future__ import annotations

import os
from typing import Any

from catalog.api import ConnectionSerializer, RouteSerializer
from catalog.fields import PriceSerializer
from catalog.services import (
    MODEL_PRICE_FIELDS,
    RATE_FIELDS,
    create_connection,
    find_model,
    set_model_price,
    set_route,
    update_connection,
)
from core.errors import InvalidChange
from dashboard.services.apply import (
    APPLY,
    ApplyError,
    ApplyResult,
    Change,
    Problem,
    _guard,
    _Item,
    _record,
    validated,
)
from tenants.models import Organization

PRICE_FIELDS = {"model", *MODEL_PRICE_FIELDS}  # what set_model_price takes
CONNECTION_FIELDS = {"name", "kind", "base_url", "secret", "secret_env", "rates", "options", "enabled"}
ROUTE_FIELDS = {"name", "targets", "default_max_output_tokens"}
# A connection's rates are a mapping in the file (`rates: {input: "2"}`), four fields in the API.
_RATE_NAMES = {rate: f"rates.{rate.removesuffix('_usd_per_mtok')}" for rate in RATE_FIELDS}


def apply_price(item: _Item, result: ApplyResult) -> None:
    ref = item.str("model") or ""
    fields = validated(item, PriceSerializer, {k: v for k, v in item.data.items() if k != "model"})
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


def apply_connection(org: Organization, item: _Item, result: ApplyResult) -> None:
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
    data: dict[str, Any] = {
        "name": name,
        "kind": item.data.get("kind"),
        "base_url": item.data.get("base_url") or "",
        "options": item.data.get("options") or {},
        "enabled": item.data.get("enabled", True),
    }
    if secret is not None:
        data["secret"] = secret
    problems: list[Problem] = []
    if item.has("rates"):  # named: all four are set (absent: null, the list price)
        rates = _Item(
            item.data["rates"] or {}, f"{item.path}.rates", {r.removesuffix("_usd_per_mtok") for r in RATE_FIELDS}
        )
        problems += rates.problems
        for rate in RATE_FIELDS:
            data[rate] = rates.data.get(rate.removesuffix("_usd_per_mtok"))
    fields = validated(item, ConnectionSerializer, data, organization=org, names=_RATE_NAMES, problems=problems)
    connection = org.connections.filter(name=name).first()
    with _guard(item.path):
        if connection is None:
            create_connection(organization=org, actor=APPLY, secret=fields.pop("secret", ""), **fields)
            result.changes.append(Change("create", "connection", label))
        else:
            del fields["name"]
            changes = update_connection(connection=connection, actor=APPLY, secret=fields.pop("secret", None), **fields)
            _record(result, "connection", label, changes)


def apply_route(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    problems: list[Problem] = []
    targets = item.data.get("targets")
    if isinstance(targets, list):
        for j, target in enumerate(targets):
            if isinstance(target, dict):  # the serializer reports a target that is not a mapping
                problems += _Item(target, f"{item.path}.targets[{j}]", {"connection", "model"}).problems
    data = {"name": name, "targets": targets, "default_max_output_tokens": item.data.get("default_max_output_tokens")}
    fields = validated(item, RouteSerializer, data, organization=org, problems=problems)
    pairs = [(t["connection"], t["model"]) for t in fields["targets"]]
    existed = org.routes.filter(name=name).exists()
    with _guard(item.path):
        _, changed = set_route(
            organization=org,
            name=name,
            targets=pairs,
            actor=APPLY,
            default_max_output_tokens=fields.get("default_max_output_tokens"),
        )
    if changed:
        result.changes.append(
            Change(
                "update" if existed else "create",
                "route",
                f"{org.slug}/{name}",
                {"targets": ["(previous)", " → ".join(f"{c.name}:{m}" for c, m in pairs)]} if existed else {},
            )
        )
