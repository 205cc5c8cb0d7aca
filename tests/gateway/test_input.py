"""Bad input gets a clear error in the endpoint's own shape and changes nothing."""

import httpx
import pytest
from django.utils import timezone

from ledger.models import Budget, Reservation, UsageRecord
from tenants.models import ApiKey, EndCustomer
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "hi"}]


def send(gateway, body, path="/v1/chat/completions", headers=None, raw=None):
    kw = {"content": raw} if raw is not None else {"json": body}
    return httpx.post(gateway.url + path, headers={**AUTH, **(headers or {})}, timeout=30, **kw)


def assert_nothing_changed():
    assert not Reservation.objects.exists()
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize(
    "body,raw,param,code",
    [
        (None, b"{not json", None, "invalid_request"),
        (None, b"[1, 2]", None, "invalid_request"),
        ({"messages": MSG}, None, "model", "invalid_request"),
        ({"model": "echo-1"}, None, "messages", "invalid_request"),
        ({"model": "echo-1", "messages": "hi"}, None, "messages", "invalid_request"),
        ({"model": "echo-1", "messages": [{"content": "no role"}]}, None, "messages[0]", "invalid_request"),
        ({"model": 7, "messages": MSG}, None, "model", "invalid_request"),
        ({"model": "echo-1", "messages": MSG, "max_tokens": -1}, None, "max_tokens", "invalid_request"),
        ({"model": "echo-1", "messages": MSG, "max_tokens": 10**12}, None, "max_tokens", "invalid_request"),
        ({"model": "echo-1", "messages": MSG, "max_tokens": "100"}, None, "max_tokens", "invalid_request"),
        ({"model": "echo-1", "messages": MSG, "n": 50}, None, "n", "invalid_request"),
        ({"model": "echo-1", "messages": MSG, "stream": "yes"}, None, "stream", "invalid_request"),
    ],
)
def test_openai_bad_input_is_a_400_in_openai_shape(gateway, wired, body, raw, param, code):
    r = send(gateway, body, raw=raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]
    assert err["param"] == param
    assert r.headers["x-capgate-request-id"]
    assert_nothing_changed()


@pytest.mark.parametrize(
    "body",
    [
        {"model": "echo-1", "max_tokens": 10},
        {"model": "echo-1", "max_tokens": 0, "messages": MSG},
        {"model": "echo-1", "max_tokens": 10, "messages": MSG, "system": 5},
        {"model": "echo-1", "max_tokens": 10, "messages": MSG, "stream": "yes"},
    ],
)
def test_anthropic_bad_input_is_a_400_in_anthropic_shape(gateway, wired, body):
    r = send(gateway, body, path="/v1/messages")
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert_nothing_changed()


def test_body_above_the_limit_is_413(gateway, wired, settings):
    settings.CAPGATE = {**settings.CAPGATE, "MAX_BODY_BYTES": 1000}
    r = send(gateway, {"model": "echo-1", "messages": [{"role": "user", "content": "x" * 2000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert_nothing_changed()


def test_unknown_model_is_404_and_disallowed_model_is_403(gateway, wired):
    r = send(gateway, {"model": "nope", "messages": MSG})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    ApiKey.objects.filter(pk=wired.key.pk).update(allowed_models=["gpt-test"])
    r = send(gateway, {"model": "echo-1", "messages": MSG})
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    assert_nothing_changed()


def test_unknown_revoked_and_expired_keys_are_401(gateway, wired):
    assert (
        send(gateway, {"model": "echo-1", "messages": MSG}, headers={"authorization": "Bearer wrong"}).status_code
        == 401
    )
    assert httpx.post(gateway.url + "/v1/chat/completions", json={}).status_code == 401
    ApiKey.objects.filter(pk=wired.key.pk).update(expires_at=timezone.now())
    r = send(gateway, {"model": "echo-1", "messages": MSG})
    assert r.status_code == 401 and r.json()["error"]["code"] == "expired_api_key"
    ApiKey.objects.filter(pk=wired.key.pk).update(expires_at=None, revoked_at=timezone.now())
    r = send(
        gateway,
        {"model": "echo-1", "messages": MSG},
        path="/v1/messages",
        headers={"authorization": "", "x-api-key": KEY},
    )
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert_nothing_changed()


def test_unpriced_model_under_a_blocking_budget_is_refused_unless_allowed(gateway, wired):
    wired.model.input_usd_per_mtok = None
    wired.model.save()
    wired.budget(amount="10")
    r = send(gateway, {"model": "echo-1", "messages": MSG})
    assert r.status_code == 402 and r.json()["error"]["code"] == "unpriced_model_under_budget"
    assert_nothing_changed()
    wired.org.allow_unpriced = True
    wired.org.save()
    assert send(gateway, {"model": "echo-1", "messages": MSG}).status_code == 200


def test_unboundable_parts_are_refused_under_a_blocking_budget(gateway, wired):
    wired.budget(amount="10")
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]
    r = send(gateway, {"model": "echo-1", "messages": audio, "max_tokens": 10})
    assert r.status_code == 402 and r.json()["error"]["code"] == "unbounded_input_under_budget"
    # an image is bounded by the model's max image tokens, not its base64 size
    image = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}],
        }
    ]
    assert send(gateway, {"model": "echo-1", "messages": image, "max_tokens": 10}).status_code == 200


def test_end_customer_is_created_on_first_sight_and_gets_the_project_default_cap(gateway, wired):
    wired.project.default_customer_budget_nano = 20_000_000  # $0.02
    wired.project.save()
    ok = send(
        gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 100}, headers={"x-capgate-customer": "cust-1"}
    )
    assert ok.status_code == 200
    customer = EndCustomer.objects.get(external_id="cust-1")
    budget = Budget.objects.get(end_customer=customer)
    assert (budget.amount_nano, budget.mode) == (20_000_000, "block")
    big = send(
        gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 4000}, headers={"x-capgate-customer": "cust-1"}
    )
    assert big.status_code == 402 and big.json()["error"]["code"] == "customer_budget"
    bad = send(gateway, {"model": "echo-1", "messages": MSG}, headers={"x-capgate-customer": "a b/c"})
    assert bad.status_code == 400


def test_run_budget_is_created_by_the_first_call_and_conflicts_are_409(gateway, wired):
    h = {"x-capgate-run": "run-1", "x-capgate-run-budget-usd": "0.50"}
    assert send(gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 10}, headers=h).status_code == 200
    budget = Budget.objects.get(scope="run", run_id="run-1")
    assert (budget.amount_nano, budget.period, budget.mode) == (500_000_000, "lifetime", "block")
    r = send(gateway, {"model": "echo-1", "messages": MSG}, headers={**h, "x-capgate-run-budget-usd": "0.75"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "run_budget_conflict"
    # the same amount again, or no amount, is fine
    assert send(gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 10}, headers=h).status_code == 200
    assert (
        send(
            gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 10}, headers={"x-capgate-run": "run-1"}
        ).status_code
        == 200
    )
    for amount in ("abc", "-1", "0", "1e99", "NaN"):
        r = send(
            gateway,
            {"model": "echo-1", "messages": MSG},
            headers={"x-capgate-run": "r2", "x-capgate-run-budget-usd": amount},
        )
        assert r.status_code == 400, amount
    # a run id without an amount uses the organization's default run budget
    wired.org.default_run_budget_nano = 1_000
    wired.org.save()
    r = send(gateway, {"model": "echo-1", "messages": MSG, "max_tokens": 10}, headers={"x-capgate-run": "run-3"})
    assert r.status_code == 402 and r.json()["error"]["code"] == "run_budget"


def test_key_and_route_lookups_are_cached_briefly_but_budgets_never(wired, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gateway.admission.routing import authenticate, lookups, resolve_route
    from ledger.errors import BudgetExceeded

    settings.CAPGATE = {**settings.CAPGATE, "LOOKUP_CACHE_SECONDS": 60.0}
    lookups.clear()
    try:
        key = authenticate(KEY)
        resolve_route(key=key, name="echo-1", kind="chat")
        with CaptureQueriesContext(connection) as queries:
            assert authenticate(KEY).pk == key.pk
            assert resolve_route(key=key, name="echo-1", kind="chat")[0].connection == wired.echo
        assert len(queries) == 0
        # a budget created now applies to the very next request: $0.000001 has no room for 1,001 nano
        wired.budget(amount="0.000001")
        with pytest.raises(BudgetExceeded) as refused:
            wired.admit(worst_nano=1_001)
        assert refused.value.code == "organization_budget"
    finally:
        lookups.clear()
