"""Every endpoint: an outsider gets 404 and changes nothing; a read token or a viewer cannot write;
no credentials is 401."""

from __future__ import annotations

import pytest

from catalog.models import Connection, Route
from ledger.models import Budget
from tenants.models import ApiKey, AuditLogEntry, EndCustomer, Member, Project

from .conftest import Org, client

# resource -> (how to find acme's object, a valid write payload for PATCH)
RESOURCES = {
    "projects": (lambda o: o.tenant.project.id, {"name": "Renamed"}),
    "members": (lambda o: o.member_row.id, {"role": "viewer"}),
    "keys": (lambda o: o.tenant.key.id, {"name": "renamed"}),
    "end-customers": (lambda o: o.customer.id, None),
    "budgets": (lambda o: o.budget.id, {"amount_usd": "1.00"}),
    "connections": (lambda o: o.connection.id, {"name": "renamed"}),
    "routes": (lambda o: o.route.id, {"name": "renamed"}),
    "prices": (None, None),
    "usage": (None, None),
    "reservations": (None, None),
    "jobs": (None, None),
    "alerts": (None, None),
}


def state() -> list:
    """Everything an API write could touch."""
    return [
        sorted(Project.objects.values_list("id", "name", "slug")),
        sorted(Member.objects.values_list("id", "role")),
        sorted(ApiKey.objects.values_list("id", "name", "revoked_at")),
        sorted(EndCustomer.objects.values_list("id", "external_id")),
        sorted(Budget.objects.values_list("id", "amount_nano", "name")),
        sorted(Connection.objects.values_list("id", "name")),
        sorted(Route.objects.values_list("id", "name")),
        AuditLogEntry.objects.count(),
    ]


@pytest.mark.parametrize("resource", list(RESOURCES))
@pytest.mark.parametrize("who", ["outsider_token", "outsider_user"])
@pytest.mark.django_db
def test_outsider_gets_404_everywhere_and_changes_nothing(org_a: Org, org_b: Org, resource, who):
    # given: globex's token or owner, aiming at acme's URLs
    c = client(token=org_b.token_write) if who == "outsider_token" else client(user=org_b.owner)
    base = f"/api/orgs/{org_a.slug}/{resource}/"
    find, payload = RESOURCES[resource]
    before = state()
    # when / then
    assert c.get(base).status_code == 404
    assert c.post(base, {"name": "x"}, format="json").status_code in (404, 405)
    if find is not None:
        detail = f"{base}{find(org_a)}/"
        assert c.get(detail).status_code == 404
        assert c.patch(detail, payload or {}, format="json").status_code in (404, 405)
        assert c.delete(detail).status_code in (404, 405)
    assert c.get(f"/api/orgs/{org_a.slug}/").status_code == 404
    assert state() == before


@pytest.mark.parametrize("resource", [r for r, (find, _) in RESOURCES.items() if find is not None])
@pytest.mark.django_db
def test_objects_of_another_org_are_404_under_your_own_org(org_a: Org, org_b: Org, resource):
    # given: acme's own token, aiming at globex's object ids through acme's URL
    c = client(token=org_a.token_write)
    find, payload = RESOURCES[resource]
    detail = f"/api/orgs/{org_a.slug}/{resource}/{find(org_b)}/"
    before = state()
    assert c.get(detail).status_code == 404
    assert c.patch(detail, payload or {}, format="json").status_code in (404, 405)
    assert c.delete(detail).status_code in (404, 405)
    assert state() == before


@pytest.mark.parametrize("resource", [r for r, (find, p) in RESOURCES.items() if p is not None])
@pytest.mark.parametrize("who", ["read_token", "viewer"])
@pytest.mark.django_db
def test_read_token_and_viewer_read_but_cannot_write(org_a: Org, role_users, resource, who):
    c = client(token=org_a.token_read) if who == "read_token" else client(user=role_users["viewer"][0])
    find, payload = RESOURCES[resource]
    base = f"/api/orgs/{org_a.slug}/{resource}/"
    before = state()
    assert c.get(base).status_code == 200
    assert c.get(f"{base}{find(org_a)}/").status_code == 200
    r = c.patch(f"{base}{find(org_a)}/", payload, format="json")
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert c.delete(f"{base}{find(org_a)}/").status_code == 403
    assert c.post(base, {"name": "x", "slug": "x"}, format="json").status_code == 403
    assert state() == before


@pytest.mark.parametrize("resource", list(RESOURCES))
@pytest.mark.django_db
def test_no_credentials_is_401_and_bad_token_is_401(org_a: Org, resource):
    base = f"/api/orgs/{org_a.slug}/{resource}/"
    assert client().get(base).status_code == 401
    assert client(token="cgt_not-a-real-token").get(base).status_code == 401
    # a gateway key is not a management token
    assert client(token="cg_some_gateway_key_value").get(base).status_code == 401


@pytest.mark.django_db
def test_revoked_token_is_refused(org_a: Org):
    from django.utils import timezone

    from tenants.models import ApiToken

    ApiToken.objects.filter(organization=org_a.tenant.org).update(revoked_at=timezone.now())
    assert client(token=org_a.token_write).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 401


@pytest.mark.django_db
def test_org_list_shows_only_your_organizations(org_a: Org, org_b: Org):
    assert [o["slug"] for o in client(user=org_a.owner).get("/api/orgs/").json()["results"]] == ["acme"]
    assert [o["slug"] for o in client(token=org_b.token_read).get("/api/orgs/").json()["results"]] == ["globex"]


@pytest.mark.django_db
def test_member_manages_own_keys_only(org_a: Org, role_users):
    member_user, member = role_users["member"]
    c = client(user=member_user)
    base = f"/api/orgs/{org_a.slug}/keys/"
    # creates a key: it is theirs, whatever member they name
    r = c.post(base, {"name": "mine", "project": org_a.tenant.project.id}, format="json")
    assert r.status_code == 201, r.json()
    assert ApiKey.objects.get(pk=r.json()["id"]).member_id == member.id
    r = c.post(
        base, {"name": "theirs", "project": org_a.tenant.project.id, "member": org_a.member_row.id}, format="json"
    )
    assert r.status_code == 403
    # cannot revoke someone else's key, can revoke their own
    assert c.delete(f"{base}{org_a.tenant.key.id}/").status_code == 403
    assert ApiKey.objects.get(pk=org_a.tenant.key.id).revoked_at is None
    mine = ApiKey.objects.get(name="mine")
    assert c.delete(f"{base}{mine.id}/").status_code == 204
    # reads usage, cannot create a budget
    assert c.get(f"/api/orgs/{org_a.slug}/usage/").status_code == 200
    r = c.post(f"/api/orgs/{org_a.slug}/budgets/", {"scope": "organization", "amount_usd": "1"}, format="json")
    assert r.status_code == 403


@pytest.mark.django_db
def test_admin_manages_everything_but_the_last_owner_stays(org_a: Org, role_users):
    admin_user, _ = role_users["admin"]
    c = client(user=admin_user)
    r = c.patch(f"/api/orgs/{org_a.slug}/members/{org_a.member_row.id}/", {"role": "viewer"}, format="json")
    assert r.status_code == 400
    assert r.json()["errors"] == {"role": ["An organization keeps at least one owner."]}
    assert Member.objects.get(pk=org_a.member_row.id).role == "owner"
