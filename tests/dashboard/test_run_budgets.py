"""Per-run budgets (one per X-Capgate-Run id) do not flood the budgets page or the overview: they
are counted there and listed on a tab of their own, newest first, paginated and searchable. An
outsider gets 404 and sees none of it."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.views.manage import RUN_PAGE
from ledger.models import Budget
from tests.api.conftest import Org

from .test_dashboard import browser


def budgets_url(o: Org) -> str:
    return reverse("dashboard:budgets", args=[o.slug])


def shown_budgets(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'data-budget="(\d+)"', html)]


def add_runs(o: Org, n: int, prefix: str = "run") -> list[Budget]:
    return [o.tenant.budget(amount="1", scope="run", period="lifetime", run_id=f"{prefix}-{i:03}") for i in range(n)]


@pytest.mark.django_db
def test_run_budgets_are_counted_not_listed_among_the_standing_budgets(org_a: Org, org_b: Org):
    # given: acme's standing "monthly" budget (fixtures) and 70 run budgets; globex has runs of its own
    standing = list(Budget.objects.filter(organization=org_a.tenant.org).values_list("id", flat=True))
    add_runs(org_a, 70)
    add_runs(org_b, 3, prefix="globex")
    # when
    html = browser(org_a.owner).get(budgets_url(org_a)).content.decode()
    # then: only the standing budgets are drawn, and the run tab says how many runs there are
    assert shown_budgets(html) == standing
    assert '<span id="run-count">70</span>' in html
    assert "run-000" not in html


@pytest.mark.django_db
def test_the_run_tab_lists_runs_newest_first_in_pages_and_searches_by_run_id(org_a: Org):
    # given
    runs = add_runs(org_a, RUN_PAGE + 10)
    c = browser(org_a.owner)
    # when: the first and second pages of the tab
    first = c.get(budgets_url(org_a), {"tab": "runs"}).content.decode()
    second = c.get(budgets_url(org_a), {"tab": "runs", "page": 2}).content.decode()
    # then: newest first, RUN_PAGE a page, every run once, no standing budget among them
    newest_first = [b.id for b in reversed(runs)]
    assert shown_budgets(first) == newest_first[:RUN_PAGE]
    assert shown_budgets(second) == newest_first[RUN_PAGE:]
    assert "page 1 of 2" in first and "?tab=runs&amp;page=2" in first
    # when: a search by run id
    found = c.get(budgets_url(org_a), {"tab": "runs", "q": "run-00"}).content.decode()
    # then: run-000 .. run-009, and the pages keep the search
    assert shown_budgets(found) == [b.id for b in reversed(runs[:10])]


@pytest.mark.django_db
def test_the_overview_counts_run_budgets_and_links_their_tab(org_a: Org):
    add_runs(org_a, 12)
    html = browser(org_a.owner).get(reverse("dashboard:overview", args=[org_a.slug])).content.decode()
    assert "run-0" not in html
    found = re.search(r'<p class="small" id="run-budgets"><a href="([^"]+)">12 per-run budgets</a>', html)
    assert found and found.group(1) == budgets_url(org_a) + "?tab=runs"


@pytest.mark.django_db
def test_the_budgets_page_queries_do_not_grow_with_run_budgets(org_a: Org):
    c = browser(org_a.owner)
    add_runs(org_a, 2)
    with CaptureQueriesContext(connection) as few:
        assert c.get(budgets_url(org_a)).status_code == 200
    add_runs(org_a, 200, prefix="more")
    with CaptureQueriesContext(connection) as many:
        assert c.get(budgets_url(org_a)).status_code == 200
    assert len(many) == len(few)


@pytest.mark.django_db
def test_outsider_gets_404_on_the_run_tab(org_a: Org, org_b: Org):
    add_runs(org_a, 3)
    r = browser(org_b.owner).get(budgets_url(org_a), {"tab": "runs"})
    assert r.status_code == 404
    assert b"run-000" not in r.content
