"""References in API bodies by the names users know (project slug, key name, connection name,
end customer external id) as well as numeric ids — and never across organizations."""

from __future__ import annotations

import pytest

from catalog.models import Connection, Route
from ledger.models import Budget
from ratelimits.models import RateLimit
from tenants.api.refs import OrgRelatedField
from tenants.models import ApiKey, EndCustomer, Project

from .conftest import Org, client


def api(org: Org):
    return client(token=org.token_write)


def counts() -> tuple[int, ...]:
    return (
        Budget.objects.count(),
        RateLimit.objects.count(),
        ApiKey.objects.count(),
        EndCustomer.objects.count(),
        Route.objects.count(),
    )


@pytest.mark.django_db
def test_budgets_take_project_slug_key_name_and_customer_external_id(org_a: Org):
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/budgets/"
    # when: each subject by the name users know
    by_slug = c.post(base, {"scope": "project", "project": "main", "amount_usd": "1"}, format="json")
    by_name = c.post(base, {"scope": "key", "api_key": "default", "amount_usd": "2"}, format="json")
    by_external = c.post(base, {"scope": "end_customer", "end_customer": "cust-1", "amount_usd": "3"}, format="json")
    # then: stored against the right rows, and answered with their ids
    assert by_slug.status_code == by_name.status_code == by_external.status_code == 201, (
        by_slug.json(),
        by_name.json(),
        by_external.json(),
    )
    assert Budget.objects.get(pk=by_slug.json()["id"]).project == org_a.tenant.project
    assert Budget.objects.get(pk=by_name.json()["id"]).api_key == org_a.tenant.key
    assert Budget.objects.get(pk=by_external.json()["id"]).end_customer == org_a.customer
    assert by_slug.json()["project"] == org_a.tenant.project.id
    assert by_external.json()["end_customer"] == org_a.customer.id


@pytest.mark.django_db
def test_numeric_ids_keep_working_in_json_and_form_bodies(org_a: Org):
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/budgets/"
    r = c.post(base, {"scope": "key", "api_key": org_a.tenant.key.id, "amount_usd": "1"}, format="json")
    assert r.status_code == 201 and Budget.objects.get(pk=r.json()["id"]).api_key == org_a.tenant.key
    # a form body sends the id as a string of digits: still an id, not a name
    r = c.post(base, {"scope": "project", "project": str(org_a.tenant.project.id), "amount_usd": "1"})
    assert r.status_code == 201 and Budget.objects.get(pk=r.json()["id"]).project == org_a.tenant.project


@pytest.mark.django_db
def test_keys_customers_rate_limits_and_routes_take_names(org_a: Org):
    c, slug = api(org_a), org_a.slug
    r = c.post(f"/api/orgs/{slug}/keys/", {"name": "ci", "project": "main"}, format="json")
    assert r.status_code == 201 and ApiKey.objects.get(pk=r.json()["id"]).project == org_a.tenant.project
    r = c.post(f"/api/orgs/{slug}/end-customers/", {"project": "main", "external_id": "c-7"}, format="json")
    assert r.status_code == 201 and EndCustomer.objects.get(pk=r.json()["id"]).project == org_a.tenant.project
    r = c.post(
        f"/api/orgs/{slug}/rate-limits/", {"scope": "key", "api_key": "ci", "requests_per_minute": 5}, format="json"
    )
    assert r.status_code == 201 and RateLimit.objects.get(pk=r.json()["id"]).api_key.name == "ci"
    r = c.post(
        f"/api/orgs/{slug}/rate-limits/",
        {"scope": "end_customer", "end_customer": "c-7", "requests_per_minute": 5},
        format="json",
    )
    assert r.status_code == 201 and RateLimit.objects.get(pk=r.json()["id"]).end_customer.external_id == "c-7"
    r = c.post(
        f"/api/orgs/{slug}/routes/",
        {"name": "fast", "targets": [{"connection": "echo", "model": "echo/echo-1"}]},
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert r.json()["targets"] == [{"connection": org_a.connection.id, "model": "echo/echo-1"}]


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("budgets", {"scope": "project", "project": "nope", "amount_usd": "1"}, "project"),
        ("budgets", {"scope": "key", "api_key": "nope", "amount_usd": "1"}, "api_key"),
        ("budgets", {"scope": "end_customer", "end_customer": "nope", "amount_usd": "1"}, "end_customer"),
        ("budgets", {"scope": "key", "api_key": ["default"], "amount_usd": "1"}, "api_key"),
        ("budgets", {"scope": "key", "api_key": True, "amount_usd": "1"}, "api_key"),
        ("budgets", {"scope": "key", "api_key": "de\x00fault", "amount_usd": "1"}, "api_key"),
        ("keys", {"name": "ci", "project": "x" * 201}, "project"),
        ("end-customers", {"project": "nope", "external_id": "c-8"}, "project"),
        ("rate-limits", {"scope": "project", "project": "nope", "requests_per_minute": 5}, "project"),
        ("routes", {"name": "r", "targets": [{"connection": "nope", "model": "echo/echo-1"}]}, "targets"),
    ],
)
@pytest.mark.django_db
def test_a_wrong_reference_is_a_400_naming_the_field_and_changes_nothing(org_a: Org, path, payload, field):
    before = counts()
    r = api(org_a).post(f"/api/orgs/{org_a.slug}/{path}/", payload, format="json")
    assert r.status_code == 400, r.json()
    assert r.json()["code"] == "invalid" and field in r.json()["errors"], r.json()
    assert counts() == before


@pytest.mark.django_db
def test_an_ambiguous_key_name_is_a_clear_400(org_a: Org):
    # given: two keys named "shared" (names are not unique)
    first, second = org_a.tenant.add_key("shared"), org_a.tenant.add_key("shared")
    before = counts()
    # when
    r = api(org_a).post(
        f"/api/orgs/{org_a.slug}/budgets/", {"scope": "key", "api_key": "shared", "amount_usd": "1"}, format="json"
    )
    # then: it names both ids, so the caller can pick one
    assert r.status_code == 400
    assert r.json()["errors"] == {
        "api_key": [f'2 api keys are named "shared" (ids {first.id}, {second.id}): use the id.']
    }
    assert counts() == before


@pytest.mark.django_db
def test_an_external_id_in_two_projects_needs_its_project(org_a: Org):
    # given: "cust-1" exists in main and in a second project
    other = Project.objects.create(organization=org_a.tenant.org, slug="staging", name="Staging")
    twin = EndCustomer.objects.create(project=other, external_id="cust-1")
    c, base = api(org_a), f"/api/orgs/{org_a.slug}/budgets/"
    # when / then: bare, it is ambiguous and nothing is created
    r = c.post(base, {"scope": "end_customer", "end_customer": "cust-1", "amount_usd": "1"}, format="json")
    assert (
        r.status_code == 400
        and "end_customer" in r.json()["errors"]
        and not Budget.objects.filter(scope="end_customer").exists()
    )
    # qualified by project slug, each resolves
    r = c.post(base, {"scope": "end_customer", "end_customer": "staging/cust-1", "amount_usd": "1"}, format="json")
    assert r.status_code == 201 and Budget.objects.get(pk=r.json()["id"]).end_customer == twin
    r = c.post(base, {"scope": "end_customer", "end_customer": "main/cust-1", "amount_usd": "1"}, format="json")
    assert r.status_code == 201 and Budget.objects.get(pk=r.json()["id"]).end_customer == org_a.customer


@pytest.fixture
def globex_names(org_b: Org) -> Org:
    """Names that exist only in globex."""
    Project.objects.create(organization=org_b.tenant.org, slug="globex-only", name="G")
    org_b.tenant.add_key("globex-key")
    EndCustomer.objects.create(project=org_b.tenant.project, external_id="globex-cust")
    Connection.objects.create(organization=org_b.tenant.org, name="globex-conn", kind="echo")
    return org_b


GLOBEX_REFERENCES = [
    ("budgets", {"scope": "project", "project": "globex-only", "amount_usd": "1"}, "project"),
    ("budgets", {"scope": "key", "api_key": "globex-key", "amount_usd": "1"}, "api_key"),
    ("budgets", {"scope": "end_customer", "end_customer": "globex-cust", "amount_usd": "1"}, "end_customer"),
    ("budgets", {"scope": "end_customer", "end_customer": "main/globex-cust", "amount_usd": "1"}, "end_customer"),
    ("keys", {"name": "k", "project": "globex-only"}, "project"),
    ("end-customers", {"project": "globex-only", "external_id": "c"}, "project"),
    ("rate-limits", {"scope": "key", "api_key": "globex-key", "requests_per_minute": 5}, "api_key"),
    ("routes", {"name": "r", "targets": [{"connection": "globex-conn", "model": "echo/echo-1"}]}, "targets"),
]


@pytest.mark.parametrize(("path", "payload", "field"), GLOBEX_REFERENCES)
@pytest.mark.django_db
def test_another_organizations_names_never_resolve(org_a: Org, globex_names: Org, path, payload, field):
    before = counts()
    r = api(org_a).post(f"/api/orgs/{org_a.slug}/{path}/", payload, format="json")
    assert r.status_code == 400 and field in r.json()["errors"], r.json()
    assert counts() == before


@pytest.mark.django_db
def test_same_slug_in_two_organizations_resolves_to_your_own(org_a: Org, org_b: Org):
    # both organizations have a project "main" and a key "default"
    r = api(org_a).post(f"/api/orgs/{org_a.slug}/keys/", {"name": "ci", "project": "main"}, format="json")
    assert r.status_code == 201 and ApiKey.objects.get(pk=r.json()["id"]).project == org_a.tenant.project


@pytest.mark.django_db
def test_outsider_using_names_gets_404_and_changes_nothing(org_a: Org, org_b: Org):
    before = counts()
    for path, payload in [
        ("budgets", {"scope": "key", "api_key": "default", "amount_usd": "1"}),
        ("keys", {"name": "x", "project": "main"}),
        ("rate-limits", {"scope": "project", "project": "main", "requests_per_minute": 1}),
        ("routes", {"name": "r", "targets": [{"connection": "echo", "model": "echo/echo-1"}]}),
    ]:
        r = client(token=org_b.token_write).post(f"/api/orgs/{org_a.slug}/{path}/", payload, format="json")
        assert r.status_code == 404, (path, r.json())
    assert counts() == before


@pytest.mark.django_db
def test_name_lookup_organization_guard_removed(org_a: Org, globex_names: Org, monkeypatch):
    # Removal test of test_another_organizations_names_never_resolve: without the field's
    # organization filter, acme's request finds globex's project by its slug.
    monkeypatch.setattr(OrgRelatedField, "get_queryset", lambda self: super(OrgRelatedField, self).get_queryset())
    r = api(org_a).post(
        f"/api/orgs/{org_a.slug}/end-customers/", {"project": "globex-only", "external_id": "c"}, format="json"
    )
    assert r.status_code == 201
    assert EndCustomer.objects.get(pk=r.json()["id"]).project.organization == globex_names.tenant.org


@pytest.mark.django_db
def test_schema_documents_both_forms(org_a: Org):
    schema = client(user=org_a.owner).get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    api_key = schema["BudgetRequest"]["properties"]["api_key"]
    assert [s["type"] for s in api_key["oneOf"]] == ["integer", "string"] and "name" in api_key["description"]
    customer = schema["BudgetRequest"]["properties"]["end_customer"]
    assert "external id" in customer["description"] and "<project slug>/" in customer["description"]
    assert "slug" in schema["KeyRequest"]["properties"]["project"]["description"]
    assert "name" in schema["RouteTargetRequest"]["properties"]["connection"]["description"]
    # responses always carry the id
    assert schema["Budget"]["properties"]["api_key"]["type"] == "integer"
    # members are still referenced by id only
    assert schema["KeyRequest"]["properties"]["member"]["type"] == "integer"
