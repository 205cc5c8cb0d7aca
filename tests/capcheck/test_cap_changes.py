"""`manage.py capcheck --scenario cap-appears | narrower-budget`: a blocking cap switched on while
the burst is in flight counts every request in flight, and a narrower budget created while slices
are live refuses none of the requests it has room for — slices on and off."""

from __future__ import annotations

import pytest

from ledger.models import Budget, Window

from .test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cap_switched_on_mid_burst_counts_every_request_in_flight(gateway, slices_setting):
    out, error = capcheck(gateway, "--scenario", "cap-appears", "--concurrency", "60")
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert "the organization budget switched from alert to block" in out
    cap = Budget.objects.get(scope="organization")
    assert cap.mode == "block" and cap.version == 2
    window = Window.objects.get(budget=cap, budget_version=2)
    assert window.seed_reserved_nano > 0  # requests were in flight, and it carried them


def test_a_narrower_budget_mid_burst_refuses_nothing_it_has_room_for(gateway, slices_setting, monkeypatch):
    # The burst's 60 clients share this process with the gateway: under a loaded suite its
    # recalls can take longer than production's 1 s bound. The rule is the wait, not its length.
    from ledger import slices

    monkeypatch.setattr(slices, "RECALL_WAIT_SECONDS", 5.0)
    out, error = capcheck(gateway, "--scenario", "narrower-budget", "--concurrency", "60")
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert "key A budget of" in out
    assert "key_budget" not in out.split("refused by code", 1)[1].split("\n", 1)[0]
