"""The audit log every administrative change goes through, and who makes a change (Actor).

Every app's services write through `audit` and `save_changes` here (tenants is the lowest app,
so all may import it): each create, update and delete of a tenant, budget, connection, rate
limit or alert channel leaves one AuditLogEntry with what changed. See docs/decisions.md
(2026-12-01, "Audit helpers live in tenants/audit.py").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.retention import delete_expired
from tenants.models import ApiToken, AuditLogEntry, Member, Organization

SECRET_CHANGED = "(changed)"


@dataclass(frozen=True)
class Actor:
    """Who makes a change, as the audit log names it."""

    label: str
    user_id: int | None = None
    # The acting membership, when a person acts in an organization (owner checks read it); tokens
    # have none. `operator`: the deployment's operator (`manage.py apply`), above every role.
    member_id: int | None = None
    operator: bool = False

    @classmethod
    def of_user(cls, user: Any) -> Actor:
        return cls(label=user.email or user.get_username(), user_id=user.pk)

    @classmethod
    def of_member(cls, member: Member) -> Actor:
        user = member.user
        return cls(label=user.email or user.get_username(), user_id=user.pk, member_id=member.pk)

    @classmethod
    def of_token(cls, token: ApiToken) -> Actor:
        # No member_id: a token never acts as an owner (its scope's ceiling is admin).
        user_id = token.member.user_id if token.member is not None else token.created_by_id
        return cls(label=f"token {token.name} ({token.prefix}…)", user_id=user_id)


APPLY = Actor(label="apply", operator=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, models.Model):
        # Named for the reader, numbered so two objects with one name still differ.
        return f"{value} #{value.pk}"
    return value


def snapshot(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    return {f: _jsonable(getattr(obj, f)) for f in fields}


def audit(
    *,
    organization: Organization | None,
    actor: Actor,
    action: str,
    obj: models.Model,
    changes: Mapping[str, Any] | None = None,
) -> AuditLogEntry:
    """One entry; organization None for a deployment-wide change (the list-price catalog)."""
    entry = _entry(organization, actor, action, obj, changes)
    entry.save()
    return entry


def audit_all(
    *,
    organization: Organization | None,
    actor: Actor,
    entries: Iterable[tuple[str, models.Model, Mapping[str, Any] | None]],
) -> list[AuditLogEntry]:
    """Many (action, obj, changes) entries in one insert, for a load that changes many objects."""
    return AuditLogEntry.objects.bulk_create(_entry(organization, actor, *e) for e in entries)


def _entry(
    organization: Organization | None,
    actor: Actor,
    action: str,
    obj: models.Model,
    changes: Mapping[str, Any] | None,
) -> AuditLogEntry:
    return AuditLogEntry(
        organization=organization,
        actor_user_id=actor.user_id,
        actor=actor.label[:200],
        action=action,
        object_type=obj._meta.model_name or "",
        object_id=str(obj.pk),
        object_repr=str(obj)[:300],
        changes=dict(changes or {}),
    )


def save_changes(
    *,
    obj: models.Model,
    organization: Organization,
    actor: Actor,
    fields: Mapping[str, Any],
    secret_fields: Iterable[str] = (),
) -> dict[str, list[Any]]:
    """Set `fields` on obj, save and audit what actually changed (nothing changed: no write).

    Values compare as Python values (Decimal("1.0") == Decimal("1.000000")), so re-applying the
    same configuration is a no-op."""
    secret_fields = set(secret_fields)
    before = {name: getattr(obj, name) for name in fields}
    for name, value in fields.items():
        setattr(obj, name, value)
    changed = [name for name in fields if before[name] != getattr(obj, name)]
    if not changed:
        return {}
    obj.save(update_fields=changed)
    changes = {
        name: [SECRET_CHANGED, SECRET_CHANGED]
        if name in secret_fields
        else [_jsonable(before[name]), _jsonable(getattr(obj, name))]
        for name in changed
    }
    audit(organization=organization, actor=actor, action=AuditLogEntry.Action.UPDATE, obj=obj, changes=changes)
    return changes


def prune_audit_log() -> int:
    """Retention: audit log entries older than AUDIT_LOG_RETENTION_DAYS; 0 (the default) keeps
    them for good, since the log is what an organization's own auditors ask for."""
    days = settings.CAPGATE["AUDIT_LOG_RETENTION_DAYS"]
    if not days:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    return delete_expired(table="tenants_auditlogentry", age_column="created_at", cutoff=cutoff)
