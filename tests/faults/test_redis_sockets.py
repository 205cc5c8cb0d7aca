"""After a Redis restart a gateway process keeps no dead Redis sockets: its idle pooled
connections are closed every REDIS_IDLE_DROP_SECONDS (the next call reconnects), so none sits
half-closed (CLOSE-WAIT) for the life of the process; and rate limits count in Redis again at
once. A private redis-server (others use the shared one)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ratelimits import services
from ratelimits.models import RateLimit
from tests.faults.conftest import wait_until
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
CLOSE_WAIT = "08"


def close_wait_sockets(port: int) -> int:
    """This process's TCP sockets to 127.0.0.1:`port` that the peer closed and we did not."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            remote, state = fields[2], fields[3]
            count += int(remote.rsplit(":", 1)[1], 16) == port and state == CLOSE_WAIT
    return count


@pytest.fixture
def on_private_redis(private_redis, settings, request):
    """Rate limits on the private Redis, idle sockets dropped every `request.param` seconds;
    requested before `gateway`, so its background loop starts with them."""
    settings.CAPGATE = {
        **settings.CAPGATE,
        "RATE_LIMIT_STORAGE_URL": private_redis.url,
        "REDIS_IDLE_DROP_SECONDS": request.param,
    }
    services._limiters = None
    yield private_redis
    services._limiters = None


def _burst(gateway, n: int) -> list[int]:
    auth = {"authorization": f"Bearer {KEY}"}
    with ThreadPoolExecutor(n) as pool:
        return list(
            pool.map(
                lambda _: (
                    httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=auth, timeout=30).status_code
                ),
                range(n),
            )
        )


def _restart_with_sockets_open(redis, gateway, wired) -> None:
    RateLimit.objects.create(organization=wired.org, scope="key", api_key=wired.key, requests_per_minute=10_000)
    assert _burst(gateway, 16) == [200] * 16  # several pooled connections to Redis, now idle
    redis.stop()
    redis.start()  # same port


@pytest.mark.parametrize("on_private_redis", [0.5], indirect=True)
def test_after_a_redis_restart_no_dead_socket_is_kept(on_private_redis, gateway, wired):
    _restart_with_sockets_open(on_private_redis, gateway, wired)
    # then: within a drop interval, no socket to Redis is left half-closed
    wait_until(lambda: close_wait_sockets(on_private_redis.port) == 0, timeout=5, what="the dead sockets to close")
    # and the limiter counts in Redis again (not in this process's memory)
    assert _burst(gateway, 4) == [200] * 4
    assert services.limiters().redis_failed_at < time.monotonic() - 1 or services.limiters().redis_failed_at == float(
        "-inf"
    )


@pytest.mark.parametrize("on_private_redis", [3600.0], indirect=True)
def test_removal_without_the_drop_dead_sockets_stay(on_private_redis, gateway, wired):
    _restart_with_sockets_open(on_private_redis, gateway, wired)
    time.sleep(1.5)
    assert close_wait_sockets(on_private_redis.port) > 0
