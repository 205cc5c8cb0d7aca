"""The reservation API for callers that call providers themselves."""

import httpx
import pytest

from ledger.models import Reservation, UsageRecord, Window
from tests.conftest import make_tenant
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}


def call(gateway, path, body=None, headers=AUTH):
    return httpx.post(gateway.url + path, json=body or {}, headers=headers, timeout=30)


def test_reserve_settle_is_idempotent_and_frees_the_difference(gateway, wired):
    budget = wired.budget(amount="1")
    r = call(gateway, "/v1/reservations", {"model": "echo-1", "amount_usd": "0.40", "request_id": "job-1"})
    assert r.status_code == 201, r.text
    res = r.json()
    assert res["amount_nano"] == 400_000_000 and res["request_id"] == "job-1"
    assert Window.objects.get(budget=budget).reserved_nano == 400_000_000
    # the same request id again returns the same reservation
    again = call(gateway, "/v1/reservations", {"model": "echo-1", "amount_usd": "0.40", "request_id": "job-1"})
    assert again.status_code == 200 and again.json()["id"] == res["id"]
    # settle with token usage (priced at the route's first target: $15/$75 per M)
    s = call(gateway, f"/v1/reservations/{res['id']}/settle", {"usage": {"input_tokens": 1000, "output_tokens": 1000}})
    assert s.status_code == 200 and s.json()["cost_nano"] == 90_000_000
    twice = call(gateway, f"/v1/reservations/{res['id']}/settle", {"cost_usd": "0.09"})
    assert twice.status_code == 200 and twice.json()["cost_nano"] == 90_000_000  # the same again: its result
    other = call(gateway, f"/v1/reservations/{res['id']}/settle", {"cost_usd": "0.99"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "reservation_settle_conflict"
    wait_settled()
    w = Window.objects.get(budget=budget)
    assert (w.spent_nano, w.reserved_nano) == (90_000_000, 0)


def test_reserve_from_a_chat_body_and_release(gateway, wired):
    wired.budget(amount="1")
    r = call(
        gateway,
        "/v1/reservations",
        {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100},
    )
    assert r.status_code == 201
    assert r.json()["amount_nano"] > 100 * 75_000
    rel = call(gateway, f"/v1/reservations/{r.json()['id']}/release")
    assert rel.status_code == 200 and rel.json()["status"] == "released"
    assert not Reservation.objects.exists()
    assert UsageRecord.objects.get().cost_nano == 0


def test_reservation_refused_over_the_cap_and_bad_input(gateway, wired):
    wired.budget(amount="0.10")
    r = call(gateway, "/v1/reservations", {"amount_usd": "0.20"})
    assert r.status_code == 402 and r.json()["error"]["code"] == "organization_budget"
    for body in (
        {"amount_usd": 0.2},
        {"amount_usd": "-1"},
        {"amount_usd": "lots"},
        {},
        {"amount_usd": "0.01", "ttl_seconds": 0},
        {"model": "echo-1", "input_tokens": -5, "max_output_tokens": 1},
    ):
        bad = call(gateway, "/v1/reservations", body)
        assert bad.status_code == 400, body
    assert call(gateway, "/v1/reservations/not-a-uuid/settle", {"cost_usd": "0"}).status_code == 404
    assert not Reservation.objects.exists()


def test_another_organizations_reservation_is_not_found(gateway, wired):
    r = call(gateway, "/v1/reservations", {"amount_usd": "0.01"})
    other = make_tenant("globex")
    from tenants.models import ApiKey, hash_key

    ApiKey.objects.filter(pk=other.key.pk).update(key_hash=hash_key("cg_other"))
    theirs = {"authorization": "Bearer cg_other"}
    assert (
        call(gateway, f"/v1/reservations/{r.json()['id']}/settle", {"cost_usd": "0"}, headers=theirs).status_code == 404
    )
    assert call(gateway, f"/v1/reservations/{r.json()['id']}/release", headers=theirs).status_code == 404
    assert Reservation.objects.count() == 1


def test_the_same_request_id_reserved_concurrently_holds_once(gateway, wired):
    from concurrent.futures import ThreadPoolExecutor

    budget = wired.budget(amount="1")
    body = {"amount_usd": "0.10", "request_id": "same-job"}
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: call(gateway, "/v1/reservations", body), range(8)))
    assert {r.status_code for r in responses} <= {200, 201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert Reservation.objects.count() == 1
    assert Window.objects.get(budget=budget).reserved_nano == 100_000_000
