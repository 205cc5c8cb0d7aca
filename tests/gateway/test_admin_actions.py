"""Issue 15: money that admin actions and the reservation API could lose or double, each tried
through HTTP with proxied calls in flight on a delayed echo connection, then checked against
the database and the audit (windows = their rows, and every request = what was reported)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from alerts.audit import audit_counters
from gateway.admission import reservations
from ledger import recording
from ledger import windows as budget_windows
from ledger.models import Budget, Reservation, UsageRecord, Window
from ledger.periods import period_bounds
from tenants.audit import APPLY
from tenants.members import change_member_role, remove_member
from tenants.models import ApiKey, ApiToken, AuditLogEntry, EndCustomer, hash_key
from tests.conftest import make_api_token
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
OTHER_KEY = "cg_other_key_in_the_same_org"
MAX_TOKENS = 1000  # the echo bills all of it: actual cost is close to the worst case


def slow_echo(wired, delay_ms: int = 4000) -> None:
    wired.echo.options = {"delay_ms": delay_ms, "completion_tokens": MAX_TOKENS, "prompt_tokens": 1}
    wired.echo.save()


def chat(gateway, headers=AUTH, **extra) -> httpx.Response:
    body = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers={**headers, **extra}, timeout=60)


def burst(gateway, n: int, **headers) -> list[httpx.Response]:
    """n proxied calls released together by a barrier, each on its own thread and connection."""
    barrier = threading.Barrier(n)

    def one(_i: int) -> httpx.Response:
        barrier.wait()
        return chat(gateway, **headers)

    pool = ThreadPoolExecutor(n)
    futures = [pool.submit(one, i) for i in range(n)]
    pool.shutdown(wait=False)
    return futures  # type: ignore[return-value]


def wait_in_flight(n: int, timeout: float = 10) -> list[Reservation]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = list(Reservation.objects.all())
        if len(live) >= n:
            return live
        time.sleep(0.02)
    raise AssertionError(f"expected {n} requests in flight, saw {Reservation.objects.count()}")


def results(futures) -> list[httpx.Response]:
    return [f.result(timeout=60) for f in futures]


def worst_nano(gateway, wired) -> int:
    """One call's worst case, measured through the gateway (then released by its record)."""
    r = httpx.post(
        gateway.url + "/v1/reservations",
        headers=AUTH,
        timeout=30,
        json={"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS},
    )
    assert r.status_code == 201, r.text
    httpx.post(gateway.url + f"/v1/reservations/{r.json()['id']}/release", headers=AUTH, timeout=30)
    return r.json()["amount_nano"]


def other_key(wired) -> ApiKey:
    key = wired.add_key("other")
    ApiKey.objects.filter(pk=key.pk).update(key_hash=hash_key(OTHER_KEY))
    return key


def token(wired, scope: str) -> str:
    return make_api_token(organization=wired.org, scope=scope, name=f"{scope} token")


def in_range_spend(budget: Budget) -> int:
    """The period's truth for an organization budget: every record admitted in its current range."""
    budget.refresh_from_db()
    start, end = period_bounds(period=budget.period, tz=budget.timezone, now=timezone.now())
    qs = UsageRecord.objects.filter(organization=budget.organization, admitted_at__gte=start)
    if end is not None:
        qs = qs.filter(admitted_at__lt=end)
    return sum(qs.values_list("cost_nano", flat=True))


def assert_audit_clean() -> None:
    report = audit_counters(record=False)
    assert report.drifts == [] and report.request_drifts == []


# --- item 1: ownership of reservations ---------------------------------------------------------


def _zero_in_flight_calls(gateway, wired, n: int = 6) -> tuple[list[httpx.Response], list[httpx.Response]]:
    budget = wired.budget(amount="1")
    slow_echo(wired)
    other_key(wired)
    futures = burst(gateway, n)
    live = wait_in_flight(n)
    # the attacker: another key of the same organization, acting on ids the listing shows
    attacks = []
    for i, res in enumerate(live):
        path = f"/v1/reservations/{res.id}/" + ("release" if i % 2 else "settle")
        attacks.append(
            httpx.post(
                gateway.url + path, json={"cost_usd": "0"}, headers={"authorization": f"Bearer {OTHER_KEY}"}, timeout=30
            )
        )
    served = results(futures)
    wait_settled()
    assert budget
    return served, attacks


def test_another_key_cannot_settle_or_release_a_proxied_call(gateway, wired):
    # when
    served, attacks = _zero_in_flight_calls(gateway, wired)
    # then: refused with a code that says why, and every served call is charged what it cost
    assert all(r.status_code == 200 for r in served)
    assert {(a.status_code, a.json()["error"]["code"]) for a in attacks} == {(409, "reservation_owned_by_gateway")}
    records = list(UsageRecord.objects.all())
    assert len(records) == 6 and all(r.status == "served" and r.cost_nano > 0 for r in records)
    assert_audit_clean()


def test_without_the_owner_check_the_calls_lose_their_cost_and_the_audit_sees_it(gateway, wired, monkeypatch):
    # given: the guard removed
    monkeypatch.setattr(reservations.GUARDS, "check_owner", False)
    # when
    served, attacks = _zero_in_flight_calls(gateway, wired)
    # then: the leak returns (served, recorded at zero) and the per-request audit flags each one
    assert all(r.status_code == 200 for r in served) and all(a.status_code == 200 for a in attacks)
    assert all(r.cost_nano == 0 for r in UsageRecord.objects.all())
    report = audit_counters(record=False)
    assert report.drifts == []  # every window agrees with its rows: that check cannot see this
    assert len(report.request_drifts) == 6


def test_api_reservations_answer_to_their_key_or_a_write_token_and_are_audited(gateway, wired):
    wired.budget(amount="1")
    other_key(wired)
    read, write = token(wired, "read"), token(wired, "write")

    def make() -> str:
        r = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "0.01"}, headers=AUTH, timeout=30)
        assert r.status_code == 201
        return r.json()["id"]

    def act(rid: str, what: str, raw: str) -> httpx.Response:
        return httpx.post(
            gateway.url + f"/v1/reservations/{rid}/{what}",
            json={"cost_usd": "0.005"},
            headers={"authorization": f"Bearer {raw}"},
            timeout=30,
        )

    first, second = make(), make()
    assert act(first, "settle", OTHER_KEY).json()["error"]["code"] == "not_reservation_owner"
    assert act(first, "release", read).status_code == 403
    assert act(first, "release", read).json()["error"]["code"] == "read_only_token"
    assert Reservation.objects.count() == 2  # nothing changed
    assert act(first, "settle", KEY).json()["cost_nano"] == 5_000_000
    assert act(second, "release", write).json()["status"] == "released"
    wait_settled()
    entries = AuditLogEntry.objects.filter(object_type="reservation").order_by("id")
    assert [(e.actor.split(" ")[0], e.changes["by"][1]) for e in entries] == [("key", "settle"), ("token", "release")]


def test_a_write_token_acts_on_reservations_only_while_its_member_is_an_owner_or_admin(gateway, wired):
    # given: a reservation, and the write token of an admin who is then demoted, then removed
    wired.budget(amount="1")
    write = token(wired, "write")
    member = ApiToken.objects.select_related("member").get(token_hash=hash_key(write)).member
    r = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "0.01"}, headers=AUTH, timeout=30)
    rid = r.json()["id"]

    def release() -> httpx.Response:
        return httpx.post(
            gateway.url + f"/v1/reservations/{rid}/release", headers={"authorization": f"Bearer {write}"}, timeout=30
        )

    change_member_role(member=member, role="member", actor=APPLY)
    # when / then: refused, and the reservation is still held
    demoted = release()
    assert (demoted.status_code, demoted.json()["error"]["code"]) == (403, "token_role_too_low")
    remove_member(member=member, actor=APPLY)
    removed = release()
    assert (removed.status_code, removed.json()["error"]["code"]) == (401, "invalid_api_key")
    assert Reservation.objects.filter(id=rid).exists()
    assert not AuditLogEntry.objects.filter(object_type="reservation").exists()


# --- item 6: one rule for release and settle ----------------------------------------------------


def test_release_and_settle_after_expiry_and_after_each_other(gateway, wired):
    budget = wired.budget(amount="1")

    def make(rid: str) -> str:
        r = httpx.post(
            gateway.url + "/v1/reservations", json={"amount_usd": "0.10", "request_id": rid}, headers=AUTH, timeout=30
        )
        return r.json()["id"]

    def act(res: str, what: str, cost: str = "0.03") -> httpx.Response:
        return httpx.post(
            gateway.url + f"/v1/reservations/{res}/{what}", json={"cost_usd": cost}, headers=AUTH, timeout=30
        )

    # after expiry: release corrects the worst-case charge to zero, as settle corrects it to the cost
    lapsed_release, lapsed_settle = make("lapsed-1"), make("lapsed-2")
    Reservation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    recording.expire()
    assert set(UsageRecord.objects.values_list("status", "cost_nano")) == {("estimated", 100_000_000)}
    assert act(lapsed_release, "release").json()["cost_nano"] == 0
    assert act(lapsed_settle, "settle").json()["cost_nano"] == 30_000_000
    # then each is final: the same again answers the first result, the other action is a 409
    assert act(lapsed_release, "release").status_code == 200
    assert act(lapsed_release, "settle").json()["error"]["code"] == "reservation_released"
    assert act(lapsed_settle, "settle").json()["cost_nano"] == 30_000_000
    # a settle at another cost conflicts with the first: 409, and the first stands
    assert act(lapsed_settle, "settle", "0.09").json()["error"]["code"] == "reservation_settle_conflict"
    assert act(lapsed_settle, "release").json()["error"]["code"] == "reservation_settled"
    released = make("fresh")
    assert act(released, "release").status_code == 200
    assert act(released, "settle").status_code == 409
    wait_settled()
    assert Window.objects.get(budget=budget).spent_nano == 30_000_000
    assert_audit_clean()


def test_a_chat_shaped_reservation_takes_its_own_fields(gateway, wired):
    body = {
        "model": "echo-1",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "request_id": "chat-shaped",
        "ttl_seconds": 30,
    }
    r = httpx.post(gateway.url + "/v1/reservations", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 201, r.text
    assert r.json()["request_id"] == "chat-shaped"
    res = Reservation.objects.get()
    assert 29 <= (res.expires_at - res.created_at).total_seconds() <= 31


# --- item 2: budget edits keep the cap ----------------------------------------------------------


def _edit_mid_burst(gateway, wired, edit, *, fits: int = 6, first: int = 5, second: int = 5) -> tuple[Budget, int]:
    """A day cap with room for `fits` calls; `first` calls in flight; `edit` the budget through
    the management API; `second` calls more, also in flight. Returns the budget and how many
    calls were served."""
    worst = worst_nano(gateway, wired)
    budget = wired.budget(amount="0", period="day")
    Budget.objects.filter(pk=budget.pk).update(amount_nano=fits * worst + worst // 2)
    slow_echo(wired)
    api = httpx.Client(
        base_url=gateway.url + f"/api/orgs/{wired.org.slug}",
        headers={"authorization": f"Bearer {token(wired, 'write')}"},
        timeout=30,
    )
    a = burst(gateway, first)
    wait_in_flight(first)
    budget = edit(api, budget) or budget
    b = burst(gateway, second)
    served = sum(r.status_code == 200 for r in results(a) + results(b))
    wait_settled()
    return budget, served


def _change_timezone(api, budget):
    r = api.patch(f"/budgets/{budget.id}/", json={"timezone": "Pacific/Kiritimati"})
    assert r.status_code == 200, r.text


def test_a_timezone_change_carries_the_calls_in_flight(gateway, wired):
    budget, served = _edit_mid_burst(gateway, wired, _change_timezone)
    budget.refresh_from_db()
    assert served == 6
    assert in_range_spend(budget) <= budget.amount_nano
    assert_audit_clean()


def test_without_carrying_the_holds_a_timezone_change_overspends(gateway, wired, monkeypatch):
    monkeypatch.setattr(budget_windows.GUARDS, "carry_holds", False)
    budget, served = _edit_mid_burst(gateway, wired, _change_timezone)
    budget.refresh_from_db()
    assert served == 10
    assert in_range_spend(budget) > budget.amount_nano


def test_switching_back_never_reuses_a_window_that_missed_the_spend_between(gateway, wired):
    def there_and_back(api, budget):
        assert api.patch(f"/budgets/{budget.id}/", json={"period": "week"}).status_code == 200
        assert chat(gateway).status_code == 200
        assert api.patch(f"/budgets/{budget.id}/", json={"period": "day"}).status_code == 200

    budget, served = _edit_mid_burst(gateway, wired, there_and_back)
    assert served == 5  # the first burst, plus the call between the edits: the 6 that fit
    assert in_range_spend(budget) <= budget.amount_nano
    assert Window.objects.filter(budget=budget).count() == 3  # day v1, week v2, day v3
    assert_audit_clean()


def test_delete_and_recreate_carries_the_calls_in_flight(gateway, wired):
    def recreate(api, budget):
        body = api.get(f"/budgets/{budget.id}/").json()
        assert api.delete(f"/budgets/{budget.id}/").status_code == 204
        r = api.post("/budgets/", json={k: body[k] for k in ("scope", "period", "timezone", "mode", "amount_usd")})
        assert r.status_code == 201, r.text
        return Budget.objects.get(pk=r.json()["id"])

    budget, served = _edit_mid_burst(gateway, wired, recreate)
    assert served == 6
    assert in_range_spend(budget) <= budget.amount_nano
    assert_audit_clean()


# --- item 4: deletions never lose cost ----------------------------------------------------------


def test_deleting_the_customer_and_project_in_flight_keeps_every_cost(gateway, wired, settings, tmp_path):
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": str(tmp_path)}
    wired.budget(amount="1")
    slow_echo(wired)
    api = httpx.Client(
        base_url=gateway.url + f"/api/orgs/{wired.org.slug}",
        headers={"authorization": f"Bearer {token(wired, 'write')}"},
        timeout=30,
    )
    futures = burst(gateway, 6, **{"x-capgate-customer": "cust-1"})
    wait_in_flight(6)
    customer = EndCustomer.objects.get(external_id="cust-1")
    assert api.delete(f"/end-customers/{customer.id}/").status_code == 204
    served = results(futures)
    wait_settled()
    assert all(r.status_code == 200 for r in served)
    records = list(UsageRecord.objects.all())
    assert len(records) == 6 and all(r.cost_nano > 0 and r.end_customer_id is None for r in records)
    assert {r.subject["end_customer"]["id"] for r in records} == {customer.id}
    assert {r.subject["end_customer"]["name"] for r in records} == {"cust-1"}
    assert not list(tmp_path.glob("spool/*"))  # nothing spooled
    assert_audit_clean()


def test_without_detaching_deleted_subjects_the_records_are_lost(gateway, wired, settings, tmp_path, monkeypatch):
    monkeypatch.setattr(recording.GUARDS, "detach_deleted_subjects", False)
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": str(tmp_path)}
    slow_echo(wired, delay_ms=1000)
    futures = burst(gateway, 3, **{"x-capgate-customer": "cust-2"})
    wait_in_flight(3)
    EndCustomer.objects.filter(external_id="cust-2").delete()
    for f in futures:
        f.result(timeout=60)
    time.sleep(0.5)
    assert not UsageRecord.objects.exists()  # the cost is gone, and the reservations wait out their lease
    assert Reservation.objects.count() == 3


def test_a_spooled_record_refused_for_good_goes_to_the_dead_letter(wired, settings, tmp_path):
    from ledger import spool
    from ledger.recording import Outcome

    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": str(tmp_path)}
    res = Reservation(
        request_id="req_gone", organization_id=wired.org.id + 999, amount_nano=5, created_at=timezone.now()
    )
    spool.append(reservation=res, outcome=Outcome(status="served", cost_nano=5))
    assert spool.replay() == 0
    assert spool.replay() == 0  # not retried
    assert spool.dead_letter_count() == 1
    assert spool.dead_letter_count(organization_id=wired.org.id + 999) == 1
    assert spool.dead_letter_count(organization_id=wired.org.id) == 0
    assert not list((tmp_path / "spool").glob("spool-*.jsonl"))


# --- issue 9 item 6: removing a member ----------------------------------------------------------


def test_removing_a_member_in_flight_revokes_their_keys_and_keeps_their_spend(gateway, wired):
    from django.contrib.auth import get_user_model

    from tenants.models import Member

    # given: bob's key with calls in flight
    bob = Member.objects.create(
        organization=wired.org, role="member", user=get_user_model().objects.create_user("bob", "bob@example.com", "pw")
    )
    key = other_key(wired)
    ApiKey.objects.filter(pk=key.pk).update(member=bob)
    slow_echo(wired, delay_ms=1000)
    futures = burst(gateway, 4, authorization=f"Bearer {OTHER_KEY}")
    wait_in_flight(4)
    api = httpx.Client(
        base_url=gateway.url + f"/api/orgs/{wired.org.slug}",
        headers={"authorization": f"Bearer {token(wired, 'write')}"},
        timeout=30,
    )
    # when
    assert api.delete(f"/members/{bob.id}/").status_code == 204
    # then: the calls in flight are charged to bob by name; his key no longer works
    assert all(r.status_code == 200 for r in results(futures))
    wait_settled()
    records = list(UsageRecord.objects.all())
    assert len(records) == 4 and all(r.cost_nano > 0 and r.member_id is None for r in records)
    assert {r.subject["member"]["name"] for r in records} == {str(bob)}
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert chat(gateway, headers={"authorization": f"Bearer {OTHER_KEY}"}).status_code == 401
    changes = set(AuditLogEntry.objects.values_list("object_type", "action"))
    assert {("apikey", "update"), ("member", "delete")} <= changes
    assert_audit_clean()
