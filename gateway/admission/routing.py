"""Who is calling and where the call may go: the API key, the route's targets, and the
per-process cache that keeps both off the database on the hot path."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

from django.conf import settings
from django.utils import timezone

from catalog.models import Connection, Model, Route
from catalog.pricing import Rates, rates_for
from core.invalidation import freshness
from gateway import providers
from gateway.http.errors import GatewayError
from ledger.models import Reservation
from tenants.models import ApiKey, hash_key

# An endpoint whose requests gateway/translate/ can carry to targets of other formats: the
# formats, in the order a target serving several is sent the first of.
TRANSLATED: dict[str, tuple[str, ...]] = {
    "chat": ("messages", "converse", "gemini"),
    "messages": ("chat", "converse", "gemini"),
    "responses": ("messages",),
}


def target_format(kind: str, connection: Connection) -> str | None:
    """The format a target on `connection` is sent a request for endpoint `kind` in: the
    endpoint's own when its adapter serves it, else the first one it is translated to that the
    adapter serves, else None (it cannot serve it)."""
    served = providers.formats(connection)
    if kind in served:
        return kind
    return next((other for other in TRANSLATED.get(kind, ()) if other in served), None)


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


class _LookupCache:
    """The per-process cache of the hot path's lookups (keys, routes, rate limits, classifications).

    While this process is current (core/invalidation.py: its invalidation listener runs and a
    fence came back within the lease) an entry lives until a notice for its organization, or
    one for every organization, says a table it was read from changed — every write to those
    tables sends one from its transaction (gateway/migrations/0003) — or for MAX_AGE_SECONDS at
    most. Otherwise entries live CAPGATE["LOOKUP_CACHE_SECONDS"] (0: off), so a revoked or
    re-routed key is honoured within that many seconds. Budgets are cached apart, under a
    stricter rule (ledger/budget_cache.py).

    Each entry belongs to one organization (the key's, the route's). A notice `lookups:<id>`
    makes that organization's entries stale and leaves the others' alone, so one tenant's admin
    writes do not send every tenant's requests to the database; `lookups:*` (the price catalog,
    a truncate) makes every entry stale."""

    MAX_AGE_SECONDS = 300.0
    LIMIT = 10_000  # entries kept; past it the cache starts again empty

    def __init__(self) -> None:
        self._data: dict[object, tuple[float, int, int, object]] = {}  # key -> (put at, token, org, value)
        self._seq = 0  # notices handled
        self._all_at = 0  # the notice number of the newest one for every organization
        self._org_at: dict[int, int] = {}  # organization -> the notice number of its newest one
        freshness.subscribe("lookups", changed=self.changed, reset=self.clear)

    def token(self) -> int:
        """Take before reading what is to be `put`: a notice for its organization handled
        meanwhile makes it stale."""
        return self._seq

    def _stale_before(self, organization_id: int) -> int:
        return max(self._all_at, self._org_at.get(organization_id, 0))

    def get(self, key: object) -> object | None:
        hit = self._data.get(key)
        if hit is None or hit[1] < self._stale_before(hit[2]):
            return None
        age = time.monotonic() - hit[0]
        if age < (self.MAX_AGE_SECONDS if freshness.current() else settings.CAPGATE["LOOKUP_CACHE_SECONDS"]):
            return hit[3]
        return None

    def put(self, key: object, value: object, token: int, *, organization_id: int) -> None:
        """Keep `value`, read after `token` was taken, as `organization_id`'s. Kept with the token,
        not the notice count now, so a notice handled between the read and this put makes it
        stale even if it lands after this check."""
        if token < self._stale_before(organization_id):
            return  # read before a notice that arrived since: it may predate the write
        if freshness.current() or settings.CAPGATE["LOOKUP_CACHE_SECONDS"] > 0:
            if len(self._data) > self.LIMIT:
                self._data.clear()
            self._data[key] = (time.monotonic(), token, organization_id, value)

    def changed(self, rest: str) -> None:
        """A notice `lookups:<organization id>` or `lookups:*` (anything else counts as every
        organization: a notice never read as narrower than it is)."""
        self._seq += 1
        if rest.isdigit():
            self._org_at[int(rest)] = self._seq
        else:
            self._all_at = self._seq
            self._data.clear()
            self._org_at.clear()

    def clear(self) -> None:
        self.changed("*")


lookups = _LookupCache()


def authenticate(raw_key: str | None) -> ApiKey:
    if not raw_key:
        raise GatewayError(
            "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'.",
            code="invalid_api_key",
            status=401,
        )
    digest = hash_key(raw_key)
    key = cast(ApiKey | None, lookups.get(("key", digest)))
    if key is None:
        token = lookups.token()
        key = ApiKey.objects.select_related("organization", "project").filter(key_hash=digest).first()
        if key is not None:
            lookups.put(("key", digest), key, token, organization_id=key.organization_id)
    if key is None:
        raise GatewayError("Invalid API key.", code="invalid_api_key", status=401)
    if key.revoked_at is not None:
        raise GatewayError("This API key has been revoked.", code="revoked_api_key", status=401)
    if key.expires_at is not None and key.expires_at <= timezone.now():
        raise GatewayError("This API key has expired.", code="expired_api_key", status=401)
    return key


def resolve_route(*, key: ApiKey, name: str, kind: str, translated: bool = False) -> list[Target]:
    """The route's enabled targets that can serve endpoint `kind`, in failover order: of its own
    format, and with `translated` (the proxy, which translates) of the other formats too."""
    if not key.allows_model(name):
        raise GatewayError(
            f"This key may not call model '{name}'.",
            code="model_not_allowed",
            status=403,
            param="model",
        )
    cache_key = ("route", key.organization_id, name)
    routed = cast(list[Target] | None, lookups.get(cache_key))
    if routed is None:
        token = lookups.token()
        route = Route.objects.filter(organization_id=key.organization_id, name=name).first()
        if route is None:
            raise GatewayError(
                f"The model '{name}' does not exist or is not routed for this organization.",
                code="model_not_found",
                status=404,
                param="model",
            )
        routed = [
            Target(
                connection=t.connection,
                model=t.model,
                route_max_output=route.default_max_output_tokens,
            )
            for t in route.targets.select_related("connection", "model", "model__provider").order_by("position", "id")
        ]
        lookups.put(cache_key, routed, token, organization_id=key.organization_id)
    # Only kinds whose adapter serves this endpoint in its own wire format, or (when translation
    # is allowed) in the format it is translated to.
    targets = [
        t
        for t in routed
        if t.connection.enabled
        and (target_format(kind, t.connection) is not None if translated else kind in providers.formats(t.connection))
    ]
    if not targets:
        # A configuration error, not an outage: a 503 would read as "overloaded" and be retried.
        raise GatewayError(
            f"No enabled connection of a compatible kind serves '{name}' on this endpoint; add one to the "
            "route (or enable it).",
            code="no_compatible_connection",
            status=400,
            param="model",
        )
    return targets


def list_models(*, key: ApiKey) -> list[str]:
    names = Route.objects.filter(organization_id=key.organization_id).order_by("name").values_list("name", flat=True)
    return [n for n in names if key.allows_model(n)]


def settle_rates(*, reservation: Reservation) -> tuple[Target | None, Rates | None]:
    """The rates a reservation-API settle prices usage at: its route's first target."""
    route = Route.objects.filter(organization_id=reservation.organization_id, name=reservation.model).first()
    if route is None:
        return None, None
    target = route.targets.select_related("connection", "model").order_by("position", "id").first()
    if target is None:
        return None, None
    return Target(connection=target.connection, model=target.model), rates_for(
        model=target.model, connection=target.connection
    )
