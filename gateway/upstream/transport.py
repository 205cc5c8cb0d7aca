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
- In-process providers: a connection kind registered here (`register`) is answered by its own
  transport, in this process, through the same client and the same code path as any provider.
  It dials nothing and holds no network connection, so neither check above applies to it.
- A whole (not streamed) call (`post`) to a network provider goes from the same client's aiohttp
  session without building httpx's request and response (`GuardedTransport.post`): the same
  request on the wire, the same guards, the same errors. What that path cannot send exactly as
  httpx would goes through httpx (`GuardedTransport.direct` says which).
"""

from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import ipaddress
import itertools
import logging
import socket
import ssl
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
import aiohttp.abc
import httpx
import yarl
from django.conf import settings
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from catalog.destinations import allowed_networks, refusal_reason
from core.errors import CapgateError
from core.guards import Guards
from gateway.http import metrics

if typing.TYPE_CHECKING:
    from catalog.models import Connection

CLIENT_SHARDS = 1  # one aiohttp pool per process; httpcore needed several (see GuardedTransport)
EXTENSION = "capgate"  # request extension carrying (organization_id, connection_id)
CALL = "capgate.call"  # request extension carrying the call's `Call`
NO_BASE_URL = "http://upstream.invalid"
_httpx_log = logging.getLogger("httpx")

# Removal test: tests/gateway/test_upstream_cookies.py.
GUARDS = Guards(
    no_cookie_jar="no cookie an upstream answer sets is kept for the next upstream call",
)


# --- destinations ------------------------------------------------------------------------------


class DestinationRefused(httpx.ConnectError):
    """The upstream host resolves to an address tenants may not reach. Raised before any socket
    is opened, so nothing was sent: a ConnectError (not billed)."""


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


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


class GuardedResolver(aiohttp.abc.AbstractResolver):
    """aiohttp's resolver for upstream connections: resolves the host itself, checks every
    address, and hands aiohttp only checked addresses to dial (TLS still verifies the original
    host name: aiohttp passes it as SNI). IP literals never reach a resolver in aiohttp, so
    GuardedTransport checks those before sending."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        try:
            async with asyncio.timeout(settings.CAPGATE["UPSTREAM_CONNECT_TIMEOUT"]):
                found = await resolve(host, port)  # the module attribute, looked up at each connect
        except TimeoutError:
            raise DestinationUnreachable(f"resolving {host} timed out") from None
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": _family(address),
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in check_addresses(host, found)
        ]

    async def close(self) -> None:
        pass


class DestinationUnreachable(OSError):
    """Resolution failed or timed out: aiohttp reports it as a connect (DNS) error, not billed."""


def _check_literal(host: str) -> None:
    """aiohttp dials an IP literal without asking the resolver: check it here, before sending."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return
    check_addresses(host, [host])


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
            return UpstreamBusy(
                f"This organization already has {per_org} upstream calls in flight on this gateway; retry shortly.",
                code="organization_concurrency_limit",
            )
        ids = list(connection_ids)
        if ids and all(self.by_connection.get(i, 0) >= per_conn for i in ids):
            return UpstreamBusy(
                f"Every connection serving this model already has {per_conn} upstream calls in "
                "flight on this gateway; retry shortly.",
                code="connection_concurrency_limit",
            )
        return None

    def take(self, *, organization_id: int, connection_id: int) -> None:
        per_conn, per_org = self.limits()
        with self._lock:
            if self.by_organization.get(organization_id, 0) >= per_org:
                raise UpstreamBusy(
                    f"This organization already has {per_org} upstream calls in flight on this gateway; retry shortly.",
                    code="organization_concurrency_limit",
                )
            if self.by_connection.get(connection_id, 0) >= per_conn:
                raise UpstreamBusy(
                    f"This connection already has {per_conn} upstream calls in flight on this gateway; retry shortly.",
                    code="connection_concurrency_limit",
                )
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


@dataclass(frozen=True)
class Call:
    """What the gateway knows of an upstream call beyond its HTTP request. The network
    transport reads only whose slot it takes; an in-process provider answers from all of it."""

    connection: Connection
    # The caller's own request headers (an in-process provider may honour test knobs in them).
    client_headers: Mapping[str, str] = field(default_factory=dict)
    # The input bound admission sized the call by (bytes-based text tokens), 0 for a job call.
    input_tokens: int = 0


def tag(*, connection: Connection, client_headers: Mapping[str, str] | None = None, input_tokens: int = 0) -> dict:
    """Request extensions for an upstream call on `connection`: whose slot it takes, and the call."""
    return {
        EXTENSION: (connection.organization_id, connection.id),
        CALL: Call(connection=connection, client_headers=client_headers or {}, input_tokens=input_tokens),
    }


# --- in-process providers -----------------------------------------------------------------------


class InProcess(httpx.AsyncBaseTransport):
    """A provider answering in this process, for every connection of the kind it registered."""

    async def drop_idle(self) -> None:
        """Close the idle connections of its own stores (called periodically by the runtime)."""


_IN_PROCESS: dict[str, InProcess] = {}


def register(kind: str, provider: InProcess) -> None:
    """Answer every call on a connection of `kind` with `provider` (an app's ready(); once)."""
    _IN_PROCESS[kind] = provider


def in_process(kind: str) -> InProcess | None:
    return _IN_PROCESS.get(kind)


async def drop_idle_in_process() -> None:
    for provider in list(_IN_PROCESS.values()):
        await provider.drop_idle()


class _Releasing(httpx.AsyncByteStream):
    """Holds the call's slot until the response is closed (for a stream: until it ends)."""

    def __init__(self, inner: typing.Any, release: Callable[[], None]):
        self.inner = inner
        self.release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.inner:
                yield chunk
        except httpx.TransportError as exc:
            raise _mapped(exc) from exc

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.release()


def _mapped(exc: httpx.TransportError) -> httpx.TransportError:
    """The error as capgate bills it: only failures known to be before the request was sent
    are connect errors (not billed). httpx-aiohttp maps every aiohttp ClientConnectionError,
    including a server that dropped the connection after reading the request, to ConnectTimeout;
    that would release a call the provider may have billed, so we map from aiohttp's own error."""
    cause = exc.__cause__
    if isinstance(exc, DestinationRefused) or cause is None or not isinstance(cause, aiohttp.ClientError):
        return exc
    refused = getattr(cause, "os_error", None)
    if isinstance(refused, DestinationRefused):
        return refused
    message = str(cause) or type(cause).__name__
    if isinstance(cause, aiohttp.ClientConnectorError):  # DNS, refused, TLS handshake: nothing sent
        return httpx.ConnectError(message)
    if isinstance(cause, aiohttp.ConnectionTimeoutError):  # pool wait or connect
        return httpx.ConnectTimeout(message)
    if isinstance(cause, aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(cause, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message)
    return httpx.ReadError(message)  # after the request may have gone out: unknown outcome


def _raised(exc: Exception, *, remap: bool) -> Exception:
    """What the httpx path raises for aiohttp's `exc`: httpx-aiohttp's httpx error (or `exc`
    itself, where it maps none), remapped by `_mapped` where that path remaps it (sending and
    reading, not closing)."""
    try:
        with map_aiohttp_exceptions():
            raise exc
    except httpx.TransportError as mapped:
        return _mapped(mapped) if remap else mapped
    except Exception as other:
        return other


@dataclass(frozen=True, slots=True)
class Whole:
    """A whole upstream answer: its status and its body, decoded as httpx decodes it."""

    status_code: int
    content: bytes


@dataclass(frozen=True, slots=True)
class _Address:
    text: str  # the URL as httpx writes it
    url: yarl.URL  # that text as aiohttp parses it when httpx-aiohttp hands it over
    host: str  # httpx's `url.host`, which the literal check reads
    host_header: str  # httpx's Host header (`url.netloc`)


@functools.lru_cache(maxsize=1024)  # a pure function of the URL; a connection's URL repeats
def _address(url: str) -> _Address | None:
    """The URL as httpx would send it, or None for one left to httpx (not an absolute http(s)
    URL, or one httpx cannot read: it raises its own error)."""
    try:
        parsed = httpx.URL(url)
    except Exception:
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    text = str(parsed)
    return _Address(text=text, url=yarl.URL(text), host=parsed.host, host_header=parsed.netloc.decode("ascii"))


class GuardedTransport(httpx.AsyncBaseTransport):
    """httpx's API over aiohttp's connection pool (httpx-aiohttp, as the official SDKs offer):
    dials only checked addresses, takes the caller's capacity slot for the life of each
    response and bounds the wait for its first byte. httpcore's pool did per-request
    bookkeeping over every connection it held, which dominated the event loop at concurrency
    (docs/performance.md)."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext):
        self.limits = limits
        self.ssl_context = ssl_context
        self._inner = AiohttpTransport(client=self._session, limits=limits, trust_env=False)
        self._defaults: tuple[httpx.Headers, list[tuple[str, str]]] | None = None
        self._client_timeout: tuple[tuple, aiohttp.ClientTimeout] | None = None

    def _session(self) -> aiohttp.ClientSession:
        # Created on the first call, inside the event loop that uses it. No DNS cache: every
        # connect resolves and checks again. Environment proxies ignored (trust_env=False).
        connector = aiohttp.TCPConnector(
            limit=self.limits.max_connections or 0,
            limit_per_host=0,
            use_dns_cache=False,
            resolver=GuardedResolver(),
            ssl=self.ssl_context,
            keepalive_timeout=self.limits.keepalive_expiry or 15.0,
        )
        # No cookie jar: the session carries every tenant's calls, and a cookie one provider
        # answer set (an edge's session cookie) must not go out with the next call, whoever
        # it is for (GUARDS.no_cookie_jar).
        jar = aiohttp.DummyCookieJar() if GUARDS.no_cookie_jar else aiohttp.CookieJar(unsafe=True)
        return aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=False, cookie_jar=jar)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = request.extensions.get(CALL)
        local = in_process(call.connection.kind) if call is not None else None
        if local is not None:
            return await local.handle_async_request(request)
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
            _check_literal(request.url.host)
            async with asyncio.timeout(first_byte):
                try:
                    response = await self._inner.handle_async_request(request)
                except httpx.TransportError as exc:
                    raise _mapped(exc) from exc
        except TimeoutError:
            release()
            timeout = httpx.ReadTimeout(
                f"no response within the first-byte timeout ({first_byte:g} s)", request=request
            )
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

    async def post(
        self, client: httpx.AsyncClient, url: str, *, content: bytes, headers: Mapping[str, str], extensions: dict
    ) -> Whole:
        """A whole POST through `client` (this transport's own): for a network provider, straight
        from the aiohttp session with the request httpx would have sent (`direct`) and the same
        guards as `handle_async_request`: the address check, the capacity slot (held until the
        body is read), the first-byte timeout, the client's timeouts, and errors raised as the
        httpx types and messages that path raises (httpx-aiohttp's mapping, then `_mapped`)."""
        call = extensions.get(CALL)
        sent_as = self.direct(client, url, content, headers)
        if sent_as is None or (call is not None and in_process(call.connection.kind) is not None):
            response = await client.post(url, content=content, headers=headers, extensions=extensions)
            return Whole(response.status_code, response.content)
        address, merged = sent_as
        owner = extensions.get(EXTENSION)
        if owner is not None:
            slots.take(organization_id=owner[0], connection_id=owner[1])
        try:
            first_byte = settings.CAPGATE["UPSTREAM_FIRST_BYTE_TIMEOUT"]
            sent = time.monotonic()
            try:
                _check_literal(address.host)
                async with asyncio.timeout(first_byte):
                    try:
                        answer: aiohttp.ClientResponse = (
                            await self._aiohttp()
                            .request(
                                "POST",
                                address.url,
                                headers=merged,
                                data=content,
                                allow_redirects=False,
                                auto_decompress=False,
                                compress=False,
                                timeout=self._timeout(client),
                            )
                            .__aenter__()
                        )
                    except Exception as exc:
                        raise _raised(exc, remap=True) from None
            except TimeoutError:
                timeout = httpx.ReadTimeout(f"no response within the first-byte timeout ({first_byte:g} s)")
                self._observe(owner, sent, error=timeout)
                raise timeout from None
            except Exception as exc:
                self._observe(owner, sent, error=exc)
                raise
            self._observe(owner, sent, status=answer.status)
            if _httpx_log.isEnabledFor(logging.INFO):  # httpx's own line for each call, as it writes it
                reason = answer.reason or httpx.codes.get_reason_phrase(answer.status)
                _httpx_log.info(
                    'HTTP Request: %s %s "%s %d %s"', "POST", address.text, "HTTP/1.1", answer.status, reason
                )
            try:
                body = await answer.read()
            except Exception as exc:
                raise _raised(exc, remap=True) from None
            finally:
                try:
                    await answer.__aexit__(None, None, None)  # as httpx-aiohttp closes it
                except Exception as exc:
                    raise _raised(exc, remap=False) from None
            if "content-encoding" in answer.headers:
                # Decoded as httpx decodes it (gzip, deflate, br, zstd, several in a row, unknown ones not).
                body = httpx.Response(answer.status, headers=answer.raw_headers, content=body).content
            return Whole(answer.status, body)
        finally:
            if owner is not None:
                slots.give_back(organization_id=owner[0], connection_id=owner[1])

    def direct(
        self, client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str]
    ) -> tuple[_Address, dict[str, str]] | None:
        """Where and with which headers the direct path sends what httpx would send: httpx's URL
        and Host, the client's default headers overridden by the call's (as httpx merges them).
        None for what only httpx can send as it does: a relative or non-HTTP URL, an empty body,
        a header that is not ASCII text (httpx refuses it) or named twice in different cases
        (httpx joins the two)."""
        address = _address(url) if content else None
        if address is None:
            return None
        given: dict[str, str] = {}
        for name, value in headers.items():
            if not (isinstance(name, str) and isinstance(value, str) and name.isascii() and value.isascii()):
                return None
            key = name.lower()
            if key in given:
                return None
            given[key] = value
        defaults = self._defaults
        if defaults is None or defaults[0] is not client.headers:
            defaults = self._defaults = (client.headers, list(client.headers.items()))
        merged = {"host": address.host_header}
        for key, value in defaults[1]:
            if key not in given:
                merged[key] = value
        merged.update(given)
        merged["content-length"] = str(len(content))  # where and as httpx writes it
        return address, merged

    def _aiohttp(self) -> aiohttp.ClientSession:
        """The session httpx-aiohttp sends through (created on first use, as it creates it)."""
        if not isinstance(self._inner.client, aiohttp.ClientSession):
            self._inner.client = self._inner.get_client()
        return self._inner.client

    def _timeout(self, client: httpx.AsyncClient) -> aiohttp.ClientTimeout:
        """The client's timeouts as httpx-aiohttp passes them to aiohttp."""
        t = client.timeout
        key = (t.connect, t.read, t.pool)
        if self._client_timeout is None or self._client_timeout[0] != key:
            self._client_timeout = (
                key,
                aiohttp.ClientTimeout(sock_connect=t.connect, sock_read=t.read, connect=t.pool),
            )
        return self._client_timeout[1]

    @staticmethod
    def _observe(
        owner: tuple[int, int] | None, sent: float, *, status: int | None = None, error: BaseException | None = None
    ) -> None:
        if owner is not None:  # a tenant's upstream call (not, say, an alert webhook)
            metrics.observe_upstream(
                connection_id=owner[1], seconds=time.monotonic() - sent, status=status, error=error
            )


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
    limits = httpx.Limits(
        max_connections=max(1, total // CLIENT_SHARDS), max_keepalive_connections=max(1, total // 10 // CLIENT_SHARDS)
    )
    timeout = httpx.Timeout(
        connect=c["UPSTREAM_CONNECT_TIMEOUT"],
        read=c["UPSTREAM_READ_TIMEOUT"],
        write=30.0,
        pool=c["UPSTREAM_POOL_TIMEOUT"],
    )
    return httpx.AsyncClient(
        transport=GuardedTransport(limits=limits, ssl_context=_ssl_context),
        # A connection without a base URL (an in-process provider's) has a path only; httpx needs
        # a whole URL. This host is never dialled: .invalid never resolves (RFC 6761).
        base_url=NO_BASE_URL,
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        # httpx keeps the cookies answers set, per client, as aiohttp does per session: refused.
        cookies=_no_cookies() if GUARDS.no_cookie_jar else None,
    )


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that stores nothing: every domain is outside its allowed list."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


# The upstream client(s), per process: CLIENT_SHARDS pools spread round-robin (one aiohttp pool
# since httpcore's per-request pool bookkeeping was replaced, docs/performance.md). Each dials
# only allowed addresses and takes the caller's capacity slot.
_clients: list[httpx.AsyncClient] = []
_next_client = itertools.count()


def client() -> httpx.AsyncClient:
    """A pooled upstream client (one of a few shards, per process)."""
    if not _clients:
        _clients.extend(new_client() for _ in range(CLIENT_SHARDS))
    return _clients[next(_next_client) % len(_clients)]


async def post(url: str, *, content: bytes, headers: Mapping[str, str], extensions: dict) -> Whole:
    """A whole (not streamed) POST on a pooled client: its status and body. Through the
    client's guarded transport (`GuardedTransport.post`), or httpx's own `post` for a client
    with another transport."""
    c = client()
    guarded = getattr(c, "_transport", None)
    if isinstance(guarded, GuardedTransport):
        return await guarded.post(c, url, content=content, headers=headers, extensions=extensions)
    response = await c.post(url, content=content, headers=headers, extensions=extensions)
    return Whole(response.status_code, response.content)


async def close_client() -> None:
    clients = list(_clients)
    _clients.clear()
    for c in clients:
        await c.aclose()


__all__ = [
    "allowed_networks",
    "client",
    "close_client",
    "in_process",
    "new_client",
    "post",
    "refusal_reason",
    "register",
    "resolve",
    "slots",
]
