"""Rate limits on the gateway: 429 with Retry-After and the limit's name, in the endpoint's own
shape; a limited request reserves nothing and is never charged; caps stay exact with Redis up
or down."""

import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gateway.admission import limits as gateway_limits
from ledger.models import Reservation, UsageRecord, Window
from ratelimits import services
from ratelimits.models import RateLimit
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
MESSAGES = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


@pytest.fixture(autouse=True)
def fresh_limiters():
    services._limiters = None
    yield
    services._limiters = None


def _limit(wired, **fields) -> RateLimit:
    return RateLimit.objects.create(organization=wired.org, scope="key", api_key=wired.key, **fields)


def _burst(gateway, n: int, path: str = "/v1/chat/completions", body: dict = CHAT) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: httpx.post(gateway.url + path, json=body, headers=AUTH, timeout=30), range(n)))


def _assert_books_balance(budget) -> None:
    wait_settled()
    window = Window.objects.get(budget=budget)
    records = list(UsageRecord.objects.all())
    assert window.reserved_nano == 0 and not Reservation.objects.exists()
    assert window.spent_nano == sum(r.cost_nano for r in records) <= budget.amount_nano


def test_requests_over_the_limit_get_429_with_retry_after_and_are_never_charged(gateway, wired):
    # given: 5 requests a minute for this key, under a blocking budget
    budget = wired.budget(amount="1")
    _limit(wired, name="ci-key-rpm", requests_per_minute=5)
    # when: 12 at once
    responses = _burst(gateway, 12)
    # then: 5 served; 7 refused with when to retry and which limit, in OpenAI's shape
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 7
    refused = [r for r in responses if r.status_code == 429]
    for r in refused:
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert r.headers["x-capgate-rate-limit"] == "ci-key-rpm"
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "ci-key-rpm" in err["message"]
    # only the served requests have records: the refused ones reserved nothing
    _assert_books_balance(budget)
    assert UsageRecord.objects.count() == 5


def test_rate_limit_guard_removed_lets_every_request_through(gateway, wired, monkeypatch):
    # The guard-removal test of the one above.
    monkeypatch.setattr(gateway_limits, "enforce_rate_limits", lambda **kw: None)
    _limit(wired, name="ci-key-rpm", requests_per_minute=5)
    assert [r.status_code for r in _burst(gateway, 12)] == [200] * 12


def test_tokens_per_minute_counts_the_input_bound_plus_the_output_ceiling(gateway, wired):
    _limit(wired, name="tpm", tokens_per_minute=1000)
    # a request whose output ceiling alone is over the minute's tokens can never fit
    big = httpx.post(gateway.url + "/v1/messages", json={**MESSAGES, "max_tokens": 2000}, headers=AUTH, timeout=30)
    assert big.status_code == 429
    assert big.json()["type"] == "error" and big.json()["error"]["type"] == "rate_limit_error"  # Anthropic shape
    assert big.headers["x-capgate-rate-limit"] == "tpm"
    # 300 + the input bound (the whole body in bytes, ~100) each: two fit in 1,000, the third does not
    statuses = [
        httpx.post(
            gateway.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 300}, headers=AUTH, timeout=30
        ).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    wait_settled()
    assert UsageRecord.objects.count() == 2


def _dead_redis() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


@pytest.mark.parametrize("redis", ["up", "down"])
def test_caps_stay_exact_with_redis_up_or_down(gateway, wired, settings, redis):
    # given: a blocking cap, and 5 requests a minute
    if redis == "down":
        settings.CAPGATE = {**settings.CAPGATE, "RATE_LIMIT_STORAGE_URL": _dead_redis()}
    _limit(wired, name="rpm", requests_per_minute=5)
    budget = wired.budget(amount="0.01")
    # when: 12 at once
    responses = _burst(gateway, 12)
    # then: the rate limit held (in Redis, or in this process when Redis is down)...
    codes = sorted(r.status_code for r in responses)
    assert codes.count(429) == 7 and codes.count(200) + codes.count(402) == 5
    # ...and the cap is exact: every served request recorded, nothing held, spent within the cap
    _assert_books_balance(budget)
    assert UsageRecord.objects.filter(status="served").count() == codes.count(200)
