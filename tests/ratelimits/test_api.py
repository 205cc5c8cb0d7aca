"""Management API for rate limits: a write token manages them, a read token and a viewer only
read, an outsider gets 404 and changes nothing, and bad input is a 400 in the API's shape that
changes nothing. Each guard has its removal test."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from ratelimits import api as ratelimit_api
from ratelimits import services
from ratelimits.models import RateLimit
from tenants.api.views import OrgRelatedField
from tenants.models import AuditLogEntry
from tests.api.conftest import Org, client


def base(org: Org) -> str:
    return f"/api/orgs/{org.slug}/rate-limits/"


def limits() -> list:
    """Everything a rate-limit write could touch."""
    return [
        sorted(
            RateLimit.objects.values_list(
                "id",
                "organization_id",
                "name",
                "scope",
                "project_id",
                "api_key_id",
                "end_customer_id",
                "requests_per_minute",
                "tokens_per_minute",
            )
        ),
        AuditLogEntry.objects.filter(object_type="ratelimit").count(),
    ]


def org_limit(org: Org, **fields) -> RateLimit:
    return RateLimit.objects.create(
        organization=org.tenant.org,
        scope="organization",
        **({"name": "org", "requests_per_minute": 100} | fields),
    )


@pytest.mark.django_db
def test_write_token_lists_creates_updates_and_deletes(org_a: Org, org_b: Org):
    c = client(token=org_a.token_write)
    org_limit(org_b, name="theirs")
    # create: one per scope
    made = {}
    for scope, subject in [
        ("organization", {}),
        ("project", {"project": org_a.tenant.project.id}),
        ("key", {"api_key": org_a.tenant.key.id}),
        ("end_customer", {"end_customer": org_a.customer.id}),
    ]:
        r = c.post(
            base(org_a),
            {
                "name": f"per-{scope}",
                "scope": scope,
                **subject,
                "requests_per_minute": 60,
                "tokens_per_minute": 100_000,
            },
            format="json",
        )
        assert r.status_code == 201, r.json()
        made[scope] = r.json()["id"]
    key_limit = RateLimit.objects.get(pk=made["key"])
    assert (
        key_limit.organization,
        key_limit.api_key,
        key_limit.requests_per_minute,
        key_limit.tokens_per_minute,
    ) == (org_a.tenant.org, org_a.tenant.key, 60, 100_000)
    assert RateLimit.objects.get(pk=made["end_customer"]).end_customer == org_a.customer
    # list: acme's four, never globex's
    listed = c.get(base(org_a)).json()["results"]
    assert sorted(x["name"] for x in listed) == [
        "per-end_customer",
        "per-key",
        "per-organization",
        "per-project",
    ]
    assert c.get(f"{base(org_a)}{made['key']}/").json()["api_key"] == org_a.tenant.key.id
    # update the rates (one may be emptied while the other stays), audited
    r = c.patch(
        f"{base(org_a)}{made['key']}/",
        {"requests_per_minute": 30, "tokens_per_minute": None},
        format="json",
    )
    assert r.status_code == 200, r.json()
    key_limit.refresh_from_db()
    assert (key_limit.requests_per_minute, key_limit.tokens_per_minute) == (30, None)
    entry = AuditLogEntry.objects.get(object_type="ratelimit", action="update")
    assert entry.changes == {"requests_per_minute": [60, 30], "tokens_per_minute": [100_000, None]}
    assert entry.actor.startswith("token write-token")
    # both emptied: nothing left to limit
    r = c.patch(f"{base(org_a)}{made['key']}/", {"requests_per_minute": None}, format="json")
    assert r.status_code == 400 and "requests_per_minute" in r.json()["errors"], r.json()
    # the subject is fixed once created
    other = org_a.tenant.add_key("other")
    r = c.patch(f"{base(org_a)}{made['key']}/", {"api_key": other.id}, format="json")
    assert r.status_code == 400 and "api_key" in r.json()["errors"], r.json()
    r = c.patch(f"{base(org_a)}{made['key']}/", {"scope": "organization"}, format="json")
    assert r.status_code == 400 and "scope" in r.json()["errors"], r.json()
    key_limit.refresh_from_db()
    assert (key_limit.scope, key_limit.api_key, key_limit.requests_per_minute) == (
        "key",
        org_a.tenant.key,
        30,
    )
    # delete, audited
    assert c.delete(f"{base(org_a)}{made['key']}/").status_code == 204
    assert not RateLimit.objects.filter(pk=made["key"]).exists()
    assert AuditLogEntry.objects.filter(object_type="ratelimit", action="delete").count() == 1
    assert RateLimit.objects.filter(organization=org_b.tenant.org).count() == 1


@pytest.mark.parametrize("who", ["read_token", "viewer"])
@pytest.mark.django_db
def test_read_token_and_viewer_read_but_cannot_write(org_a: Org, role_users, who):
    c = client(token=org_a.token_read) if who == "read_token" else client(user=role_users["viewer"][0])
    limit = org_limit(org_a)
    before = limits()
    assert c.get(base(org_a)).json()["results"][0]["id"] == limit.id
    r = c.post(base(org_a), {"scope": "organization", "requests_per_minute": 5}, format="json")
    assert r.status_code == 403 and r.json()["code"] == "permission_denied", r.json()
    assert c.patch(f"{base(org_a)}{limit.id}/", {"requests_per_minute": 5}, format="json").status_code == 403
    assert c.delete(f"{base(org_a)}{limit.id}/").status_code == 403
    assert limits() == before


@pytest.mark.django_db
def test_read_token_guard_removed_lets_it_write(org_a: Org, monkeypatch):
    # The removal test of the one above: the write check is what stops a read token.
    monkeypatch.setattr(ratelimit_api.RateLimitViewSet, "can_write", lambda self, access: True)
    r = client(token=org_a.token_read).post(
        base(org_a), {"scope": "organization", "requests_per_minute": 5}, format="json"
    )
    assert r.status_code == 201
    assert RateLimit.objects.filter(organization=org_a.tenant.org).count() == 1


@pytest.mark.parametrize("who", ["outsider_token", "outsider_user"])
@pytest.mark.django_db
def test_outsider_gets_404_and_changes_nothing(org_a: Org, org_b: Org, who):
    c = client(token=org_b.token_write) if who == "outsider_token" else client(user=org_b.owner)
    limit = org_limit(org_a)
    before = limits()
    assert c.get(base(org_a)).status_code == 404
    assert c.post(base(org_a), {"scope": "organization", "requests_per_minute": 5}, format="json").status_code == 404
    assert c.get(f"{base(org_a)}{limit.id}/").status_code == 404
    assert c.patch(f"{base(org_a)}{limit.id}/", {"requests_per_minute": 5}, format="json").status_code == 404
    assert c.delete(f"{base(org_a)}{limit.id}/").status_code == 404
    assert limits() == before


@pytest.mark.django_db
def test_another_orgs_limit_is_404_under_your_own_org(org_a: Org, org_b: Org):
    theirs = org_limit(org_b)
    c = client(token=org_a.token_write)
    before = limits()
    assert c.get(f"{base(org_a)}{theirs.id}/").status_code == 404
    assert c.patch(f"{base(org_a)}{theirs.id}/", {"requests_per_minute": 5}, format="json").status_code == 404
    assert c.delete(f"{base(org_a)}{theirs.id}/").status_code == 404
    assert limits() == before


@pytest.mark.django_db
def test_another_orgs_limit_guard_removed_is_changed(org_a: Org, org_b: Org, monkeypatch):
    # The removal test of the one above: the organization filter on the queryset is the guard.
    theirs = org_limit(org_b)
    monkeypatch.setattr(ratelimit_api.RateLimitViewSet, "get_queryset", lambda self: RateLimit.objects.all())
    r = client(token=org_a.token_write).patch(f"{base(org_a)}{theirs.id}/", {"requests_per_minute": 5}, format="json")
    assert r.status_code == 200
    theirs.refresh_from_db()
    assert theirs.requests_per_minute == 5


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"scope": "organization", "requests_per_minute": -1}, "requests_per_minute"),
        ({"scope": "organization", "requests_per_minute": 0}, "requests_per_minute"),
        ({"scope": "organization", "tokens_per_minute": 0}, "tokens_per_minute"),
        ({"scope": "organization", "tokens_per_minute": -5000}, "tokens_per_minute"),
        (
            {"scope": "organization", "requests_per_minute": services.MAX_PER_MINUTE + 1},
            "requests_per_minute",
        ),
        ({"scope": "organization", "requests_per_minute": "many"}, "requests_per_minute"),
        ({"scope": "organization"}, "requests_per_minute"),  # limits nothing
        ({"scope": "galaxy", "requests_per_minute": 5}, "scope"),
        ({"requests_per_minute": 5}, "scope"),
        ({"scope": "key", "requests_per_minute": 5}, "api_key"),
        ({"scope": "organization", "requests_per_minute": 5, "project": "PROJECT"}, "project"),
        ({"scope": "project", "requests_per_minute": 5, "project": 999_999}, "project"),
        ({"scope": "organization", "requests_per_minute": 5, "name": "x" * 201}, "name"),
    ],
)
@pytest.mark.django_db
def test_bad_rate_limit_is_a_field_error_and_nothing_changes(org_a: Org, payload, field):
    if payload.get("project") == "PROJECT":
        payload = {**payload, "project": org_a.tenant.project.id}
    before = limits()
    r = client(token=org_a.token_write).post(base(org_a), payload, format="json")
    assert r.status_code == 400, r.json()
    assert r.json()["code"] == "invalid" and r.json()["detail"] and field in r.json()["errors"], r.json()
    assert limits() == before


@pytest.mark.django_db
def test_bad_update_is_a_field_error_and_nothing_changes(org_a: Org):
    limit = org_limit(org_a)
    before = limits()
    for payload, field in [
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"tokens_per_minute": -1}, "tokens_per_minute"),
        ({"requests_per_minute": None}, "requests_per_minute"),
    ]:
        r = client(token=org_a.token_write).patch(f"{base(org_a)}{limit.id}/", payload, format="json")
        assert r.status_code == 400 and field in r.json()["errors"], (payload, r.json())
    assert limits() == before


def _no_min(monkeypatch, name: str) -> None:
    """The serializer's own bound on a rate, removed."""
    monkeypatch.setitem(
        ratelimit_api.RateLimitSerializer._declared_fields,
        name,
        serializers.IntegerField(required=False, allow_null=True),
    )


@pytest.mark.django_db
def test_zero_limit_is_refused_by_the_service_without_the_serializer_bound(org_a: Org, monkeypatch):
    # Removal test of the serializer's min_value: the service refuses the same value itself
    # (the dashboard and apply reach it without a serializer).
    _no_min(monkeypatch, "requests_per_minute")
    r = client(token=org_a.token_write).post(
        base(org_a), {"scope": "organization", "requests_per_minute": 0}, format="json"
    )
    assert r.status_code == 400
    assert r.json()["errors"] == {
        "requests_per_minute": [f"A whole number from 1 to {services.MAX_PER_MINUTE:,}, or empty."]
    }
    assert not RateLimit.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_zero_limit_with_both_checks_removed_meets_the_database_constraint(org_a: Org, monkeypatch):
    # Removal test of the service check: with it and the serializer bound gone, only the
    # rate_limit_positive constraint stands between a 0/minute limit and the table.
    _no_min(monkeypatch, "requests_per_minute")
    monkeypatch.setattr(services, "_check_fields", lambda fields, current=None: None)
    r = client(token=org_a.token_write).post(
        base(org_a), {"scope": "organization", "requests_per_minute": 0}, format="json"
    )
    assert r.status_code == 409 and r.json()["code"] == "conflict", r.json()
    assert not RateLimit.objects.exists()
    # and the constraint is the last guard: without the checks a PATCH to 0 meets it too
    limit = RateLimit.objects.create(organization=org_a.tenant.org, scope="organization", requests_per_minute=5)
    r = client(token=org_a.token_write).patch(f"{base(org_a)}{limit.id}/", {"requests_per_minute": 0}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "conflict", r.json()
    limit.refresh_from_db()
    assert limit.requests_per_minute == 5


@pytest.mark.parametrize("field", ["api_key", "project", "end_customer"])
@pytest.mark.django_db
def test_subject_from_another_org_is_invalid_and_nothing_changes(org_a: Org, org_b: Org, field):
    scope = {"api_key": "key", "project": "project", "end_customer": "end_customer"}[field]
    theirs = {
        "api_key": org_b.tenant.key,
        "project": org_b.tenant.project,
        "end_customer": org_b.customer,
    }[field]
    before = limits()
    r = client(token=org_a.token_write).post(
        base(org_a), {"scope": scope, field: theirs.id, "requests_per_minute": 5}, format="json"
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid" and field in r.json()["errors"], r.json()
    assert limits() == before


@pytest.mark.django_db
def test_subject_from_another_org_guards_removed(org_a: Org, org_b: Org, monkeypatch):
    # Removal tests of the one above, one guard at a time.
    c = client(token=org_a.token_write)
    payload = {"scope": "key", "api_key": org_b.tenant.key.id, "requests_per_minute": 5}
    # the serializer's organization filter gone: the service still says no such key
    monkeypatch.setattr(OrgRelatedField, "get_queryset", lambda self: super(OrgRelatedField, self).get_queryset())
    r = c.post(base(org_a), payload, format="json")
    assert r.status_code == 400 and r.json()["errors"] == {"api_key": ["No such api key."]}, r.json()
    assert not RateLimit.objects.exists()
    # and the service's check gone too: acme now limits globex's key
    monkeypatch.setattr(services, "_check_subject", lambda organization, scope, subject: None)
    r = c.post(base(org_a), payload, format="json")
    assert r.status_code == 201
    assert RateLimit.objects.get().api_key == org_b.tenant.key
