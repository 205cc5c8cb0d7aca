"""Login lockout (django-axes) and the management API's throttles (issue 9, item 4)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from config import throttles

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


@pytest.fixture
def alice_login(db):
    get_user_model().objects.create_user("alice@acme.test", "alice@acme.test", PASSWORD)
    return "alice@acme.test"


def login(client: Client, username: str, password: str, addr: str = "10.0.0.1"):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=addr)


def test_wrong_passwords_lock_the_account_out_even_for_the_right_one(alice_login):
    c = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(c, alice_login, "wrong").status_code == 200  # the form again, with its error
    # when: the failure that reaches the limit, then the right password
    assert login(c, alice_login, "wrong").status_code == 429
    r = login(c, alice_login, PASSWORD)
    # then: still locked out, and not logged in
    assert r.status_code == 429 and b"Too many failed logins" in r.content
    assert "_auth_user_id" not in c.session


def test_the_lockout_is_for_that_address_only(alice_login):
    c = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(c, alice_login, "wrong", addr="10.0.0.66")
    # A stranger's failures do not lock the owner out from their own address.
    assert login(Client(), alice_login, PASSWORD, addr="10.0.0.7").status_code == 302


def test_a_success_before_the_limit_resets_the_count(alice_login):
    c = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login(c, alice_login, "wrong")
    assert login(c, alice_login, PASSWORD).status_code == 302
    c2 = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login(c2, alice_login, "wrong")
    assert login(c2, alice_login, PASSWORD).status_code == 302


def test_without_axes_forty_wrong_passwords_then_the_right_one_logs_in(alice_login, settings):
    # Guard removed: the finding comes back.
    settings.AXES_ENABLED = False
    c = Client()
    for _ in range(40):
        login(c, alice_login, "wrong")
    assert login(c, alice_login, PASSWORD).status_code == 302


# --- DRF throttles -------------------------------------------------------------------------------


@pytest.fixture
def low_rates(settings):
    caches["throttle"].clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"api": "5/minute", "api_anon": "3/minute"},
    }
    yield
    caches["throttle"].clear()


def api(token: str | None = None, addr: str = "10.0.0.1") -> APIClient:
    c = APIClient(REMOTE_ADDR=addr)
    if token:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def test_a_token_over_its_rate_gets_429_in_the_api_shape(org_a, org_b, low_rates):
    c = api(org_a.token_read)
    url = f"/api/orgs/{org_a.slug}/budgets/"
    assert [c.get(url).status_code for _ in range(5)] == [200] * 5
    r = c.get(url)
    assert r.status_code == 429
    assert r.json()["code"] == "throttled" and r.json()["detail"] and r.json()["errors"] == {}
    assert int(r["Retry-After"]) > 0
    # Per token: acme's other token, and globex's, are not held up by it.
    assert api(org_a.token_write).get(url).status_code == 200
    assert api(org_b.token_read).get(f"/api/orgs/{org_b.slug}/budgets/").status_code == 200


def test_a_signed_in_user_is_throttled_per_user(org_a, low_rates):
    c = APIClient()
    c.force_authenticate(org_a.owner)
    url = f"/api/orgs/{org_a.slug}/budgets/"
    statuses = [c.get(url).status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]


def test_anonymous_callers_are_throttled_by_address_ignoring_forwarded_for(low_rates):
    statuses = [
        api(addr="10.9.9.9").get("/api/schema/", HTTP_X_FORWARDED_FOR=f"1.2.3.{i}").status_code for i in range(4)
    ]
    assert statuses == [200, 200, 200, 429]


def test_without_the_throttle_the_token_is_never_held_up(org_a, low_rates, monkeypatch):
    monkeypatch.setattr(throttles.ApiThrottle, "get_cache_key", lambda self, request, view: None)
    c = api(org_a.token_read)
    url = f"/api/orgs/{org_a.slug}/budgets/"
    assert all(c.get(url).status_code == 200 for _ in range(8))


def test_an_unreachable_throttle_store_lets_the_api_work(org_a, low_rates, monkeypatch):
    from redis.exceptions import ConnectionError as RedisConnectionError

    def down(*args, **kwargs):
        raise RedisConnectionError("down")

    monkeypatch.setattr(caches["throttle"], "get", down)
    assert api(org_a.token_read).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 200
