"""The dashboard's side of API tokens following membership: a token made on the tokens page is
the signed-in member's, the list says whose each token is, and removing or demoting a member on
the members page revokes or narrows their tokens at once; an outsider gets 404 and changes
nothing."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tenants.models import ApiToken, AuditLogEntry, Member
from tests.api.conftest import Org, client
from tests.api.test_isolation import state


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def owner_cells(page: str) -> dict[str, str]:
    """token name -> the text of its owner cell."""
    rows = re.findall(r"<tr><td>([^<]+)</td><td><code>[^<]*</code></td>\s*<td class=\"token-owner\">(.*?)</td>", page)
    return {name: re.sub(r"<[^>]+>", "", cell).strip() for name, cell in rows}


def new_token(c: Client, org: Org, name: str, scope: str = "write") -> str:
    r = c.post(reverse("dashboard:tokens", args=[org.slug]), {"name": name, "scope": scope})
    assert r.status_code == 200, r.content
    return r.context["created"][1]


def raise_cap(org: Org, raw: str) -> int:
    url = f"/api/orgs/{org.slug}/budgets/{org.budget.id}/"
    return client(token=raw).patch(url, {"amount_usd": "1000000"}, format="json").status_code


@pytest.mark.django_db
def test_a_token_made_on_the_dashboard_is_the_members_and_the_list_says_whose(org_a: Org, role_users):
    admin_user, admin = role_users["admin"]
    new_token(browser(admin_user), org_a, "admin-ci")
    new_token(browser(org_a.owner), org_a, "owner-ci", scope="read")
    assert ApiToken.objects.get(name="admin-ci").member == admin
    assert ApiToken.objects.get(name="owner-ci").member == org_a.member_row
    page = browser(org_a.owner).get(reverse("dashboard:tokens", args=[org_a.slug])).content.decode()
    cells = owner_cells(page)
    assert cells["admin-ci"] == "admin@acme.test" and cells["owner-ci"] == "owner@acme.test"
    # once the admin is removed, the list still names them, as no longer a member
    browser(org_a.owner).post(reverse("dashboard:member_remove", args=[org_a.slug, admin.id]))
    page = browser(org_a.owner).get(reverse("dashboard:tokens", args=[org_a.slug])).content.decode()
    assert owner_cells(page)["admin-ci"] == "admin@acme.test (no longer a member)"


@pytest.mark.django_db
def test_removing_a_member_on_the_dashboard_revokes_their_token_at_once(org_a: Org, org_b: Org, role_users):
    admin_user, admin = role_users["admin"]
    raw = new_token(browser(admin_user), org_a, "admin-ci")
    # given: an outsider's removal is 404 and changes nothing
    before = (state(), list(ApiToken.objects.values_list("id", "revoked_at")))
    r = browser(org_b.owner).post(reverse("dashboard:member_remove", args=[org_a.slug, admin.id]))
    assert r.status_code == 404
    assert (state(), list(ApiToken.objects.values_list("id", "revoked_at"))) == before
    # when: the owner removes the admin
    browser(org_a.owner).post(reverse("dashboard:member_remove", args=[org_a.slug, admin.id]))
    # then: the token is refused and the cap unchanged; its revocation is audited
    assert not Member.objects.filter(pk=admin.pk).exists()
    assert raise_cap(org_a, raw) == 401
    org_a.budget.refresh_from_db()
    assert org_a.budget.amount_nano == 5_000_000_000
    token = ApiToken.objects.get(name="admin-ci")
    assert token.revoked_at is not None
    assert AuditLogEntry.objects.filter(object_type="apitoken", object_id=str(token.id), action="update").exists()


@pytest.mark.django_db
def test_demoting_a_member_on_the_dashboard_narrows_their_token_at_once(org_a: Org, org_b: Org, role_users):
    admin_user, admin = role_users["admin"]
    raw = new_token(browser(admin_user), org_a, "admin-ci")
    r = browser(org_b.owner).post(reverse("dashboard:member_role", args=[org_a.slug, admin.id]), {"role": "viewer"})
    assert r.status_code == 404
    assert raise_cap(org_a, raw) == 200  # still an admin: the outsider changed nothing
    browser(org_a.owner).post(reverse("dashboard:member_role", args=[org_a.slug, admin.id]), {"role": "viewer"})
    assert raise_cap(org_a, raw) == 403
    org_a.budget.refresh_from_db()
    assert org_a.budget.amount_nano == 1_000_000 * 10**9  # the one raise made while an admin
    page = browser(org_a.owner).get(reverse("dashboard:tokens", args=[org_a.slug])).content.decode()
    assert re.search(r"admin-ci.*?<td>write</td><td>viewer</td>", page, re.S)
