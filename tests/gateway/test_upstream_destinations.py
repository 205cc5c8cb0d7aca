"""Upstream destinations: a tenant's connection cannot reach the gateway's own network.

The fake upstream listens on 127.0.0.1, which the test settings allow; these tests take that
allowance away (as production has it) and check the guard refuses at connect time."""

import asyncio
import socket

import httpx
import pytest

from gateway.upstream import transport as guard
from ledger.models import UsageRecord, Window
from tests.gateway.conftest import KEY, wait_settled

AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


@pytest.fixture
def public_only(settings):
    """Production's default: only public addresses. Fresh clients, so no keep-alive connection
    opened under the test settings' loopback allowance is reused."""
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    guard._clients.clear()
    yield
    guard._clients.clear()


@pytest.mark.parametrize(
    "address, reason",
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.5.4", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "not public"),
        ("100.100.100.200", "not public"),
        ("fd00:ec2::254", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::1", "loopback"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_internal_addresses_are_refused(public_only, address, reason):
    assert guard.refusal_reason(address) == reason


def test_public_addresses_pass_and_operator_networks_are_allowed(settings):
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": ["10.8.0.0/16"]}
    assert guard.refusal_reason("8.8.8.8") is None
    assert guard.refusal_reason("2606:4700:4700::1111") is None
    assert guard.refusal_reason("10.8.1.2") is None  # the operator's self-hosted models
    assert guard.refusal_reason("10.9.1.2") == "private"


@pytest.mark.django_db(transaction=True)
def test_ssrf_to_loopback_is_refused_before_any_byte_is_sent(gateway, wired, upstream, public_only):
    # given: a connection whose base URL points at a real service on 127.0.0.1 (saved before the
    # rule, or straight into the database), under a blocking budget
    budget = wired.budget(amount="1")
    # when
    r = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    # then: the gateway refused to dial it; the internal service saw nothing, not even the key
    assert r.status_code == 502, r.text
    assert "not allowed: loopback" in r.json()["error"]["message"]
    assert upstream.stats()["requests"] == 0
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("failed_upstream", 0)
    assert Window.objects.get(budget=budget).reserved_nano == 0


@pytest.mark.django_db(transaction=True)
def test_ssrf_guard_removed_leaks_the_reply_and_the_tenant_secret(gateway, wired, upstream, public_only, monkeypatch):
    # The guard-removal test of the one above: without the address check the same call reaches
    # the internal service, which receives the connection's secret and whose body is relayed.
    monkeypatch.setattr(guard, "refusal_reason", lambda address: None)
    r = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert r.status_code == 200
    assert upstream.stats()["requests"] == 1
    assert upstream.last("/v1/chat/completions")["headers"]["authorization"] == "Bearer sk-up"


def _server_counting_connections() -> tuple[socket.socket, list[int]]:
    """A real listening socket on 127.0.0.1 that answers one HTTP request per connection."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return srv, accepted


def _fetch(url: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=guard.GuardedTransport(
                limits=httpx.Limits(max_connections=4), ssl_context=httpx.create_ssl_context()
            )
        ) as c:
            return await c.get(url)

    return asyncio.run(go())


def test_dns_rebinding_is_refused_at_connect_time(public_only, monkeypatch):
    # given: a name whose first answer is public (what a check at save time would have seen)
    # and whose next answer is 127.0.0.1, where a real server listens
    srv, accepted = _server_counting_connections()
    port = srv.getsockname()[1]
    answers = [["93.184.216.34"], ["127.0.0.1"]]
    lookups: list[str] = []

    async def rebinding_resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return answers[min(len(lookups), len(answers)) - 1] if host == "rebind.test" else []

    monkeypatch.setattr(guard, "resolve", rebinding_resolver)
    assert guard.refusal_reason(answers[0][0]) is None  # the first answer passes any check
    asyncio.run(rebinding_resolver("rebind.test", port))  # ...and was used up by that check
    try:
        # when: the gateway's transport connects
        with pytest.raises(httpx.ConnectError, match="not allowed: loopback"):
            _fetch(f"http://rebind.test:{port}/v1/chat/completions")
        # then: the connect-time answer was checked, and nothing reached the server
        assert lookups == ["rebind.test", "rebind.test"]
        assert accepted == []

        # guard removed: the same connect dials the rebound address it was handed
        monkeypatch.setattr(guard, "refusal_reason", lambda address: None)
        answers.append(["127.0.0.1"])
        assert _fetch(f"http://rebind.test:{port}/").text == "ok"
        assert accepted == [1]
    finally:
        srv.close()


def test_a_name_with_any_internal_answer_is_refused(public_only, monkeypatch):
    async def mixed(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.5"]

    monkeypatch.setattr(guard, "resolve", mixed)
    with pytest.raises(httpx.ConnectError, match=r"10\.0\.0\.5.*private"):
        _fetch("http://mixed.test/")
