"""What each endpoint does for an organization's own write token."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection as db

from catalog.models import Connection, Route
from ledger.models import Budget
from tenants.models import ApiKey, AuditLogEntry, EndCustomer, Member, Project, hash_key

from .conftest import Org, client


def api(org: Org, write: bool = True):
    return client(token=org.token_write if write else org.token_read)


@pytest.mark.django_db
def test_budget_crud_in_usd_with_current_window(org_a: Org):
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/budgets/"
    # create
    r = c.post(
        base,
        {
            "name": "key cap",
            "scope": "key",
            "api_key": org_a.tenant.key.id,
            "period": "day",
            "mode": "block",
            "amount_usd": "2.50",
            "thresholds": [80, 50],
        },
        format="json",
    )
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["amount_usd"] == "2.500000000" and body["thresholds"] == [50, 80]
    budget = Budget.objects.get(pk=body["id"])
    assert budget.amount_nano == 2_500_000_000
    # the current window counts the day's recorded spend for that key ($0.001 today)
    assert body["current"]["spent_usd"] == "0.001000000"
    # update
    r = c.patch(f"{base}{budget.id}/", {"amount_usd": "3", "mode": "alert"}, format="json")
    assert r.status_code == 200 and r.json()["amount_usd"] == "3.000000000"
    budget.refresh_from_db()
    assert (budget.amount_nano, budget.mode) == (3_000_000_000, "alert")
    entry = AuditLogEntry.objects.filter(object_type="budget", action="update").get()
    assert entry.changes == {"amount_nano": [2_500_000_000, 3_000_000_000], "mode": ["block", "alert"]}
    assert entry.actor.startswith("token write-token")
    # the subject is fixed
    other_key = org_a.tenant.add_key("other")
    r = c.patch(f"{base}{budget.id}/", {"api_key": other_key.id}, format="json")
    assert r.status_code == 400 and "api_key" in r.json()["errors"]
    # delete
    assert c.delete(f"{base}{budget.id}/").status_code == 204
    assert not Budget.objects.filter(pk=budget.id).exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"scope": "organization", "amount_usd": "abc"}, "amount_usd"),
        ({"scope": "organization", "amount_usd": "-1"}, "amount_usd"),
        ({"scope": "organization", "amount_usd": "0.0000000001"}, "amount_usd"),
        ({"scope": "organization", "amount_usd": "99999999999"}, "amount_usd"),
        ({"scope": "key", "amount_usd": "1"}, "api_key"),
        ({"scope": "organization", "amount_usd": "1", "project": "PROJECT"}, "project"),
        ({"scope": "project", "amount_usd": "1", "project": 999999}, "project"),
        ({"scope": "galaxy", "amount_usd": "1"}, "scope"),
        ({"scope": "organization", "amount_usd": "1", "timezone": "Nowhere/Land"}, "timezone"),
        ({"scope": "organization", "amount_usd": "1", "thresholds": [50, 50]}, "thresholds"),
        ({"scope": "organization", "amount_usd": "1", "thresholds": [0]}, "thresholds"),
        ({"scope": "organization", "amount_usd": "1", "recipients": ["not-an-email"]}, "recipients"),
        ({"scope": "organization", "amount_usd": "1", "period": "year"}, "period"),
    ],
)
@pytest.mark.django_db
def test_bad_budget_is_a_field_error_and_nothing_changes(org_a: Org, payload, field):
    before = Budget.objects.count()
    if payload.get("project") == "PROJECT":
        payload = {**payload, "project": org_a.tenant.project.id}
    r = api(org_a).post(f"/api/orgs/{org_a.slug}/budgets/", payload, format="json")
    assert r.status_code == 400, r.json()
    assert r.json()["code"] == "invalid" and field in r.json()["errors"], r.json()
    assert Budget.objects.count() == before


@pytest.mark.parametrize("amount", ["4.62", "100", "12345.678901234", "4611686018"])
@pytest.mark.django_db
def test_budget_amounts_over_a_few_dollars_are_accepted_exactly(org_a: Org, amount):
    # The USD bounds (0 to 4,611,686,018) apply to the USD amount; run on the nano-USD value
    # they refused every budget over $4.61.
    r = api(org_a).post(
        f"/api/orgs/{org_a.slug}/budgets/", {"scope": "organization", "amount_usd": amount}, format="json"
    )
    assert r.status_code == 201, r.json()
    assert Budget.objects.get(pk=r.json()["id"]).amount_nano == int(Decimal(amount).scaleb(9))
    assert Decimal(r.json()["amount_usd"]) == Decimal(amount)


@pytest.mark.django_db
def test_budget_subject_from_another_org_is_invalid(org_a: Org, org_b: Org):
    r = api(org_a).post(
        f"/api/orgs/{org_a.slug}/budgets/",
        {"scope": "key", "api_key": org_b.tenant.key.id, "amount_usd": "1"},
        format="json",
    )
    assert r.status_code == 400 and "api_key" in r.json()["errors"]
    assert not Budget.objects.filter(api_key=org_b.tenant.key, organization=org_a.tenant.org).exists()


@pytest.mark.django_db
def test_key_secret_is_shown_once_and_stored_hashed(org_a: Org):
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/keys/"
    r = c.post(base, {"name": "ci", "project": org_a.tenant.project.id, "allowed_models": ["echo-1"]}, format="json")
    assert r.status_code == 201
    raw = r.json()["secret"]
    key = ApiKey.objects.get(pk=r.json()["id"])
    assert key.key_hash == hash_key(raw) and raw.startswith(key.prefix)
    assert "secret" not in c.get(f"{base}{key.id}/").json()
    assert all("secret" not in k for k in c.get(base).json()["results"])
    # revoke keeps the row
    assert c.delete(f"{base}{key.id}/").status_code == 204
    assert c.get(f"{base}{key.id}/").json()["active"] is False


@pytest.mark.django_db
def test_connection_secret_is_write_only_and_encrypted(org_a: Org):
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/connections/"
    r = c.post(
        base,
        {
            "name": "oa",
            "kind": "openai",
            "base_url": "https://api.openai.com/v1",
            "secret": "sk-abc",
            "input_usd_per_mtok": "0.5",
            "output_usd_per_mtok": "1.5",
        },
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert "secret" not in r.json() and r.json()["has_secret"] is True
    conn = Connection.objects.get(pk=r.json()["id"])
    assert conn.plain_secret == "sk-abc"
    with db.cursor() as cursor:
        cursor.execute("SELECT secret FROM catalog_connection WHERE id = %s", [conn.id])
        assert "sk-abc" not in cursor.fetchone()[0]
    # PATCH without a secret keeps it; with one replaces it; the audit never shows it
    assert c.patch(f"{base}{conn.id}/", {"output_usd_per_mtok": "2"}, format="json").status_code == 200
    assert Connection.objects.get(pk=conn.id).plain_secret == "sk-abc"
    assert c.patch(f"{base}{conn.id}/", {"secret": "sk-new"}, format="json").status_code == 200
    assert Connection.objects.get(pk=conn.id).plain_secret == "sk-new"
    assert "sk-" not in str(list(AuditLogEntry.objects.values_list("changes", flat=True)))
    # a bad URL and a duplicate name are field errors
    r = c.post(base, {"name": "oa", "kind": "openai"}, format="json")
    assert r.status_code == 400 and "name" in r.json()["errors"]
    r = c.post(base, {"name": "x", "kind": "openai", "base_url": "ftp://x"}, format="json")
    assert r.status_code == 400 and "base_url" in r.json()["errors"]


@pytest.mark.django_db
def test_routes_projects_members_end_customers(org_a: Org):
    c, slug = api(org_a), org_a.slug
    # route
    r = c.post(
        f"/api/orgs/{slug}/routes/",
        {"name": "fast", "targets": [{"connection": org_a.connection.id, "model": "echo/echo-1"}]},
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert r.json()["targets"] == [{"connection": org_a.connection.id, "model": "echo/echo-1"}]
    r = c.post(
        f"/api/orgs/{slug}/routes/",
        {"name": "bad", "targets": [{"connection": org_a.connection.id, "model": "nope/none"}]},
        format="json",
    )
    assert r.status_code == 400 and not Route.objects.filter(name="bad").exists()
    # project with a default end-customer cap
    r = c.post(
        f"/api/orgs/{slug}/projects/",
        {"slug": "research", "name": "Research", "default_customer_budget_usd": "0.25"},
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert Project.objects.get(slug="research").default_customer_budget_nano == 250_000_000
    r = c.post(f"/api/orgs/{slug}/projects/", {"slug": "research", "name": "Again"}, format="json")
    assert r.status_code == 400 and "slug" in r.json()["errors"]
    # member
    r = c.post(f"/api/orgs/{slug}/members/", {"email": "New@Acme.test", "role": "viewer"}, format="json")
    assert r.status_code == 201, r.json()
    member = Member.objects.get(pk=r.json()["id"])
    assert member.user.email == "new@acme.test" and not member.user.has_usable_password()
    assert c.delete(f"/api/orgs/{slug}/members/{member.id}/").status_code == 204
    # end customer
    r = c.post(
        f"/api/orgs/{slug}/end-customers/", {"project": org_a.tenant.project.id, "external_id": "c-9"}, format="json"
    )
    assert r.status_code == 201
    r = c.post(
        f"/api/orgs/{slug}/end-customers/", {"project": org_a.tenant.project.id, "external_id": "c-9"}, format="json"
    )
    assert r.status_code == 400 and "external_id" in r.json()["errors"]
    assert EndCustomer.objects.filter(external_id="c-9").count() == 1


@pytest.mark.django_db
def test_organization_policy(org_a: Org):
    c = api(org_a)
    r = c.patch(f"/api/orgs/{org_a.slug}/", {"allow_unpriced": True, "default_run_budget_usd": "0.5"}, format="json")
    assert r.status_code == 200, r.json()
    org_a.tenant.org.refresh_from_db()
    assert org_a.tenant.org.allow_unpriced and org_a.tenant.org.default_run_budget_nano == 500_000_000


@pytest.mark.django_db
def test_usage_list_filters_and_summary(org_a: Org, org_b: Org):
    c = api(org_a, write=False)
    rows = c.get(f"/api/orgs/{org_a.slug}/usage/").json()["results"]
    assert {r["request_id"] for r in rows} == {"acme-u0", "acme-u1"}  # not globex's
    rows = c.get(f"/api/orgs/{org_a.slug}/usage/", {"end_customer": org_a.customer.id}).json()["results"]
    assert [r["request_id"] for r in rows] == ["acme-u1"]
    assert rows[0]["cost_usd"] == "0.002500000"
    r = c.get(f"/api/orgs/{org_a.slug}/usage/summary/", {"group_by": "day"})
    assert r.status_code == 200
    body = r.json()
    assert body["total"]["requests"] == 2 and body["total"]["cost_usd"] == "0.003500000"
    assert len(body["groups"]) == 2
    r = c.get(f"/api/orgs/{org_a.slug}/usage/summary/", {"group_by": "key"})
    assert r.json()["groups"][0]["group"] == "default"
    assert c.get(f"/api/orgs/{org_a.slug}/usage/summary/", {"group_by": "planet"}).status_code == 400
    assert c.get(f"/api/orgs/{org_a.slug}/usage/", {"since": "yesterday"}).status_code == 400


@pytest.mark.django_db
def test_prices_reservations_alerts_read(org_a: Org):
    c = api(org_a, write=False)
    prices = c.get(f"/api/orgs/{org_a.slug}/prices/").json()["results"]
    assert any(p["model"] == "echo/echo-1" for p in prices)
    org_a.tenant.admit(worst_nano=1000)
    res = c.get(f"/api/orgs/{org_a.slug}/reservations/").json()["results"]
    assert len(res) == 1 and res[0]["amount_usd"] == "0.000001000"
    assert c.get(f"/api/orgs/{org_a.slug}/alerts/").status_code == 200


@pytest.mark.django_db
def test_schema_and_docs_are_served(org_a: Org):
    r = client().get("/api/schema/")
    assert r.status_code == 200 and b"/api/orgs/{org_slug}/budgets/" in r.content
    assert client().get("/api/docs/").status_code == 200
