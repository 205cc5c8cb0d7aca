"""Forms people can read: the budget form shows the chosen scope's subject only and "add budget"
preselects it; revoke and remove ask first; errors look like errors. Outsiders still get 404."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from ledger.models import Budget
from tests.api.conftest import Org

from ..api.test_isolation import state
from .test_dashboard import browser


def scope_subjects(page: str) -> dict:
    found = re.search(r'<script id="scope-subjects" type="application/json">(.*?)</script>', page)
    assert found, "the budget form carries its scope -> subject map"
    return json.loads(found.group(1))


@pytest.mark.django_db
def test_add_budget_from_a_customer_row_preselects_it(org_a: Org):
    c = browser(org_a.owner)
    projects = c.get(reverse("dashboard:projects", args=[org_a.slug])).content.decode()
    link = f"?scope=end_customer&amp;end_customer={org_a.customer.id}"
    assert link in projects
    page = c.get(reverse("dashboard:budget_new", args=[org_a.slug]) + link.replace("&amp;", "&")).content.decode()
    assert re.search(rf'<option value="{org_a.customer.id}" selected>cust-1', page)
    assert '<option value="end_customer" selected>' in page
    assert scope_subjects(page) == {
        "organization": None,
        "project": "project",
        "member": "member",
        "key": "api_key",
        "end_customer": "end_customer",
        "run": "run_id",
    }
    # and from a key row
    keys = c.get(reverse("dashboard:keys", args=[org_a.slug])).content.decode()
    assert f"?scope=key&amp;api_key={org_a.tenant.key.id}" in keys


@pytest.mark.django_db
def test_budget_for_a_preselected_customer_is_created(org_a: Org):
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:budget_new", args=[org_a.slug]),
        {
            "scope": "end_customer",
            "end_customer": org_a.customer.id,
            "period": "month",
            "timezone": "UTC",
            "mode": "block",
            "amount_usd": "2",
        },
    )
    assert r.status_code == 302
    assert Budget.objects.get(scope="end_customer").end_customer == org_a.customer


@pytest.mark.django_db
def test_outsider_cannot_preselect_into_or_post_to_another_org(org_a: Org, org_b: Org):
    c = browser(org_b.owner)
    before = state()
    url = reverse("dashboard:budget_new", args=[org_a.slug])
    assert c.get(f"{url}?scope=end_customer&end_customer={org_a.customer.id}").status_code == 404
    assert (
        c.post(url, {"scope": "end_customer", "end_customer": org_a.customer.id, "amount_usd": "1"}).status_code == 404
    )
    # their own form does not offer acme's customer, and posting its id is an error
    own = reverse("dashboard:budget_new", args=[org_b.slug])
    page = c.get(f"{own}?scope=end_customer&end_customer={org_a.customer.id}").content.decode()
    assert f'<option value="{org_a.customer.id}" selected>' not in page
    r = c.post(
        own,
        {
            "scope": "end_customer",
            "end_customer": org_a.customer.id,
            "period": "month",
            "timezone": "UTC",
            "mode": "block",
            "amount_usd": "1",
        },
    )
    assert r.status_code == 200 and "end_customer" in r.context["form"].errors
    assert state() == before


@pytest.mark.django_db
def test_revoke_and_remove_ask_for_confirmation(org_a: Org):
    c = browser(org_a.owner)
    for page, action in [("keys", "key_revoke"), ("members", "member_remove"), ("projects", "customer_delete")]:
        html = c.get(reverse(f"dashboard:{page}", args=[org_a.slug])).content.decode()
        forms = re.findall(r'<form class="inline" method="post" action="[^"]*/(?:revoke|remove|delete)/"[^>]*>', html)
        assert forms, (page, action)
        assert all('onsubmit="return confirm(' in f for f in forms), (page, forms)
    html = c.get(reverse("dashboard:budget_edit", args=[org_a.slug, org_a.budget.id])).content.decode()
    assert "return confirm('Delete monthly?" in html


@pytest.mark.django_db
def test_errors_look_like_errors(org_a: Org):
    c = browser(org_a.owner)
    before = state()
    r = c.post(
        reverse("dashboard:budget_new", args=[org_a.slug]),
        {"scope": "project", "amount_usd": "-1", "period": "month", "timezone": "UTC", "mode": "block"},
    )
    html = r.content.decode()
    assert r.status_code == 200
    assert 'class="error-summary" role="alert"' in html
    assert re.search(r'<p data-field="amount_usd" class="invalid">', html)
    assert not re.search(r'<p data-field="name" class="invalid">', html)
    # a service refusal shown as a message is styled as an error, not as a success
    r = c.post(reverse("dashboard:member_remove", args=[org_a.slug, org_a.member_row.id]), follow=True)
    assert '<li class="error" role="alert">' in r.content.decode()  # the last owner stays
    assert state() == before
