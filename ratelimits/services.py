"""Rate limits: declare them (validated, audited) and enforce them on the gateway's path.

Enforcement uses the `limits` library's sliding-window counter on Redis, shared by every gateway
process: two counters per limit and minute, so a tokens-per-minute hit of 100,000 costs one
INCRBY, not 100,000 list entries (the moving-window strategy's cost).

Redis down: rate limits are traffic shaping, not money. Every cap is decided in PostgreSQL by
admission, so it stays exact either way; the limits fall back to counters in this process's
memory (each process then allows the full rate on its own) and go back to Redis as soon as it
answers. Refusing every request because the counter store is down would turn a Redis outage
into a gateway outage.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.errors import StorageError
from limits.storage import MemoryStorage, storage_from_string
from limits.strategies import RateLimiter, SlidingWindowCounterRateLimiter

from core.errors import CapgateError, InvalidChange
from ratelimits.models import RateLimit
from tenants.audit import Actor, audit, save_changes, snapshot
from tenants.models import ApiKey, EndCustomer, Organization, Project

log = logging.getLogger("capgate.ratelimits")
SUBJECT_FIELDS = ("project", "api_key", "end_customer")
SUBJECT_FIELD = {"organization": None, "project": "project", "key": "api_key", "end_customer": "end_customer"}
EDITABLE_FIELDS = ("name", "requests_per_minute", "tokens_per_minute")
MAX_PER_MINUTE = 10**15
REDIS_RETRY_SECONDS = 5.0  # after a Redis error, count in memory this long before trying Redis again


class RateLimited(CapgateError):
    """A request over a rate limit: 429 with Retry-After and the limit's name; nothing reserved."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, *, limit: RateLimit, what: str, per_minute: int, retry_after: int):
        self.limit_name = limit.label
        self.retry_after = retry_after
        super().__init__(
            f"Rate limit '{limit.label}' ({limit.scope}): at most {per_minute:,} {what} per minute. "
            f"Retry after {retry_after} s.",
            code="rate_limit_exceeded",
        )


# --- declaring ---------------------------------------------------------------------------------


def _check_subject(organization: Organization, scope: str, subject: dict[str, Any]) -> None:
    if scope not in RateLimit.Scope.values:
        raise InvalidChange(f"Scope must be one of {', '.join(RateLimit.Scope.values)}.", param="scope")
    wanted = SUBJECT_FIELD[scope]
    for field in SUBJECT_FIELDS:
        value = subject.get(field)
        if field == wanted and value is None:
            raise InvalidChange(f"A {scope} rate limit names its {field.replace('_', ' ')}.", param=field)
        if field != wanted and value is not None:
            raise InvalidChange(f"A {scope} rate limit does not name a {field.replace('_', ' ')}.", param=field)
    value = subject.get(wanted) if wanted else None
    owner = (
        value.project.organization_id
        if isinstance(value, EndCustomer)
        else value.organization_id
        if isinstance(value, Project | ApiKey)
        else organization.id
    )
    if owner != organization.id:
        assert wanted is not None
        raise InvalidChange(f"No such {wanted.replace('_', ' ')}.", param=wanted)


def _check_fields(fields: dict[str, Any], current: RateLimit | None = None) -> None:
    for name in ("requests_per_minute", "tokens_per_minute"):
        if name in fields:
            value = fields[name]
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PER_MINUTE
            ):
                raise InvalidChange(f"A whole number from 1 to {MAX_PER_MINUTE:,}, or empty.", param=name)
    rpm = fields.get("requests_per_minute", current.requests_per_minute if current else None)
    tpm = fields.get("tokens_per_minute", current.tokens_per_minute if current else None)
    if rpm is None and tpm is None:
        raise InvalidChange("Set requests per minute, tokens per minute, or both.", param="requests_per_minute")
    if len(str(fields.get("name") or "")) > 200:
        raise InvalidChange("At most 200 characters.", param="name")


def create_rate_limit(*, organization: Organization, actor: Actor, scope: str, **fields: Any) -> RateLimit:
    subject = {f: fields.pop(f, None) for f in SUBJECT_FIELDS}
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
    _check_subject(organization, scope, subject)
    _check_fields(fields)
    limit = RateLimit.objects.create(
        organization=organization, scope=scope, **{k: v for k, v in subject.items() if v is not None}, **fields
    )
    audit(
        organization=organization,
        actor=actor,
        action="create",
        obj=limit,
        changes={k: [None, v] for k, v in snapshot(limit, ("scope", *EDITABLE_FIELDS)).items() if v not in (None, "")},
    )
    return limit


def update_rate_limit(*, limit: RateLimit, actor: Actor, **fields: Any) -> dict[str, list[Any]]:
    """Change the name and the rates; scope and subject are fixed once created."""
    for name in set(fields) & {"scope", *SUBJECT_FIELDS}:
        current = limit.scope if name == "scope" else getattr(limit, name)
        if fields.pop(name) != current:
            raise InvalidChange(
                "Scope and subject are fixed once created; create a new rate limit instead.", param=name
            )
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
    _check_fields(fields, current=limit)
    return save_changes(obj=limit, organization=limit.organization, actor=actor, fields=fields)


def delete_rate_limit(*, limit: RateLimit, actor: Actor) -> None:
    audit(organization=limit.organization, actor=actor, action="delete", obj=limit)
    limit.delete()


# --- enforcing ---------------------------------------------------------------------------------


@dataclass
class _Limiters:
    url: str
    shared: RateLimiter
    local: RateLimiter
    redis_failed_at: float = -math.inf


_limiters: _Limiters | None = None
_limiters_lock = threading.Lock()


def drop_idle_redis() -> None:
    """Close the shared limiter's idle Redis connections (gateway/upstream/runtime.py, periodically)."""
    current = _limiters
    storage = getattr(current.shared, "storage", None) if current is not None else None
    client = getattr(storage, "storage", None)
    if client is not None:
        client.connection_pool.disconnect(inuse_connections=False)


def limiters() -> _Limiters:
    """The shared (Redis) limiter and this process's in-memory fallback."""
    global _limiters
    url = settings.CAPGATE["RATE_LIMIT_STORAGE_URL"]
    current = _limiters
    if current is not None and current.url == url:
        return current
    # Under a lock: every admission thread must share one in-memory fallback, and `limits`
    # loads its storage's dependencies lazily, which is not thread-safe.
    with _limiters_lock:
        if _limiters is None or _limiters.url != url:
            # Short socket timeouts: a Redis that hangs must not hold admission threads.
            shared = storage_from_string(
                url,
                wrap_exceptions=True,
                socket_connect_timeout=0.25,
                socket_timeout=0.25,
                **settings.REDIS_SOCKET_HEALTH,
            )
            shared.dependencies["redis"]  # noqa: B018 — load it now, once
            _limiters = _Limiters(
                url=url,
                shared=SlidingWindowCounterRateLimiter(shared),
                local=SlidingWindowCounterRateLimiter(MemoryStorage()),
            )
        return _limiters


def matching_limits(*, key: ApiKey, customer: EndCustomer | None) -> list[RateLimit]:
    subject = (
        Q(scope="organization") | Q(scope="project", project_id=key.project_id) | Q(scope="key", api_key_id=key.id)
    )
    if customer is not None:
        subject |= Q(scope="end_customer", end_customer_id=customer.id)
    return list(RateLimit.objects.filter(subject, organization_id=key.organization_id).order_by("id"))


def _checks(limits_: list[RateLimit], tokens: int) -> list[tuple[RateLimit, RateLimitItem, str, int, str]]:
    out: list[tuple[RateLimit, RateLimitItem, str, int, str]] = []
    database = settings.DATABASES["default"]["NAME"]
    for limit in limits_:
        # A limit's counters are its own even where several databases share one Redis (tests).
        ident = f"{database}:{limit.pk}:{limit.created_at.timestamp():.6f}"
        if limit.requests_per_minute is not None:
            out.append(
                (
                    limit,
                    RateLimitItemPerMinute(limit.requests_per_minute, namespace="capgate-rpm"),
                    "requests",
                    1,
                    ident,
                )
            )
        if limit.tokens_per_minute is not None:
            out.append(
                (
                    limit,
                    RateLimitItemPerMinute(limit.tokens_per_minute, namespace="capgate-tpm"),
                    "tokens",
                    max(tokens, 0),
                    ident,
                )
            )
    return out


def _enforce(limiter: RateLimiter, checks: list[tuple[RateLimit, RateLimitItem, str, int, str]]) -> None:
    # Test every limit before counting on any, so a request refused by one limit is not counted
    # against the others. Between the test and the hit another process may take the last room;
    # the hit then refuses (a burst can overshoot a limit by at most the requests racing it).
    for limit, item, what, cost, ident in checks:
        if cost > item.amount or not limiter.test(item, ident, cost=cost):
            raise _refusal(limiter, limit, item, what, ident)
    for limit, item, what, cost, ident in checks:
        if not limiter.hit(item, ident, cost=cost):
            raise _refusal(limiter, limit, item, what, ident)


def _refusal(limiter: RateLimiter, limit: RateLimit, item: RateLimitItem, what: str, ident: str) -> RateLimited:
    reset_at = limiter.get_window_stats(item, ident).reset_time
    return RateLimited(
        limit=limit, what=what, per_minute=item.amount, retry_after=max(1, min(60, math.ceil(reset_at - time.time())))
    )


def enforce_rate_limits(
    *, key: ApiKey, customer: EndCustomer | None, tokens: int, found: list[RateLimit] | None = None
) -> None:
    """Count this request against every rate limit over its key, project, organization and
    end customer, or raise RateLimited (429) counting it against none. `tokens` is the request's
    bound: its input bound plus its output ceiling, as admission reserves it.

    1. Read the matching limits (none: done, no Redis round trip).
    2. Test each, then hit each, on Redis.
    3. Redis unreachable: the same on this process's memory, and Redis again after a few seconds.
    """
    if found is None:  # the gateway passes them from its lookup cache (gateway/admission/limits.py)
        found = matching_limits(key=key, customer=customer)
    if not found:
        return
    checks = _checks(found, tokens)
    lim = limiters()
    if time.monotonic() - lim.redis_failed_at > REDIS_RETRY_SECONDS:
        try:
            return _enforce(lim.shared, checks)
        except StorageError as exc:
            lim.redis_failed_at = time.monotonic()
            log.warning(
                "rate limits: Redis unavailable (%s); counting in this process until it is back", exc.storage_error
            )
    _enforce(lim.local, checks)


# --- new subjects per key ----------------------------------------------------------------------


class NewSubjectsLimited(CapgateError):
    """A first call over its key's limit on new runs or new end customers a minute: 429 with
    Retry-After; nothing created, nothing reserved."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, *, what: str, header: str, per_minute: int, retry_after: int):
        self.retry_after = retry_after
        super().__init__(
            f"This key named more than {per_minute:,} new {what} in a minute ({header}); "
            f"reuse one, or retry after {retry_after} s.",
            code=f"too_many_new_{what.replace(' ', '_')}",
        )


# (what, the header that names it, the setting with its per-key limit a minute)
_NEW_SUBJECTS = {
    "run": ("runs", "X-Capgate-Run", "NEW_RUNS_PER_KEY_PER_MINUTE"),
    "customer": ("end customers", "X-Capgate-Customer", "NEW_CUSTOMERS_PER_KEY_PER_MINUTE"),
}


def enforce_new_subjects(*, key: ApiKey, runs: int, customers: int) -> None:
    """Count a first call's new run (its budget to create) and new end customer against its
    key's limits a minute (CAPGATE_NEW_RUNS_PER_KEY_PER_MINUTE,
    CAPGATE_NEW_CUSTOMERS_PER_KEY_PER_MINUTE; 0: no limit), or raise NewSubjectsLimited counting
    it against neither. The same sliding-window counters as the declared rate limits, on Redis
    or, while it is down, in this process. Racing first calls of one subject each count (each
    found it new); a burst can overshoot by the calls racing the last room, as rate limits do.
    """
    database = settings.DATABASES["default"]["NAME"]
    checks: list[tuple[RateLimitItem, str, str, int, str]] = []
    for kind, count in (("run", runs), ("customer", customers)):
        what, header, setting = _NEW_SUBJECTS[kind]
        per_minute = int(settings.CAPGATE[setting])
        if count and per_minute > 0:
            item = RateLimitItemPerMinute(per_minute, namespace=f"capgate-new-{kind}")
            checks.append((item, what, header, count, f"{database}:{key.pk}"))
    if not checks:
        return
    lim = limiters()
    if time.monotonic() - lim.redis_failed_at > REDIS_RETRY_SECONDS:
        try:
            return _enforce_new(lim.shared, checks)
        except StorageError as exc:
            lim.redis_failed_at = time.monotonic()
            log.warning(
                "rate limits: Redis unavailable (%s); counting in this process until it is back", exc.storage_error
            )
    _enforce_new(lim.local, checks)


def _enforce_new(limiter: RateLimiter, checks: list[tuple[RateLimitItem, str, str, int, str]]) -> None:
    # Test both before counting on either, as _enforce does.
    for phase in ("test", "hit"):
        for item, what, header, cost, ident in checks:
            if not getattr(limiter, phase)(item, ident, cost=cost):
                reset_at = limiter.get_window_stats(item, ident).reset_time
                raise NewSubjectsLimited(
                    what=what,
                    header=header,
                    per_minute=item.amount,
                    retry_after=max(1, min(60, math.ceil(reset_at - time.time()))),
                )
