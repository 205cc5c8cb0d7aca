"""The dashboard's rate-limit page: the owner creates a limit through the form and sees it, bad
values are form errors that change nothing, a viewer cannot create, an outsider gets 404 and
changes nothing. Each guard has its removal test."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from dashboard import access as dashboard_access
from dashboard.views import crud
from ratelimits.models import RateLimit
from tenants.audit import Actor
from tenants.models import AuditLogEntry, Organization
from tenants.selectors import Access
from tests.api.conftest import Org

from .test_api import limits, org_limit


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def url(org: Org, name: str, *args) -> str:
    return reverse(f"dashboard:{name}", args=[org.slug, *args])


@pytest.mark.django_db
def test_owner_creates_a_rate_limit_and_sees_it(org_a: Org):
    c = browser(org_a.owner)
    # when
    r = c.post(
        url(org_a, "rate_limit_new"),
        {
            "name": "ci-key",
            "scope": "key",
            "api_key": org_a.tenant.key.id,
            "requests_per_minute": "120",
            "tokens_per_minute": "250000",
        },
    )
    # then
    assert r.status_code == 302, r.content.decode()[:2000]
    assert r["Location"] == url(org_a, "rate_limits")
    limit = RateLimit.objects.get(name="ci-key")
    assert (
        limit.organization,
        limit.scope,
        limit.api_key,
        limit.requests_per_minute,
        limit.tokens_per_minute,
    ) == (org_a.tenant.org, "key", org_a.tenant.key, 120, 250_000)
    page = c.get(url(org_a, "rate_limits")).content.decode()
    assert "ci-key" in page and "120" in page and "250000" in page and org_a.tenant.key.name in page
    assert AuditLogEntry.objects.filter(object_type="ratelimit", action="create", actor="owner@acme.test").exists()


@pytest.mark.django_db
def test_owner_edits_the_rates_but_not_the_subject_and_deletes(org_a: Org):
    c = browser(org_a.owner)
    limit = org_limit(org_a, name="whole")
    other = org_a.tenant.add_key("other")
    r = c.post(
        url(org_a, "rate_limit_edit", limit.id),
        {"name": "whole", "scope": "key", "api_key": other.id, "requests_per_minute": "7"},
    )  # subject disabled: ignored
    assert r.status_code == 302, r.content.decode()[:2000]
    limit.refresh_from_db()
    assert (limit.scope, limit.api_key, limit.requests_per_minute) == ("organization", None, 7)
    assert c.post(url(org_a, "rate_limit_delete", limit.id)).status_code == 302
    assert not RateLimit.objects.exists()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (
            {"scope": "organization", "requests_per_minute": "-5"},
            "requests_per_minute",
            "A whole number from 1 to 1,000,000,000,000,000, or empty.",
        ),
        (
            {"scope": "organization", "requests_per_minute": "0"},
            "requests_per_minute",
            "A whole number from 1 to 1,000,000,000,000,000, or empty.",
        ),
        (
            {"scope": "organization", "tokens_per_minute": "0"},
            "tokens_per_minute",
            "A whole number from 1 to 1,000,000,000,000,000, or empty.",
        ),
        (
            {"scope": "organization", "requests_per_minute": "ten"},
            "requests_per_minute",
            "A whole number from 1 to 1,000,000,000,000,000, or empty.",
        ),
        (
            {"scope": "organization"},
            "requests_per_minute",
            "Set requests per minute, tokens per minute, or both.",
        ),
        (
            {"scope": "key", "requests_per_minute": "5"},
            "api_key",
            "A key rate limit names its api key.",
        ),
        (
            {"scope": "galaxy", "requests_per_minute": "5"},
            "scope",
            "Scope must be one of organization, project, key, end_customer.",
        ),
    ],
)
@pytest.mark.django_db
def test_bad_value_is_a_form_error_and_changes_nothing(org_a: Org, data, field, message):
    c = browser(org_a.owner)
    before = limits()
    r = c.post(url(org_a, "rate_limit_new"), data)
    assert r.status_code == 200
    assert message in r.context["form"].errors[field][0]
    assert message in r.content.decode()
    assert limits() == before


@pytest.mark.django_db
def test_a_subject_from_another_org_is_a_form_error(org_a: Org, org_b: Org):
    c = browser(org_a.owner)
    before = limits()
    r = c.post(
        url(org_a, "rate_limit_new"),
        {"scope": "key", "api_key": org_b.tenant.key.id, "requests_per_minute": "5"},
    )
    assert r.status_code == 200 and "Select a valid choice." in r.context["form"].errors["api_key"][0]
    assert limits() == before


@pytest.mark.django_db
def test_viewer_sees_the_page_but_cannot_create_edit_or_delete(org_a: Org, role_users):
    c = browser(role_users["viewer"][0])
    limit = org_limit(org_a, name="whole")
    before = limits()
    page = c.get(url(org_a, "rate_limits"))
    assert page.status_code == 200 and "whole" in page.content.decode()
    assert url(org_a, "rate_limit_new") not in page.content.decode()
    assert c.get(url(org_a, "rate_limit_new")).status_code == 403
    assert (
        c.post(url(org_a, "rate_limit_new"), {"scope": "organization", "requests_per_minute": "5"}).status_code == 403
    )
    assert c.get(url(org_a, "rate_limit_edit", limit.id)).status_code == 403
    assert c.post(url(org_a, "rate_limit_edit", limit.id), {"requests_per_minute": "5"}).status_code == 403
    assert c.post(url(org_a, "rate_limit_delete", limit.id)).status_code == 403
    assert limits() == before


@pytest.mark.django_db
def test_viewer_guard_removed_creates(org_a: Org, role_users, monkeypatch):
    # The removal test of the one above: the role is what stops a viewer.
    monkeypatch.setattr(Access, "can_manage", property(lambda self: True))
    r = browser(role_users["viewer"][0]).post(
        url(org_a, "rate_limit_new"), {"scope": "organization", "requests_per_minute": "5"}
    )
    assert r.status_code == 302
    assert RateLimit.objects.filter(organization=org_a.tenant.org).count() == 1


def outsider_pages(org: Org, limit: RateLimit) -> list[tuple[str, str]]:
    return [
        ("get", url(org, "rate_limits")),
        ("get", url(org, "rate_limit_new")),
        ("post", url(org, "rate_limit_new")),
        ("get", url(org, "rate_limit_edit", limit.id)),
        ("post", url(org, "rate_limit_edit", limit.id)),
        ("post", url(org, "rate_limit_delete", limit.id)),
    ]


@pytest.mark.django_db
def test_outsider_gets_404_and_changes_nothing(org_a: Org, org_b: Org):
    c = browser(org_b.owner)
    limit = org_limit(org_a, name="whole")
    before = limits()
    for method, page in outsider_pages(org_a, limit):
        r = getattr(c, method)(page, {"scope": "organization", "requests_per_minute": "1"})
        assert r.status_code == 404, (method, page, r.status_code)
    assert limits() == before


@pytest.mark.django_db
def test_outsider_guard_removed_creates_in_acme(org_a: Org, org_b: Org, monkeypatch):
    # The removal test of the one above: without the membership lookup, globex's owner acts on acme.
    def anyone_is_owner(*, user, slug: str) -> Access:
        return Access(
            organization=Organization.objects.get(slug=slug),
            role="owner",
            actor=Actor(label=user.email),
        )

    monkeypatch.setattr(dashboard_access, "access_for_user", anyone_is_owner)
    r = browser(org_b.owner).post(url(org_a, "rate_limit_new"), {"scope": "organization", "requests_per_minute": "1"})
    assert r.status_code == 302
    assert RateLimit.objects.filter(organization=org_a.tenant.org).count() == 1


@pytest.mark.django_db
def test_another_orgs_limit_is_404_under_your_own_org(org_a: Org, org_b: Org):
    c = browser(org_a.owner)
    theirs = org_limit(org_b, name="theirs")
    before = limits()
    assert c.get(url(org_a, "rate_limit_edit", theirs.id)).status_code == 404
    assert c.post(url(org_a, "rate_limit_edit", theirs.id), {"requests_per_minute": "1"}).status_code == 404
    assert c.post(url(org_a, "rate_limit_delete", theirs.id)).status_code == 404
    assert limits() == before


@pytest.mark.django_db
def test_another_orgs_limit_guard_removed_is_deleted(org_a: Org, org_b: Org, monkeypatch):
    # The removal test of the one above: the organization in the object lookup is the guard
    # (dashboard/views/crud.py's, for every resource's edit and delete).
    from django.shortcuts import get_object_or_404

    theirs = org_limit(org_b, name="theirs")
    monkeypatch.setattr(crud, "get_object_or_404", lambda model, pk, organization: get_object_or_404(model, pk=pk))
    assert browser(org_a.owner).post(url(org_a, "rate_limit_delete", theirs.id)).status_code == 302
    assert not RateLimit.objects.filter(pk=theirs.pk).exists()
