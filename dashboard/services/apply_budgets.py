"""`manage.py apply`: an organization's `budgets`, matched by name, each checked by the API's
BudgetSerializer before create_budget / update_budget run.

    budgets:
      - {name: monthly, scope: organization, amount_usd: "500", period: month, mode: block}
      - {name: ci daily, scope: key, key: ci, amount_usd: "5", period: day, thresholds: [80, 100]}
"""

from __future__ import annotations

from typing import Any

from budgets.api import BudgetSerializer
from budgets.services import create_budget, update_budget
from dashboard.services.apply import (
    APPLY,
    ApplyResult,
    Change,
    _guard,
    _Item,
    _record,
    _unique,
    pk,
    subjects_of,
    validated,
)
from ledger.models import Budget
from tenants.models import Organization

BUDGET_FIELDS = {
    "name",
    "scope",
    "project",
    "member",
    "key",
    "end_customer",
    "run",
    "period",
    "timezone",
    "mode",
    "amount_usd",
    "thresholds",
    "recipients",
}
# The file's names for the API's fields, where they differ.
_NAMES = {"api_key": "key", "run_id": "run"}
# Subject fields the file leaves out are "not named", so moving a budget shows up as an error.
_UNNAMED = {"project": None, "member": None, "api_key": None, "end_customer": None, "run_id": None}


def apply_budget(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    subject, problems = subjects_of(org, item)
    data: dict[str, Any] = {
        "name": name,
        "scope": item.data.get("scope"),
        "period": item.data.get("period", "month"),
        "timezone": item.data.get("timezone", "UTC"),
        "mode": item.data.get("mode", "block"),
        "amount_usd": item.data.get("amount_usd"),
        **{field: pk(obj) for field, obj in subject.items()},
    }
    for field in ("thresholds", "recipients"):
        if item.has(field):
            data[field] = item.data[field]
    if item.has("run"):
        data["run_id"] = item.data["run"]
    fields = validated(item, BudgetSerializer, data, organization=org, names=_NAMES, problems=problems)
    budget = _unique(Budget.objects.filter(organization=org, name=name).order_by("id"), item.path, "budgets")
    with _guard(item.path):
        if budget is None:
            create_budget(organization=org, actor=APPLY, **fields)
            result.changes.append(Change("create", "budget", label))
        else:
            _record(result, "budget", label, update_budget(budget=budget, actor=APPLY, **{**_UNNAMED, **fields}))
