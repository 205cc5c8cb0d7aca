"""Every place the gateway answers a budget's 402 tells alerts (alerts.alerts.note_refusal): the
proxy, the reservation API and a job submission each leave a refusal event naming its window and
what tipped it, written off the request's thread."""

from __future__ import annotations

import time

import httpx

from alerts.models import AlertEvent
from tests.gateway.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}


def _refusal_event(timeout: float = 10.0) -> AlertEvent:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = AlertEvent.objects.filter(kind=AlertEvent.Kind.REFUSAL).first()
        if event is not None:
            return event
        time.sleep(0.05)
    raise AssertionError("no refusal event was written")


def test_a_proxied_refusal_is_alerted(gateway, wired):
    budget = wired.budget(amount="0.0001")
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000},
        headers={**AUTH, "X-Capgate-Customer": "cust-1"},
        timeout=30,
    )
    assert r.status_code == 402, r.text
    event = _refusal_event()
    assert event.window.budget_id == budget.id
    assert event.tipped_by["request_id"] == r.headers["x-capgate-request-id"]
    assert (event.tipped_by["model"], event.tipped_by["customer"]) == ("echo-1", "cust-1")


def test_a_reservation_api_refusal_is_alerted(gateway, wired):
    budget = wired.budget(amount="0.10")
    r = httpx.post(gateway.url + "/v1/reservations", json={"amount_usd": "0.20"}, headers=AUTH, timeout=30)
    assert r.status_code == 402, r.text
    event = _refusal_event()
    assert event.window.budget_id == budget.id
    assert event.tipped_by["request_id"] == r.headers["x-capgate-request-id"]


def test_a_job_submission_refusal_is_alerted(gateway, wired):
    budget = wired.budget(amount="0.0001")
    r = httpx.post(
        gateway.url + "/v1/messages/batches",
        json={
            "requests": [
                {
                    "custom_id": "a",
                    "params": {
                        "model": "claude-test",
                        "max_tokens": 1000,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                }
            ]
        },
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert r.status_code == 402, r.text
    event = _refusal_event()
    assert event.window.budget_id == budget.id
    assert event.tipped_by["model"] == "claude-test"
