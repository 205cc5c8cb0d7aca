"""Only an owner grants or revokes owner, and an organization always keeps an owner — also when
two owners demote each other at the same instant (issue 9, item 6, roles)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.urls import reverse

from core.errors import InvalidChange, NotAllowed
from tenants import members
from tenants.audit import APPLY, Actor
from tenants.members import change_member_role
from tenants.models import AuditLogEntry, Member
from tests.api.conftest import client, user
from tests.concurrency import race


def role(member: Member) -> str:
    return Member.objects.get(pk=member.pk).role


# --- the management API --------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_admin_cannot_promote_themself_or_demote_or_remove_an_owner(org_a, role_users):
    admin_user, admin = role_users["admin"]
    second = Member.objects.create(organization=org_a.tenant.org, user=user("second@acme.test"), role="owner")
    c = client(user=admin_user)
    base = f"/api/orgs/{org_a.slug}/members/"
    before = AuditLogEntry.objects.count()
    # when: the moves
    r = c.patch(f"{base}{admin.id}/", {"role": "owner"}, format="json")
    # then: refused in the API's shape, nothing changed
    assert r.status_code == 403
    assert r.json() == {
        "code": "permission_denied",
        "detail": "Only an owner can grant or revoke the owner role.",
        "errors": {"role": ["Only an owner can grant or revoke the owner role."]},
    }
    assert role(admin) == "admin"
    assert c.patch(f"{base}{second.id}/", {"role": "member"}, format="json").status_code == 403
    assert c.delete(f"{base}{second.id}/").status_code == 403
    assert c.post(base, {"email": "new@acme.test", "role": "owner"}, format="json").status_code == 403
    assert role(second) == "owner" and not Member.objects.filter(user__email="new@acme.test").exists()
    assert AuditLogEntry.objects.count() == before
    # ... while an admin still manages the other roles
    assert c.patch(f"{base}{role_users['member'][1].id}/", {"role": "viewer"}, format="json").status_code == 200


@pytest.mark.django_db
def test_a_write_token_cannot_grant_owner(org_a, role_users):
    _, admin = role_users["admin"]
    r = client(token=org_a.token_write).patch(
        f"/api/orgs/{org_a.slug}/members/{admin.id}/", {"role": "owner"}, format="json"
    )
    assert r.status_code == 403 and role(admin) == "admin"


@pytest.mark.django_db
def test_an_owner_grants_and_revokes_owner(org_a, role_users):
    _, admin = role_users["admin"]
    c = client(user=org_a.owner)
    base = f"/api/orgs/{org_a.slug}/members/"
    assert c.patch(f"{base}{admin.id}/", {"role": "owner"}, format="json").status_code == 200
    assert role(admin) == "owner"
    # The new owner may demote the first one; the last owner then cannot step down.
    c2 = client(user=admin.user)
    assert c2.patch(f"{base}{org_a.member_row.id}/", {"role": "admin"}, format="json").status_code == 200
    r = c2.patch(f"{base}{admin.id}/", {"role": "admin"}, format="json")
    assert r.status_code == 400 and r.json()["errors"] == {"role": ["An organization keeps at least one owner."]}
    r = c2.delete(f"{base}{admin.id}/")
    assert r.status_code == 400 and role(admin) == "owner"


@pytest.mark.django_db
def test_apply_as_the_operator_may_set_owners(org_a, role_users):
    _, admin = role_users["admin"]
    change_member_role(member=admin, role="owner", actor=APPLY)
    assert role(admin) == "owner"


# --- the dashboard -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_dashboard_refuses_an_admin_making_themself_owner(org_a, role_users):
    admin_user, admin = role_users["admin"]
    c = Client()
    c.force_login(admin_user)
    r = c.post(reverse("dashboard:member_role", args=[org_a.slug, admin.id]), {"role": "owner"}, follow=True)
    assert r.status_code == 200
    assert "Only an owner can grant or revoke the owner role." in [str(m) for m in get_messages(r.wsgi_request)]
    assert role(admin) == "admin"
    r = c.post(reverse("dashboard:member_remove", args=[org_a.slug, org_a.member_row.id]), follow=True)
    assert role(org_a.member_row) == "owner"
    r = c.post(reverse("dashboard:members", args=[org_a.slug]), {"email": "x@acme.test", "role": "owner"})
    assert r.status_code == 200 and b"Only an owner can grant" in r.content
    assert not Member.objects.filter(user__email="x@acme.test").exists()


# --- concurrency ---------------------------------------------------------------------------------


def two_owners_demote_each_other(org_a) -> tuple[list[object], int]:
    a = org_a.member_row
    b = Member.objects.create(organization=org_a.tenant.org, user=user("b@acme.test"), role="owner")
    pairs = [(Actor.of_member(a), b), (Actor.of_member(b), a)]

    def demote(i: int) -> object:
        actor, target = pairs[i]
        try:
            change_member_role(member=Member.objects.get(pk=target.pk), role="admin", actor=actor)
            return "demoted"
        except (InvalidChange, NotAllowed) as exc:
            return exc.code
        finally:
            connection.close()

    results = race(2, demote)
    return results, Member.objects.filter(organization=org_a.tenant.org, role="owner").count()


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(org_a, monkeypatch):
    monkeypatch.setattr(members, "RACE_DELAY_SECONDS", 0.3)
    results, owners = two_owners_demote_each_other(org_a)
    assert owners == 1
    assert sorted(map(str, results)) == ["demoted", "invalid"]  # the second saw the last owner


@pytest.mark.django_db(transaction=True)
def test_without_the_lock_two_owners_demoting_each_other_leave_none(org_a, monkeypatch):
    # Guard removed: no organization lock, the same widened race.
    monkeypatch.setattr(members, "_lock_roles", lambda organization_id: None)
    monkeypatch.setattr(members, "RACE_DELAY_SECONDS", 0.3)
    results, owners = two_owners_demote_each_other(org_a)
    assert results == ["demoted", "demoted"] and owners == 0
