"""The tenant's traffic limits, checked just before admission so a limited request reserves
nothing: its organization's and connections' upstream concurrency in this process, then its
rate limits (requests and tokens per minute)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from gateway.admission.routing import lookups
from gateway.upstream.transport import in_process, slots
from ratelimits.models import RateLimit
from ratelimits.services import enforce_rate_limits, matching_limits
from tenants.models import ApiKey, EndCustomer

if TYPE_CHECKING:
    from gateway.admission.routing import Target


def enforce_limits(*, key: ApiKey, customer: EndCustomer | None, tokens: int, targets: Sequence[Target]) -> None:
    """Raise UpstreamBusy or RateLimited (both 429 with Retry-After), or return.

    The concurrency check is a pre-check (unlocked): a request it lets through can still find
    the slot taken when it calls upstream, and is then refused there, its reservation released
    at once. Checked first so a tenant refused for concurrency does not use up its rate."""
    busy = slots.full(
        organization_id=key.organization_id,
        # An in-process provider takes no upstream slot (gateway/upstream/transport.py).
        connection_ids=[t.connection.id for t in targets if in_process(t.connection.kind) is None],
    )
    if busy is not None:
        raise busy
    enforce_rate_limits(key=key, customer=customer, tokens=tokens, found=_limits_of(key, customer))


def _limits_of(key: ApiKey, customer: EndCustomer | None) -> list[RateLimit]:
    """The rate limits over this key (and customer), from the process's lookup cache like keys
    and routes (CAPGATE["LOOKUP_CACHE_SECONDS"]): a round trip per request saved. A new or
    changed limit applies within that many seconds. Rate limits shape traffic; no cap depends on
    them (admission decides every cap in the database)."""
    cache_key = ("rate_limits", key.id, customer.id if customer is not None else None)
    found = cast(list[RateLimit] | None, lookups.get(cache_key))
    if found is None:
        token = lookups.token()
        found = matching_limits(key=key, customer=customer)
        lookups.put(cache_key, found, token, organization_id=key.organization_id)
    return found
