"""API tokens follow their member on every path that changes a membership besides the API and the
dashboard (tests/api/test_token_membership.py, tests/dashboard/test_token_owners.py): `manage.py
apply`, the user deactivated or deleted, and the migration that binds existing tokens."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model

from dashboard.services.apply_document import apply_config
from tenants.audit import APPLY
from tenants.models import ApiToken, AuditLogEntry, Member
from tenants.services import create_key
from tests.api.conftest import Org, client, make_token

bind_tokens = importlib.import_module("tenants.migrations.0005_bind_api_tokens_to_members").bind_tokens


def raise_cap(org: Org, raw: str) -> int:
    url = f"/api/orgs/{org.slug}/budgets/{org.budget.id}/"
    return client(token=raw).patch(url, {"amount_usd": "1000000"}, format="json").status_code


def cap_nano(org: Org) -> int:
    org.budget.refresh_from_db()
    return org.budget.amount_nano


@pytest.mark.django_db
def test_apply_demoting_a_member_narrows_their_token_at_once(org_a: Org, role_users):
    admin_user, admin = role_users["admin"]
    raw = make_token(admin, "write")
    # when: the operator's file makes the admin a viewer
    apply_config(
        data={"organizations": [{"slug": "acme", "members": [{"email": "admin@acme.test", "role": "viewer"}]}]}
    )
    # then: the token reads, cannot write, and the narrowing is audited
    assert client(token=raw).get(f"/api/orgs/{org_a.slug}/budgets/").status_code == 200
    assert raise_cap(org_a, raw) == 403
    assert cap_nano(org_a) == 5_000_000_000
    token = ApiToken.objects.get(member=admin)
    entry = AuditLogEntry.objects.get(object_type="apitoken", object_id=str(token.id))
    assert (entry.actor, entry.changes) == ("apply", {"role": ["admin", "viewer"]})


@pytest.mark.django_db
def test_a_deactivated_users_token_is_refused_until_they_are_active_again(org_a: Org, role_users):
    admin_user, admin = role_users["admin"]
    raw = make_token(admin, "write")
    admin_user.is_active = False
    admin_user.save(update_fields=["is_active"])
    assert raise_cap(org_a, raw) == 401
    assert cap_nano(org_a) == 5_000_000_000
    # deactivation suspends, it does not revoke: the member is still in the organization
    admin_user.is_active = True
    admin_user.save(update_fields=["is_active"])
    assert raise_cap(org_a, raw) == 200


@pytest.mark.django_db
def test_deleting_a_user_revokes_their_keys_and_tokens_in_every_organization_audited(
    org_a: Org, org_b: Org, role_users
):
    admin_user, admin = role_users["admin"]
    elsewhere = Member.objects.create(organization=org_b.tenant.org, user=admin_user, role="admin")
    raws = [make_token(admin, "write"), make_token(elsewhere, "write")]
    ids = list(ApiToken.objects.filter(member__user=admin_user).values_list("id", flat=True))
    key, _ = create_key(
        organization=org_a.tenant.org, project=org_a.tenant.project, name="own", member=admin, actor=APPLY
    )
    # when
    admin_user.delete()
    # then: their gateway key is revoked (audited) like a removed member's
    key.refresh_from_db()
    assert (key.member_id, key.revoked_at is not None) == (None, True)
    assert AuditLogEntry.objects.filter(object_type="apikey", object_id=str(key.id), actor__endswith="deleted").exists()
    # then: both revoked (the membership is gone, the row stays), each audited, and refused
    tokens = ApiToken.objects.filter(id__in=ids)
    assert [(t.member_id, t.revoked_at is not None) for t in tokens] == [(None, True), (None, True)]
    entries = AuditLogEntry.objects.filter(object_type="apitoken", object_id__in=[str(i) for i in ids])
    assert sorted((e.organization_id, e.actor) for e in entries) == sorted(
        [(org_a.tenant.org.id, "user admin@acme.test deleted"), (org_b.tenant.org.id, "user admin@acme.test deleted")]
    )
    assert raise_cap(org_a, raws[0]) == 401
    assert cap_nano(org_a) == 5_000_000_000


@pytest.mark.django_db
def test_the_migration_binds_tokens_to_their_creator_and_revokes_those_nobody_answers_for(org_a: Org, role_users):
    admin_user, admin = role_users["admin"]
    stranger = get_user_model().objects.create_user("gone@acme.test", "gone@acme.test", "password")

    def legacy(name: str, created_by) -> ApiToken:
        raw, prefix, digest = ApiToken.generate()
        token = ApiToken.objects.create(
            organization=org_a.tenant.org,
            name=name,
            scope="write",
            prefix=prefix,
            token_hash=digest,
            created_by=created_by,
        )
        token.raw = raw  # type: ignore[attr-defined]
        return token

    # given: tokens as they were before tokens had a member
    ApiToken.objects.all().delete()
    by_admin, by_stranger, by_nobody = legacy("admin", admin_user), legacy("stranger", stranger), legacy("nobody", None)
    # when
    bind_tokens(apps, None)
    # then: the creator's token keeps working as them; the others are revoked, each audited
    for t in (by_admin, by_stranger, by_nobody):
        t.refresh_from_db()
    assert (by_admin.member_id, by_admin.revoked_at) == (admin.id, None)
    assert by_stranger.revoked_at is not None and by_nobody.revoked_at is not None
    assert raise_cap(org_a, by_admin.raw) == 200
    assert raise_cap(org_a, by_stranger.raw) == 401 and raise_cap(org_a, by_nobody.raw) == 401
    entries = AuditLogEntry.objects.filter(object_type="apitoken").order_by("object_id")
    assert [(e.object_id, list(e.changes)) for e in entries] == [
        (str(by_stranger.id), ["revoked_at"]),
        (str(by_nobody.id), ["revoked_at"]),
    ]
