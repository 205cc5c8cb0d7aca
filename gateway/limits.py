"""The tenant's traffic limits, checked just before admission so a limited request reserves
nothing: its organization's and connections' upstream concurrency in this process, then its
rate limits (requests and tokens per minute)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.upstream import slots
from ratelimits.services import enforce_rate_limits
from tenants.models import ApiKey, EndCustomer

if TYPE_CHECKING:
    from gateway.routing import Target


def enforce_limits(*, key: ApiKey, customer: EndCustomer | None, tokens: int, targets: Sequence[Target]) -> None:
    """Raise UpstreamBusy or RateLimited (both 429 with Retry-After), or return.

    The concurrency check is a pre-check (unlocked): a request it lets through can still find
    the slot taken when it calls upstream, and is then refused there, its reservation released
    at once. Checked first so a tenant refused for concurrency does not use up its rate."""
    busy = slots.full(organization_id=key.organization_id,
                      connection_ids=[t.connection.id for t in targets if t.connection.kind != "echo"])
    if busy is not None:
        raise busy
    enforce_rate_limits(key=key, customer=customer, tokens=tokens)
