"""An API token belongs to the member who created it and acts with that member's current role,
never above its scope: removing the member revokes it at once (audited), demoting them narrows it
at once (audited), and an outsider can do neither."""

from __future__ import annotations

import pytest

from tenants.models import ApiKey, ApiToken, AuditLogEntry, Member

from .conftest import Org, client, make_token
from .test_isolation import state


def tokens_state() -> list:
    return sorted(ApiToken.objects.values_list("id", "revoked_at", "member_id"))


def escalate(org: Org, token: str) -> dict[str, int]:
    """The reported escalation: a new gateway key, then the organization's blocking cap raised to
    $1,000,000. Returns each attempt's status."""
    c = client(token=token)
    base = f"/api/orgs/{org.slug}"
    key = c.post(f"{base}/keys/", {"name": "backdoor", "project": org.tenant.project.slug}, format="json")
    cap = c.patch(f"{base}/budgets/{org.budget.id}/", {"amount_usd": "1000000"}, format="json")
    return {"key": key.status_code, "cap": cap.status_code}


@pytest.fixture
def admin(org_a: Org, role_users) -> Member:
    return role_users["admin"][1]


def outsider_cannot_touch(org_a: Org, org_b: Org, member: Member) -> None:
    """globex's owner and token get 404 removing or demoting acme's member, and change nothing."""
    before = (state(), tokens_state())
    for c in (client(user=org_b.owner), client(token=org_b.token_write)):
        url = f"/api/orgs/{org_a.slug}/members/{member.id}/"
        assert c.delete(url).status_code == 404
        assert c.patch(url, {"role": "viewer"}, format="json").status_code == 404
    assert (state(), tokens_state()) == before


@pytest.mark.django_db
def test_a_removed_admins_token_is_refused_at_once_and_changes_nothing(org_a: Org, org_b: Org, admin: Member):
    # given: the admin's write token works, and an outsider cannot remove the admin
    token = make_token(admin, "write")
    outsider_cannot_touch(org_a, org_b, admin)
    assert client(token=token).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 200
    # when: the owner removes the admin
    r = client(user=org_a.owner).delete(f"/api/orgs/{org_a.slug}/members/{admin.id}/")
    assert r.status_code == 204
    # then: the token is refused (401) for reads and writes, and its attempts change nothing
    before = (state(), tokens_state())
    assert client(token=token).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 401
    assert escalate(org_a, token) == {"key": 401, "cap": 401}
    assert (state(), tokens_state()) == before
    assert not ApiKey.objects.filter(name="backdoor").exists()
    # the owner's own tokens still work
    assert client(token=org_a.token_write).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 200
    # and inviting the user back gives them a new membership, not their old tokens
    r = client(user=org_a.owner).post(
        f"/api/orgs/{org_a.slug}/members/", {"email": "admin@acme.test", "role": "admin"}, format="json"
    )
    assert r.status_code == 201
    assert client(token=token).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 401


@pytest.mark.django_db
def test_removal_revokes_the_token_in_the_audit_log(org_a: Org, admin: Member):
    token = make_token(admin, "write")
    row = ApiToken.objects.get(member=admin)
    client(user=org_a.owner).delete(f"/api/orgs/{org_a.slug}/members/{admin.id}/")
    row.refresh_from_db()
    assert row.revoked_at is not None
    entries = AuditLogEntry.objects.filter(organization=org_a.tenant.org, object_type="apitoken", object_id=str(row.id))
    assert [(e.action, e.actor, list(e.changes)) for e in entries] == [("update", "owner@acme.test", ["revoked_at"])]
    assert AuditLogEntry.objects.filter(object_type="member", object_id=str(admin.id), action="delete").exists()
    assert client(token=token).get(f"/api/orgs/{org_a.slug}/").status_code == 401


@pytest.mark.parametrize("new_role", ["member", "viewer"])
@pytest.mark.django_db
def test_a_demoted_admins_token_can_only_do_what_the_new_role_allows(org_a: Org, org_b: Org, admin: Member, new_role):
    # given: the admin's write token, an outsider who cannot demote the admin, and the admin
    # demoted through the API by the owner
    token = make_token(admin, "write")
    outsider_cannot_touch(org_a, org_b, admin)
    r = client(user=org_a.owner).patch(f"/api/orgs/{org_a.slug}/members/{admin.id}/", {"role": new_role}, format="json")
    assert r.status_code == 200
    before = state()
    # when: the token tries the escalation
    statuses = escalate(org_a, token)
    # then: the cap is refused; a viewer creates no key; a member's key can only be their own
    assert statuses["cap"] == 403
    org_a.budget.refresh_from_db()
    assert org_a.budget.amount_nano == 5_000_000_000
    if new_role == "viewer":
        assert statuses["key"] == 403
        assert state() == before
    else:
        assert statuses["key"] == 201
        assert ApiKey.objects.get(name="backdoor").member_id == admin.id
        other = org_a.member_row.id
        c = client(token=token)
        payload = {"name": "for-owner", "project": org_a.tenant.project.slug, "member": other}
        assert c.post(f"/api/orgs/{org_a.slug}/keys/", payload, format="json").status_code == 403
        assert (
            c.patch(f"/api/orgs/{org_a.slug}/keys/{org_a.tenant.key.id}/", {"name": "x"}, format="json").status_code
            == 403
        )
    # and members are out of reach too
    assert client(token=token).patch(
        f"/api/orgs/{org_a.slug}/members/{admin.id}/", {"role": "admin"}, format="json"
    ).status_code in (403, 405)
    admin.refresh_from_db()
    assert admin.role == new_role


@pytest.mark.django_db
def test_demotion_audits_each_narrowed_token(org_a: Org, admin: Member):
    make_token(admin, "write")
    make_token(admin, "read")  # already a viewer's reach: its role does not change
    write, read = ApiToken.objects.filter(member=admin).order_by("id")
    client(user=org_a.owner).patch(f"/api/orgs/{org_a.slug}/members/{admin.id}/", {"role": "viewer"}, format="json")
    tokens = AuditLogEntry.objects.filter(object_type="apitoken", object_id__in=[str(write.id), str(read.id)])
    assert [(e.object_id, e.actor, e.changes) for e in tokens] == [
        (str(write.id), "owner@acme.test", {"role": ["admin", "viewer"]})
    ]
    write.refresh_from_db()
    assert write.revoked_at is None  # narrowed, not revoked: promote the member again and it writes
