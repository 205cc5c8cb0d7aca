"""A bug after admission never leaves a request without a row or its room held until expiry:
it is charged at its worst case at once (the call may have gone out)."""

from __future__ import annotations

import httpx
import pytest

from gateway.upstream import proxy
from ledger.models import Reservation, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

BODY = {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def _boom(self, body, target):
    raise RuntimeError("a bug after admission")


def test_an_internal_error_after_admission_is_recorded_at_worst_case(gateway, wired, monkeypatch):
    monkeypatch.setattr(proxy.ProxyCall, "upstream_body", _boom)
    resp = httpx.post(
        gateway.url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    assert resp.status_code == 500
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == rec.reserved_nano > 0
    assert not Reservation.objects.exists()


def test_without_the_catch_the_reservation_is_left_held(gateway, wired, monkeypatch):
    monkeypatch.setattr(proxy.ProxyCall, "upstream_body", _boom)
    real = proxy.ProxyCall.record

    async def no_estimate(self, outcome, target=None):
        if outcome.error == "internal error after admission":
            return None  # the guard removed
        return await real(self, outcome, target)

    monkeypatch.setattr(proxy.ProxyCall, "record", no_estimate)
    httpx.post(gateway.url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    with pytest.raises(AssertionError, match="not settled"):
        wait_settled(timeout=2)
    assert Reservation.objects.exists() and not UsageRecord.objects.exists()
