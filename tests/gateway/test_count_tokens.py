"""POST /v1/messages/count_tokens through the live gateway, as the Anthropic SDK calls it: free
(nothing reserved, no usage record, even under an exhausted cap), answered by the provider or
locally where the model's tokenizer is known, shaped and checked like a Messages request, and
counted against the key's rate limits like a request."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from ledger.models import Reservation, UsageRecord
from ratelimits.models import RateLimit
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "Hello, world"}]


def an(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def test_the_provider_counts_and_nothing_is_charged_even_with_no_room_left(gateway, wired, upstream):
    # given: a blocking cap with nothing left
    wired.budget(amount="0")
    upstream.control(prompt_tokens=321)
    # when
    counted = an(gateway).messages.count_tokens(model="claude-test", messages=MESSAGES, system="Be brief.")
    # then: the provider's count, for the target's own model id, and no money moved
    assert counted.input_tokens == 321
    sent = upstream.last("/v1/messages/count_tokens")
    assert sent["body"]["model"] == "echo-1" and sent["headers"]["x-api-key"] == "sk-ant-up"
    assert not UsageRecord.objects.exists()
    assert not Reservation.objects.exists()


def test_a_known_tokenizer_counts_locally_without_calling_the_provider(gateway, wired, upstream):
    wired.model.tokenizer = "o200k_base"
    wired.model.save()
    resp = httpx.post(
        gateway.url + "/v1/messages/count_tokens",
        json={"model": "claude-test", "messages": MESSAGES},
        headers={"x-api-key": KEY},
    )
    assert resp.status_code == 200
    assert resp.headers["x-capgate-count"] == "local"
    # "Hello, world" is 3 o200k tokens, plus the chat framing the bound adds (3 + 1 + 3)
    assert 3 < resp.json()["input_tokens"] < 20
    assert upstream.stats()["requests"] == 0


def test_an_echo_route_answers_the_input_bound(gateway, wired, upstream):
    resp = httpx.post(
        gateway.url + "/v1/messages/count_tokens",
        json={"model": "echo-1", "messages": MESSAGES},
        headers={"x-api-key": KEY},
    )
    assert resp.status_code == 200
    assert resp.headers["x-capgate-count"] == "bound"
    assert resp.json()["input_tokens"] >= len('{"role":"user","content":"Hello, world"}')


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        ({"model": "claude-test"}, {}, 400),  # no messages
        ({"model": "claude-test", "messages": MESSAGES, "max_tokens": "many"}, {}, 400),
        ({"model": "claude-test", "messages": "hi"}, {}, 400),
        ({"model": "nope", "messages": MESSAGES}, {}, 404),
    ],
)
def test_a_bad_count_is_refused_in_anthropics_shape_before_the_provider(
    gateway, wired, upstream, body, headers, status
):
    resp = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": KEY, **headers})
    assert resp.status_code == status
    assert resp.json()["type"] == "error"
    assert upstream.stats()["requests"] == 0


def test_what_the_inventory_does_not_list_is_counted_and_passed_on(gateway, wired, upstream):
    # a count is never charged, so no cap is at stake even under a blocking budget
    wired.budget(amount="5")
    resp = httpx.post(
        gateway.url + "/v1/messages/count_tokens",
        json={"model": "claude-test", "messages": MESSAGES, "brand_new": 1},
        headers={"x-api-key": KEY, "anthropic-beta": "something-new-2099-01-01"},
    )
    assert resp.status_code == 200
    sent = upstream.last("/v1/messages/count_tokens")
    assert sent["body"]["brand_new"] == 1
    assert "something-new-2099-01-01" in sent["headers"]["anthropic-beta"]


def test_counts_use_the_keys_request_rate_limit(gateway, wired, upstream):
    RateLimit.objects.create(organization=wired.org, scope="key", api_key=wired.key, requests_per_minute=2)
    client = an(gateway)
    for _ in range(2):
        client.messages.count_tokens(model="claude-test", messages=MESSAGES)
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(model="claude-test", messages=MESSAGES)
    assert upstream.stats()["requests"] == 2
