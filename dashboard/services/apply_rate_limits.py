"""`manage.py apply`: an organization's `rate_limits`, matched by name like budgets, each checked
by the API's RateLimitSerializer before create_rate_limit / update_rate_limit run.

    rate_limits:
      - {name: per-key, scope: key, key: ci, requests_per_minute: 600, tokens_per_minute: 2000000}
      - {name: whole-org, scope: organization, requests_per_minute: 6000}
"""

from __future__ import annotations

from typing import Any

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
from ratelimits.api import RateLimitSerializer
from ratelimits.models import RateLimit
from ratelimits.services import create_rate_limit, update_rate_limit
from tenants.models import Organization

FIELDS = {"name", "scope", "project", "key", "end_customer", "requests_per_minute", "tokens_per_minute"}
_SUBJECTS = ("project", "api_key", "end_customer")


def apply_rate_limit(org: Organization, item: _Item, result: ApplyResult) -> None:
    name = item.str("name") or ""
    label = f"{org.slug}/{name}"
    subject, problems = subjects_of(org, item)
    data: dict[str, Any] = {
        "name": name,
        "scope": item.data.get("scope"),
        # Left out: none (a declared limit is exactly what the file says).
        "requests_per_minute": item.data.get("requests_per_minute"),
        "tokens_per_minute": item.data.get("tokens_per_minute"),
        **{field: pk(obj) for field, obj in subject.items()},
    }
    fields = validated(item, RateLimitSerializer, data, organization=org, names={"api_key": "key"}, problems=problems)
    scope = fields.pop("scope")
    named = {field: fields.pop(field, None) for field in _SUBJECTS}
    limit = _unique(RateLimit.objects.filter(organization=org, name=name).order_by("id"), item.path, "rate_limits")
    with _guard(item.path):
        if limit is None:
            create_rate_limit(
                organization=org,
                actor=APPLY,
                name=name,
                scope=scope,
                **{k: v for k, v in named.items() if v is not None},
                **{k: v for k, v in fields.items() if k != "name"},
            )
            result.changes.append(Change("create", "rate limit", label))
        else:
            _record(
                result,
                "rate limit",
                label,
                update_rate_limit(
                    limit=limit, actor=APPLY, scope=scope, **named, **{k: v for k, v in fields.items() if k != "name"}
                ),
            )
