"""Members of an organization and the owner rules: add, change a role (their API tokens follow
it), remove (which revokes the member's keys and API tokens and keeps their name on their usage
records).

Every role change that grants or takes the owner role runs one at a time per organization
(`_lock_roles`), so two admins cannot demote each other's last owner at once.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import transaction

from core.errors import InvalidChange, NotAllowed
from tenants.audit import Actor, audit, save_changes
from tenants.deletion import deleting, freeze_subject_name, lock_for_delete
from tenants.models import ApiKey, ApiToken, Member, Organization
from tenants.services import revoke_key, revoke_token


def add_member(
    *, organization: Organization, email: str, role: str, actor: Actor, password: str | None = None
) -> Member:
    """Add a user (created if new, with an unusable password unless one is given) to the org."""
    email = _clean_email(email)
    _check_role(role)
    user = find_or_create_user(email=email, password=password)
    if organization.members.filter(user=user).exists():
        raise InvalidChange(f"{email} is already a member.", param="email")
    with transaction.atomic():
        if role == Member.Role.OWNER:
            _lock_roles(organization.pk)
            _require_owner(actor, organization.pk)
        member = Member.objects.create(organization=organization, user=user, role=role)
        audit(organization=organization, actor=actor, action="create", obj=member, changes={"role": [None, role]})
    return member


def find_or_create_user(*, email: str, password: str | None = None) -> Any:
    user_model = get_user_model()
    user = user_model.objects.filter(email__iexact=email).order_by("id").first()
    if user is None:
        user = user_model.objects.create_user(username=email, email=email, password=password)
        if password is None:
            user.set_unusable_password()
            user.save(update_fields=["password"])
    return user


def _clean_email(email: str) -> str:
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except DjangoValidationError as exc:
        raise InvalidChange(f"{email!r} is not an email address.", param="email") from exc
    return email


def _check_role(role: str) -> None:
    if role not in Member.Role.values:
        raise InvalidChange(f"Role must be one of {', '.join(Member.Role.values)}.", param="role")


def change_member_role(*, member: Member, role: str, actor: Actor) -> dict[str, list[Any]]:
    """Change a member's role; their API tokens act with the new role from the next request (each
    token whose role changes gets its own audit entry)."""
    _check_role(role)
    with transaction.atomic():
        _lock_owner_change(member=member, new_role=role, actor=actor)
        before = member.role
        changes = save_changes(obj=member, organization=member.organization, actor=actor, fields={"role": role})
        if changes:
            _audit_token_roles(member=member, before=before, actor=actor)
        return changes


def _audit_token_roles(*, member: Member, before: str, actor: Actor) -> None:
    for token in ApiToken.objects.filter(member=member, revoked_at__isnull=True).order_by("id"):
        was, now = token.role_for(before), token.role_for(member.role)
        if was != now:
            changes = {"role": [was, now]}
            audit(organization=member.organization, actor=actor, action="update", obj=token, changes=changes)


@deleting
def remove_member(*, member: Member, actor: Actor) -> None:
    """Remove a member, in one audited transaction:
    1. keep an owner; 2. revoke every key and API token the member holds (each revocation
    audited): a removed member's keys and tokens stop working; 3. freeze the member's name on
    their usage records, so their spend history stays attributed after the reference goes;
    4. delete the membership."""
    with transaction.atomic():
        _lock_owner_change(member=member, new_role=None, actor=actor)
        lock_for_delete(Member, [member.pk])
        revoke_member_access(member=member, actor=actor)
        freeze_subject_name(organization_id=member.organization_id, name="member", pk=member.pk, label=str(member))
        audit(organization=member.organization, actor=actor, action="delete", obj=member)
        member.delete()


def revoke_member_access(*, member: Member, actor: Actor) -> None:
    """Revoke every live gateway key and API token the member holds, each audited."""
    for key in ApiKey.objects.select_for_update().filter(member=member, revoked_at__isnull=True).order_by("id"):
        revoke_key(key=key, actor=actor)
    for token in ApiToken.objects.select_for_update().filter(member=member, revoked_at__isnull=True).order_by("id"):
        revoke_token(token=token, actor=actor)


def revoke_user_access(*, user: Any, actor: Actor) -> None:
    """Revoke the keys and API tokens of every membership `user` holds: the user is being
    deleted, which deletes the memberships without `remove_member`."""
    for member in Member.objects.select_related("organization").filter(user=user).order_by("id"):
        revoke_member_access(member=member, actor=actor)


# Tests widen the window between the owner checks and the write (the guard-removal test).
RACE_DELAY_SECONDS = 0.0


def _lock_roles(organization_id: int) -> None:
    # Every change that grants or takes the owner role locks its organization's row first, so
    # they run one at a time per organization and each reads the roles the last one committed.
    # NO KEY: rows that merely reference the organization (usage records) are not blocked.
    Organization.objects.select_for_update(no_key=True).filter(pk=organization_id).values_list("pk").first()


def _require_owner(actor: Actor, organization_id: int) -> None:
    if actor.operator:
        return
    if (
        actor.member_id is None
        or not Member.objects.filter(
            pk=actor.member_id, organization_id=organization_id, role=Member.Role.OWNER
        ).exists()
    ):
        raise NotAllowed("Only an owner can grant or revoke the owner role.", param="role")


def _lock_owner_change(*, member: Member, new_role: str | None, actor: Actor) -> None:
    """Check a role change (new_role None: removal) against the owner rules, inside the caller's
    transaction: 1. lock the organization's roles; 2. re-read the member's role as committed;
    3. the last owner stays; 4. granting or taking owner needs an owner (or the operator)."""
    _lock_roles(member.organization_id)
    member.refresh_from_db(fields=["role"])
    was_owner, is_owner = member.role == Member.Role.OWNER, new_role == Member.Role.OWNER
    if was_owner == is_owner:
        return
    if (
        was_owner
        and not Member.objects.filter(organization_id=member.organization_id, role=Member.Role.OWNER)
        .exclude(pk=member.pk)
        .exists()
    ):
        raise InvalidChange("An organization keeps at least one owner.", param="role")
    _require_owner(actor, member.organization_id)
    if RACE_DELAY_SECONDS:
        time.sleep(RACE_DELAY_SECONDS)
