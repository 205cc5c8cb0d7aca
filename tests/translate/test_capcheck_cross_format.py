"""capcheck at 200 concurrent on a cross-format route: chat requests bounded on their Anthropic
translation at the route's first target (a pricier model, unreachable), failing over to echo.
The four properties hold, and every served record is at echo's bill for the model called."""

from __future__ import annotations

import pytest

from capcheck.plan import Plan
from ledger.models import Reservation, UsageRecord
from tests.capcheck.conftest import slices_setting  # noqa: F401
from tests.capcheck.test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)


def test_cross_format_failover_at_200_concurrent_holds_the_four_properties(gateway, slices_setting):  # noqa: F811
    # when
    out, error = capcheck(gateway, "--scenario", "cross-format", "--concurrency", "200")
    # then
    assert error is None, out
    assert "cross-format · 200 concurrent" in out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert not Reservation.objects.exists()
    served = UsageRecord.objects.filter(status="served")
    assert served.exists()
    # every request was served by echo after the Anthropic target failed, one record each
    assert set(served.values_list("connection__kind", flat=True)) == {"echo"}
    # and those admitted before the Anthropic target was ejected (after its third connect failure)
    # were reserved at its price, twice echo's, on their translated body; the rest at echo's own
    planned = Plan(url=gateway.url).worst_nano  # the echo-only worst case the request is shaped for
    reserved = sorted({r.reserved_nano for r in served})
    assert reserved[-1] > 2 * planned and reserved[0] >= planned, reserved


def test_converse_cross_format_failover_at_200_concurrent_holds_the_four_properties(gateway, slices_setting):  # noqa: F811
    # when: the first target is a Bedrock connection on the Converse API, unreachable
    out, error = capcheck(gateway, "--scenario", "cross-format-converse", "--concurrency", "200")
    # then
    assert error is None, out
    assert "cross-format-converse · 200 concurrent" in out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert not Reservation.objects.exists()
    served = UsageRecord.objects.filter(status="served")
    assert served.exists() and set(served.values_list("connection__kind", flat=True)) == {"echo"}
    # those admitted before the Converse target was ejected were reserved at its price, twice
    # echo's, on their Converse body
    planned = Plan(url=gateway.url).worst_nano
    reserved = sorted({r.reserved_nano for r in served})
    assert reserved[-1] > 2 * planned and reserved[0] >= planned, reserved
