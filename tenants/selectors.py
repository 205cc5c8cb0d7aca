"""Who may see and change what in an organization — one answer for the dashboard and the API.

Anything a caller may not see is reported as "not found" (404), never "forbidden", so an
outsider cannot even learn that an organization or object exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from tenants.audit import Actor
from tenants.models import ApiToken, Member, Organization

MANAGERS = (Member.Role.OWNER, Member.Role.ADMIN)


@dataclass(frozen=True)
class Access:
    organization: Organization
    role: str  # a member's role; a token's member's role, capped by its scope (viewer or admin)
    actor: Actor
    member: Member | None = None
    token: ApiToken | None = None

    @property
    def can_manage(self) -> bool:
        """Owners and admins (and write tokens of owners and admins) manage everything."""
        return self.role in MANAGERS

    @property
    def can_manage_own_keys(self) -> bool:
        return self.can_manage or self.role == Member.Role.MEMBER

    def can_manage_key(self, key: Any) -> bool:
        return self.can_manage or (
            self.role == Member.Role.MEMBER and self.member is not None and key.member_id == self.member.id
        )


def organizations_for(user: Any) -> QuerySet[Organization]:
    if not getattr(user, "is_authenticated", False):
        return Organization.objects.none()
    return Organization.objects.filter(members__user=user).order_by("name", "id")


def access_for_user(*, user: Any, slug: str) -> Access:
    member = (
        Member.objects.select_related("organization", "user").filter(organization__slug=slug, user=user).first()
        if getattr(user, "is_authenticated", False)
        else None
    )
    if member is None:
        raise Http404("No such organization.")
    return Access(organization=member.organization, role=member.role, actor=Actor.of_member(member), member=member)


def access_for_token(*, token: ApiToken, slug: str) -> Access:
    """A token acts for its member with the lower of the member's role and its scope's ceiling
    (tenants.models.ApiToken); `authenticate_token` has read both at this request."""
    role = token.role
    if token.organization.slug != slug or role is None:
        raise Http404("No such organization.")
    return Access(
        organization=token.organization, role=role, actor=Actor.of_token(token), member=token.member, token=token
    )
