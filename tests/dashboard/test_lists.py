"""Lists: keys show this month's spend and last use; end customers are searchable and paginated.
An outsider gets 404 and sees none of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import UsageRecord
from tenants.models import EndCustomer
from tests.api.conftest import Org

from ..api.test_isolation import state
from .test_dashboard import browser


def key_row(html: str, name: str) -> str:
    found = re.search(rf"<tr>\s*<td>{name}</td>.*?</tr>", html, re.S)
    assert found, name
    return found.group(0)


@pytest.mark.django_db
def test_keys_show_spend_this_month_and_last_use(org_a: Org, org_b: Org):
    # given: acme's default key spent $0.001 + $0.0025 (fixtures, today and yesterday); one record
    # from before this month does not count towards the month; globex's usage never counts
    now = timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    UsageRecord.objects.filter(request_id="acme-u1").update(admitted_at=max(month_start, now - timedelta(days=1)))
    UsageRecord.objects.create(
        request_id="acme-old",
        organization=org_a.tenant.org,
        project=org_a.tenant.project,
        api_key=org_a.tenant.key,
        model="echo-1",
        status="served",
        cost_nano=7 * 10**9,
        admitted_at=month_start - timedelta(days=3),
        applied=True,
    )
    idle = org_a.tenant.add_key("idle")
    # when
    html = browser(org_a.owner).get(reverse("dashboard:keys", args=[org_a.slug])).content.decode()
    # then
    row = key_row(html, "default")
    assert "$0.0035" in row and "$7" not in row
    assert re.search(r"(minute|second)s? ago", row)
    assert "never" in key_row(html, idle.name) and "$0.00" in key_row(html, idle.name)
    assert browser(org_b.owner).get(reverse("dashboard:keys", args=[org_a.slug])).status_code == 404


@pytest.mark.django_db
def test_customers_are_searchable_and_paginated(org_a: Org, org_b: Org):
    EndCustomer.objects.bulk_create(
        EndCustomer(project=org_a.tenant.project, external_id=f"user-{i:03}") for i in range(120)
    )
    c = browser(org_a.owner)
    url = reverse("dashboard:projects", args=[org_a.slug])
    first = c.get(url).content.decode()
    assert "121 end customers" in first and "page 1 of 3" in first
    assert "cust-1" in first and "user-048" in first and "user-049" not in first
    third = c.get(url + "?page=3").content.decode()
    assert "user-119" in third and "user-048" not in third
    found = c.get(url + "?q=USER-11").content.decode()
    assert "10 end customers matching" in found and "user-110" in found and "user-100" not in found
    assert "page 1 of" not in found and "cust-1" not in found
    # globex's customers are never listed, even when searched for
    EndCustomer.objects.create(project=org_b.tenant.project, external_id="globex-only")
    assert "globex-only" not in c.get(url + "?q=globex").content.decode()
    # and the outsider gets 404 for acme's list, searched or not, and changes nothing
    before = state()
    assert browser(org_b.owner).get(url + "?q=user").status_code == 404
    assert state() == before


@pytest.mark.django_db
def test_keys_are_paginated_and_searchable_and_the_query_count_stays_flat(org_a: Org):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.views.manage import KEY_PAGE

    c = browser(org_a.owner)
    url = reverse("dashboard:keys", args=[org_a.slug])
    with CaptureQueriesContext(connection) as few:
        c.get(url)
    for i in range(KEY_PAGE + 5):
        org_a.tenant.add_key(f"ci-{i:03}")
    with CaptureQueriesContext(connection) as many:
        first = c.get(url).content.decode()
    # one page is drawn, and reading it costs what a page of one key costs
    assert len(many) == len(few)
    assert first.count("<td><code>") == KEY_PAGE and "page 1 of 2" in first
    second = c.get(url, {"page": 2}).content.decode()
    total = org_a.tenant.org.api_keys.count()
    assert second.count("<td><code>") == total - KEY_PAGE and "page 2 of 2" in second
    found = c.get(url, {"q": "ci-00"}).content.decode()
    assert found.count("<td><code>") == 10 and "10 keys matching" in found
