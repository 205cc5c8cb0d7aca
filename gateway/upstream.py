"""The gateway's reach into the network: which addresses upstream calls may dial, and how much
upstream capacity one tenant may hold (docs/security.md, "Upstream destinations/capacity").

- Destinations: a connection's host is resolved at connect time, every resolved address is
  checked, and the socket is opened to the checked address itself — so a name that answers a
  public address to one lookup and 127.0.0.1 to the next (DNS rebinding) cannot get past it.
  Only public addresses are allowed, unless the operator's CAPGATE_UPSTREAM_ALLOWED_NETWORKS
  names the network (self-hosted models). Redirects are never followed.
- Capacity: each gateway process has one bounded set of upstream connections; a slot is taken
  per in-flight upstream call, per connection and per organization, without waiting. A tenant
  over its share gets 429 at once instead of queueing in front of everyone else.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterable

import httpcore
import httpx
from django.conf import settings

from catalog.destinations import allowed_networks, refusal_reason
from config.errors import CapgateError

CLIENT_SHARDS = 8
EXTENSION = "capgate"  # request extension carrying (organization_id, connection_id)


# --- destinations ------------------------------------------------------------------------------


class DestinationRefused(httpcore.ConnectError):
    """The upstream host resolves to an address tenants may not reach. Raised before any socket
    is opened, so nothing was sent: httpx reports it as a ConnectError (not billed)."""


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (an IP literal resolves to itself)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Tests replace this with a stub resolver (DNS rebinding); looked up at each connect.
resolve: Callable[[str, int], typing.Awaitable[list[str]]] = system_resolve


def check_addresses(host: str, addresses: Iterable[str]) -> list[str]:
    """All of a name's addresses must be allowed: a name that mixes public and internal
    answers is refused outright rather than dialled on whichever comes first."""
    addresses = list(addresses)
    if not addresses:
        raise DestinationRefused(f"upstream host {host} did not resolve")
    for address in addresses:
        reason = refusal_reason(address)
        if reason is not None:
            raise DestinationRefused(
                f"upstream destination {host} ({address}) is not allowed: {reason} address. "
                "Connections may only reach public addresses unless the operator allows the network "
                "(CAPGATE_UPSTREAM_ALLOWED_NETWORKS)."
            )
    return addresses


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving and checking the host itself and dialling the
    checked address (TLS still verifies the original host name: httpcore passes it as SNI)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None):
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[typing.Any] | None = None) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = check_addresses(host, await resolve(host, port))
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"resolving {host} failed: {exc}") from None
        last: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[typing.Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise DestinationRefused("unix sockets are not an upstream destination")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


# --- capacity ----------------------------------------------------------------------------------


class UpstreamBusy(CapgateError):
    """A tenant's share of upstream capacity is in use. 429 with Retry-After; not charged."""

    status = 429
    type = "rate_limit_error"
    retry_after = 1

    def __init__(self, message: str, *, code: str):
        super().__init__(message, code=code)
        self.limit_name = code


class Slots:
    """In-flight upstream calls per connection and per organization, in this process.

    Counters under a plain lock (not asyncio primitives) so the admission thread can pre-check
    them and the event loop can take them; taking never waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_connection: dict[int, int] = {}
        self.by_organization: dict[int, int] = {}

    @staticmethod
    def limits() -> tuple[int, int]:
        c = settings.CAPGATE
        return c["UPSTREAM_MAX_PER_CONNECTION"], c["UPSTREAM_MAX_PER_ORGANIZATION"]

    def full(self, *, organization_id: int, connection_ids: Iterable[int]) -> UpstreamBusy | None:
        """The limit that leaves no room (an unlocked pre-check, before admission)."""
        per_conn, per_org = self.limits()
        if self.by_organization.get(organization_id, 0) >= per_org:
            return UpstreamBusy(f"This organization already has {per_org} upstream calls in flight on this "
                                "gateway; retry shortly.", code="organization_concurrency_limit")
        ids = list(connection_ids)
        if ids and all(self.by_connection.get(i, 0) >= per_conn for i in ids):
            return UpstreamBusy(f"Every connection serving this model already has {per_conn} upstream calls in "
                                "flight on this gateway; retry shortly.", code="connection_concurrency_limit")
        return None

    def take(self, *, organization_id: int, connection_id: int) -> None:
        per_conn, per_org = self.limits()
        with self._lock:
            if self.by_organization.get(organization_id, 0) >= per_org:
                raise UpstreamBusy(f"This organization already has {per_org} upstream calls in flight on this "
                                   "gateway; retry shortly.", code="organization_concurrency_limit")
            if self.by_connection.get(connection_id, 0) >= per_conn:
                raise UpstreamBusy(f"This connection already has {per_conn} upstream calls in flight on this "
                                   "gateway; retry shortly.", code="connection_concurrency_limit")
            self.by_organization[organization_id] = self.by_organization.get(organization_id, 0) + 1
            self.by_connection[connection_id] = self.by_connection.get(connection_id, 0) + 1

    def give_back(self, *, organization_id: int, connection_id: int) -> None:
        with self._lock:
            for counts, key in ((self.by_organization, organization_id), (self.by_connection, connection_id)):
                left = counts.get(key, 0) - 1
                if left > 0:
                    counts[key] = left
                else:
                    counts.pop(key, None)


slots = Slots()


def tag(*, organization_id: int, connection_id: int) -> dict[str, typing.Any]:
    """Request extensions naming whose slot an upstream call takes."""
    return {EXTENSION: (organization_id, connection_id)}


class _Releasing(httpx.AsyncByteStream):
    """Holds the call's slot until the response is closed (for a stream: until it ends)."""

    def __init__(self, inner: typing.Any, release: Callable[[], None]):
        self.inner = inner
        self.release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.release()


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a GuardedBackend, taking the caller's capacity slot for the
    life of each response and bounding the wait for its first byte."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext,
                 backend: httpcore.AsyncNetworkBackend | None = None):
        super().__init__(verify=ssl_context, limits=limits, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend or GuardedBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        owner = request.extensions.get(EXTENSION)
        released = False

        def release() -> None:
            nonlocal released
            if owner is not None and not released:
                released = True
                slots.give_back(organization_id=owner[0], connection_id=owner[1])

        if owner is not None:
            slots.take(organization_id=owner[0], connection_id=owner[1])
        first_byte = settings.CAPGATE["UPSTREAM_FIRST_BYTE_TIMEOUT"]
        sent = time.monotonic()
        try:
            async with asyncio.timeout(first_byte):
                response = await super().handle_async_request(request)
        except TimeoutError:
            release()
            timeout = httpx.ReadTimeout(f"no response within the first-byte timeout ({first_byte:g} s)",
                                        request=request)
            self._observe(owner, sent, error=timeout)
            raise timeout from None
        except BaseException as exc:
            release()
            if isinstance(exc, Exception):
                self._observe(owner, sent, error=exc)
            raise
        self._observe(owner, sent, status=response.status_code)
        response.stream = _Releasing(response.stream, release)
        return response

    @staticmethod
    def _observe(owner: tuple[int, int] | None, sent: float, *, status: int | None = None,
                 error: BaseException | None = None) -> None:
        if owner is not None:  # a tenant's upstream call (not, say, an alert webhook)
            from gateway import metrics

            metrics.observe_upstream(connection_id=owner[1], seconds=time.monotonic() - sent, status=status,
                                     error=error)


_ssl_context: ssl.SSLContext | None = None


def new_client() -> httpx.AsyncClient:
    """One upstream client shard: its share of the process's connections, the guarded
    transport, redirects off, and environment proxies ignored (a proxy would dial for us,
    past the address check)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    c = settings.CAPGATE
    total = c["UPSTREAM_MAX_CONNECTIONS"]
    limits = httpx.Limits(max_connections=max(1, total // CLIENT_SHARDS),
                          max_keepalive_connections=max(1, total // 10 // CLIENT_SHARDS))
    timeout = httpx.Timeout(connect=c["UPSTREAM_CONNECT_TIMEOUT"], read=c["UPSTREAM_READ_TIMEOUT"], write=30.0,
                            pool=c["UPSTREAM_POOL_TIMEOUT"])
    return httpx.AsyncClient(transport=GuardedTransport(limits=limits, ssl_context=_ssl_context), timeout=timeout,
                             follow_redirects=False, trust_env=False)


__all__ = ["allowed_networks", "refusal_reason", "resolve", "slots", "new_client"]
