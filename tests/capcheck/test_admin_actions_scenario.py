"""`manage.py capcheck --scenario admin-actions`: the organization cap lowered, raised, moved to
another timezone and period and back, deleted and recreated, and the end customer deleted, all
while the burst is in flight — and the four properties still hold, read from the database
(including P1 from the period's usage records, not only the counters)."""

from __future__ import annotations

import pytest

from alerts.audit import audit_counters
from ledger.models import Budget, UsageRecord
from tenants.models import AuditLogEntry, EndCustomer

from .test_capcheck import capcheck

pytestmark = pytest.mark.django_db(transaction=True)


def test_admin_actions_mid_burst_hold_the_four_properties(gateway, slices_setting):
    # when
    out, error = capcheck(gateway, "--scenario", "admin-actions", "--concurrency", "40")
    # then
    assert error is None, out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert "budget_unavailable" not in out  # the edits are waited out, never answered 503
    actions = set(AuditLogEntry.objects.filter(actor="capcheck").values_list("object_type", "action"))
    assert actions == {("budget", "update"), ("budget", "delete"), ("budget", "create"), ("endcustomer", "delete")}
    # the customer deleted mid-burst is gone (a later request naming it creates a new one)
    deleted = AuditLogEntry.objects.get(actor="capcheck", object_type="endcustomer", action="delete")
    assert not EndCustomer.objects.filter(pk=int(deleted.object_id)).exists()
    budget = Budget.objects.get(scope="organization")
    assert budget.version == 1  # the recreated one
    # the customer's requests kept their cost and their subject
    # (a request after the deletion may name the customer again and create a new one: only the
    # deleted customer's records must carry its frozen name)
    charged = UsageRecord.objects.filter(subject__end_customer__id=int(deleted.object_id))
    assert charged.exists() and all(r.subject["end_customer"]["name"] == "capcheck-customer" for r in charged)
    report = audit_counters(record=False)
    assert report.drifts == [] and report.request_drifts == []
