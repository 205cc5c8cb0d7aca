"""Refused means nothing written: the rows a first call creates for the subjects its headers name
(the end customer, its project's default cap, a run's budget, their windows and audit entries)
are created in the transaction that admits it, so a refused call leaves none of them; and the
caps still hold when first calls of one new customer or run race."""

from __future__ import annotations

import httpx
import pytest

from gateway.admission import subjects
from gateway.admission.service import admit
from gateway.admission.subjects import payer
from ledger.errors import BudgetExceeded
from ledger.instances import register
from ledger.models import Budget, Window
from tenants.models import ApiKey, AuditLogEntry, EndCustomer
from tests.concurrency import race
from tests.conftest import usd
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]


def _refuse_every_request(wired) -> Budget:
    """A key whose every request is refused, in a project with a default customer cap and an
    organization with a default run budget: every first call would create rows."""
    wired.project.default_customer_budget_nano = usd("1")
    wired.project.save()
    wired.org.default_run_budget_nano = usd("1")
    wired.org.save()
    return wired.budget(amount="0.0001", scope="key", api_key=wired.key)


def _send_distinct(gateway, n: int) -> list[int]:
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as client:
        return [
            client.post(
                "/v1/chat/completions",
                json={"model": "echo-1", "messages": MSG, "max_tokens": 10},
                headers={"x-capgate-customer": f"cust-{i}", "x-capgate-run": f"run-{i}"},
            ).status_code
            for i in range(n)
        ]


def _written_for_subjects(cap: Budget) -> dict[str, int]:
    return {
        "end customers": EndCustomer.objects.count(),
        "budgets": Budget.objects.exclude(pk=cap.pk).count(),
        "windows": Window.objects.exclude(budget=cap).count(),
        "audit rows": AuditLogEntry.objects.count(),
    }


def test_refused_first_calls_create_no_customer_budget_window_or_audit_row(gateway, wired, slices_mode):
    # given: a key whose every request is refused
    cap = _refuse_every_request(wired)
    # when: 300 requests, each naming a new end customer and a new run
    statuses = _send_distinct(gateway, 300)
    # then: all refused by the key's cap, and nothing written for the subjects they named
    assert statuses == [402] * 300
    assert _written_for_subjects(cap) == {"end customers": 0, "budgets": 0, "windows": 0, "audit rows": 0}


def test_founding_removal_leaves_a_refused_calls_rows_behind(gateway, wired, slices_mode, monkeypatch):
    # what the guard prevents: the rows committed on their own, before the admission refuses
    monkeypatch.setattr(subjects.GUARDS, "found_in_admission", False)
    cap = _refuse_every_request(wired)
    assert _send_distinct(gateway, 5) == [402] * 5
    written = _written_for_subjects(cap)
    assert written["end customers"] == 5 and written["budgets"] == 10 and written["audit rows"] == 10


def test_an_admitted_first_call_keeps_its_customer_and_budgets(gateway, wired, slices_mode):
    _refuse_every_request(wired)
    Budget.objects.filter(scope="key").delete()
    assert _send_distinct(gateway, 2) == [200, 200]
    assert EndCustomer.objects.count() == 2
    assert Budget.objects.filter(scope="end_customer").count() == 2
    assert Budget.objects.filter(scope="run").count() == 2


WORST = usd("0.01")


@pytest.mark.parametrize("who", ["customer", "run", "both"])
@pytest.mark.parametrize("sliced", [False, True], ids=["slices-off", "slices-on"])
def test_concurrent_first_calls_of_one_new_subject_hold_its_cap(acme, settings, monkeypatch, who, sliced):
    # given: a $0.065 cap for the new customer (its project's default) and for the new run:
    # room for exactly 6 worst cases of $0.01
    from ledger import slices

    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": sliced}
    acme.project.default_customer_budget_nano = usd("0.065")
    acme.project.save()
    owner = register().id
    headers = {
        "customer_id": "new-customer" if who in ("customer", "both") else None,
        "run_id": "new-run" if who in ("run", "both") else None,
        "run_budget_usd": "0.065" if who in ("run", "both") else None,
    }

    def attempt(i: int) -> bool:
        try:
            admit(
                payer=payer(key=acme.key, **headers),
                request_id=f"req-{i}",
                model="m",
                amount_nano=WORST,
                owner_id=owner,
                sliced=sliced,
            )
            return True
        except BudgetExceeded:
            return False

    # when: 24 first calls at once
    admitted = sum(race(24, attempt))
    # then: exactly what the cap holds, one customer, one budget per new subject
    assert admitted == 6
    if who != "run":
        assert EndCustomer.objects.count() == 1
        assert Budget.objects.filter(scope="end_customer").count() == 1
    if who != "customer":
        assert Budget.objects.filter(scope="run").count() == 1
    for w in Window.objects.all():
        assert w.reserved_nano <= usd("0.065")


def _first_calls(gateway, headers_of, n: int, path: str = "/v1/chat/completions", key: str = KEY):
    body = {"model": "echo-1", "messages": MSG, "max_tokens": 10}
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as client:
        return [client.post(path, json=body, headers=headers_of(i)) for i in range(n)]


@pytest.mark.parametrize(
    "setting,headers_of,code",
    [
        ("NEW_CUSTOMERS_PER_KEY_PER_MINUTE", lambda i: {"x-capgate-customer": f"c-{i}"}, "too_many_new_end_customers"),
        (
            "NEW_RUNS_PER_KEY_PER_MINUTE",
            lambda i: {"x-capgate-run": f"r-{i}", "x-capgate-run-budget-usd": "1"},
            "too_many_new_runs",
        ),
    ],
    ids=["customers", "runs"],
)
def test_a_key_names_a_limited_number_of_new_subjects_a_minute(gateway, wired, settings, setting, headers_of, code):
    # given: a key may name 5 new customers (or runs) a minute
    settings.CAPGATE = {**settings.CAPGATE, setting: 5}
    # when: it names 8
    replies = _first_calls(gateway, headers_of, 8)
    # then: 5 served, 3 refused with 429 in the endpoint's shape, and nothing written for those
    assert [r.status_code for r in replies] == [200] * 5 + [429] * 3
    err = replies[-1].json()["error"]
    assert (err["type"], err["code"]) == ("rate_limit_error", code)
    assert 1 <= int(replies[-1].headers["retry-after"]) <= 60
    assert EndCustomer.objects.count() + Budget.objects.filter(scope="run").count() == 5
    # the subjects it already named are not new: served
    assert [r.status_code for r in _first_calls(gateway, headers_of, 2)] == [200, 200]
    # the Anthropic endpoint answers in its own shape
    (msg,) = _first_calls(gateway, lambda i: headers_of(100), 1, path="/v1/messages")
    assert msg.status_code == 429 and msg.json()["type"] == "error"
    assert msg.json()["error"]["type"] == "rate_limit_error"
    # another key has its own count
    raw, prefix, digest = ApiKey.generate()
    ApiKey.objects.create(organization=wired.org, project=wired.project, name="k2", prefix=prefix, key_hash=digest)
    assert _first_calls(gateway, lambda i: headers_of(200), 1, key=raw)[0].status_code == 200


def test_new_subject_limits_off_at_zero(gateway, wired, settings):
    settings.CAPGATE = {**settings.CAPGATE, "NEW_CUSTOMERS_PER_KEY_PER_MINUTE": 0}
    replies = _first_calls(gateway, lambda i: {"x-capgate-customer": f"z-{i}"}, 12)
    assert [r.status_code for r in replies] == [200] * 12
