"""Which addresses a tenant's connection may reach: public ones, and the operator's networks.

Used when a base URL is saved (an IP literal or localhost is refused at once, with a clear error)
and by the gateway's upstream transport at connect time, on every address a name resolves to
(gateway/upstream/transport.py), where DNS rebinding cannot get past it."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@lru_cache(maxsize=8)
def _networks(spec: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(s.strip(), strict=False) for s in spec if s.strip())


def allowed_networks() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The operator's exceptions (environment only, never tenant-editable)."""
    return _networks(tuple(settings.CAPGATE["UPSTREAM_ALLOWED_NETWORKS"]))


def _embedded_v4(ip: Address) -> ipaddress.IPv4Address | None:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return None


def refusal_reason(address: str) -> str | None:
    """Why an upstream may not dial this address, or None if it may.

    Public means `is_global` and none of the special kinds below; that excludes loopback,
    RFC 1918 and ULA private ranges, link-local (169.254.169.254 and other metadata services),
    CGNAT 100.64/10 (and 100.100.100.200), multicast, reserved and unspecified addresses, and
    IPv6 forms that embed such an IPv4 address (mapped, 6to4, Teredo)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if any(ip in net for net in allowed_networks()):
        return None
    for candidate in (_embedded_v4(ip), ip):  # the embedded IPv4 names the real destination
        if candidate is None:
            continue
        for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
            if getattr(candidate, f"is_{kind}"):
                return kind.replace("_", "-")
        if not candidate.is_global:
            return "not public"
    return None
