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
    role: str  # a member's role; tokens act as admin (write scope) or viewer (read scope)
    actor: Actor
    member: Member | None = None
    token: ApiToken | None = None

    @property
    def can_manage(self) -> bool:
        """Owners, admins and write tokens manage everything."""
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
    if token.organization.slug != slug:
        raise Http404("No such organization.")
    role = Member.Role.ADMIN if token.can_write else Member.Role.VIEWER
    return Access(organization=token.organization, role=role, actor=Actor.of_token(token), token=token)
