"""The overview and the budgets page read each budget's state in a fixed number of queries: a
budget with no window for the current period shows its period's recorded spend, summed for all
such budgets of a scope and period in one grouped query, not one query each."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from budgets.selectors import statuses
from ledger.models import Budget, UsageRecord
from tenants.models import EndCustomer
from tests.api.conftest import Org
from tests.conftest import usd

from .test_dashboard import browser


def customer_caps(o: Org, n: int, prefix: str) -> list[Budget]:
    caps = []
    for i in range(n):
        customer = EndCustomer.objects.create(project=o.tenant.project, external_id=f"{prefix}-{i}")
        caps.append(o.tenant.budget(amount="5", scope="end_customer", end_customer=customer))
    return caps


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["dashboard:overview", "dashboard:budgets"])
def test_pages_do_not_query_per_windowless_budget(org_a: Org, page: str):
    c = browser(org_a.owner)
    url = reverse(page, args=[org_a.slug])
    customer_caps(org_a, 2, "few")
    with CaptureQueriesContext(connection) as few:
        assert c.get(url).status_code == 200
    customer_caps(org_a, 40, "many")
    with CaptureQueriesContext(connection) as many:
        assert c.get(url).status_code == 200
    assert len(many) == len(few)


@pytest.mark.django_db
def test_a_windowless_budget_shows_its_subjects_recorded_spend(org_a: Org):
    one, two, idle = customer_caps(org_a, 3, "c")
    now = timezone.now()
    for i, (cap, cost) in enumerate([(one, "0.25"), (one, "0.5"), (two, "1")]):
        UsageRecord.objects.create(
            organization=org_a.tenant.org,
            end_customer=cap.end_customer,
            request_id=f"u-{i}",
            status="served",
            cost_nano=usd(cost),
            admitted_at=now,
            applied=True,
        )
    spent = {s.budget.id: s.spent_nano for s in statuses(budgets=[one, two, idle], now=now)}
    assert spent == {one.id: usd("0.75"), two.id: usd("1"), idle.id: 0}
