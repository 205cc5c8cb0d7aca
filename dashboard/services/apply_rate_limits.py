"""`manage.py apply`: an organization's `rate_limits`, matched by name like budgets.

    rate_limits:
      - {name: per-key, scope: key, key: ci, requests_per_minute: 600, tokens_per_minute: 2000000}
      - {name: whole-org, scope: organization, requests_per_minute: 6000}
"""

from __future__ import annotations

from typing import Any

from dashboard.services.apply import (
    APPLY,
    ApplyError,
    ApplyResult,
    Change,
    _guard,
    _Item,
    _record,
    _unique,
    find_subjects,
)
from ratelimits.models import RateLimit
from ratelimits.services import create_rate_limit, update_rate_limit
from tenants.models import Organization

FIELDS = {"name", "scope", "project", "key", "end_customer", "requests_per_minute", "tokens_per_minute"}


def _per_minute(item: _Item, key: str) -> int | None:
    value = item.data.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ApplyError(f"{item.path}.{key}", "a whole number per minute, or leave it out")
    return value


def apply_rate_limit(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    subject: dict[str, Any] = {"project": None, "api_key": None, "end_customer": None, **find_subjects(org, item)}
    fields = {"requests_per_minute": _per_minute(item, "requests_per_minute"),
              "tokens_per_minute": _per_minute(item, "tokens_per_minute")}
    limit = _unique(RateLimit.objects.filter(organization=org, name=name).order_by("id"), item.path, "rate_limits")
    with _guard(item.path):
        if limit is None:
            create_rate_limit(organization=org, actor=APPLY, name=name, scope=item.str("scope") or "",
                              **{k: v for k, v in subject.items() if v is not None}, **fields)
            result.changes.append(Change("create", "rate limit", label))
        else:
            _record(result, "rate limit", label,
                    update_rate_limit(limit=limit, actor=APPLY, scope=item.str("scope") or "", **subject, **fields))
