"""capcheck's billing scenarios (capcheck/billing.py) against a live server: server
tools, service tiers and a failing-over route alias hold the four properties and the books match
what the provider billed; with the service tier dropped from the worst case the cap leaks."""

from __future__ import annotations

import pytest

from gateway.admission import service
from tests.capcheck.test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("scenario", ["server-tools", "service-tier", "route-alias"])
def test_billing_scenarios_hold_the_four_properties_and_the_books_match(gateway, scenario):
    out, error = capcheck(gateway, "--scenario", scenario, "--concurrency", "30")
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out


def test_service_tier_scenario_fails_when_the_tier_is_left_out_of_the_worst_case(gateway, monkeypatch):
    # the guard removed: every target reserves at standard rates, half the priority bill
    monkeypatch.setattr(service.Target, "tier", lambda self, requested: None)
    out, error = capcheck(
        gateway,
        "--scenario",
        "service-tier",
        "--concurrency",
        "30",
        "--cap-usd",
        "0.2",
        "--worst-usd",
        "0.02",
        "--actual-usd",
        "0.018",
    )
    assert error is not None, out
    assert "above its reserved worst case" in out
