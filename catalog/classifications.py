"""Operator classifications of what the billing inventory does not list (catalog.models.
Classification): set by the deployment's staff in the API or `manage.py apply`, audited, read by
the gateway on every request.

Deployment-wide, because a classification decides what every blocking cap sees: an
organization's owner cannot classify for themselves; the operator may classify for one
organization (that one then wins over the deployment's)."""

from __future__ import annotations

import re

from django.db import transaction
from django.db.models import Q

from catalog.models import Classification, ClassificationChange
from core.errors import InvalidChange, NotAllowed
from tenants.audit import Actor, audit
from tenants.models import Organization

ENDPOINTS = ("chat", "messages", "responses", "compact", "embeddings")
_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")


def _check(*, endpoint: str, what: str, name: str, cls: str, reason: str) -> None:
    if endpoint not in ENDPOINTS:
        raise InvalidChange(f"'endpoint' must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
    if what not in Classification.What.values:
        raise InvalidChange(f"'what' must be one of {', '.join(Classification.What.values)}.", param="what")
    if not _NAME.match(name):
        raise InvalidChange(
            "'name' must be 1 to 200 letters, digits or _ . : / - (a field, tool type, beta or header).", param="name"
        )
    if what == "header" and not name.islower():
        raise InvalidChange("A header 'name' is written in lower case.", param="name")
    if cls not in Classification.Cls.values:
        raise InvalidChange(f"'cls' must be one of {', '.join(Classification.Cls.values)}.", param="cls")
    if not reason.strip():
        raise InvalidChange(
            "'reason' is required: say why it cannot change the bill, or why it is refused.", param="reason"
        )


def classify(
    *,
    actor: Actor,
    organization: Organization | None,
    endpoint: str,
    what: str,
    name: str,
    cls: str,
    reason: str,
) -> Classification:
    """Create or change one classification (the operator only), with its audit rows."""
    if not actor.operator:
        raise NotAllowed("Only the deployment's operator (staff) classifies the billing inventory.")
    _check(endpoint=endpoint, what=what, name=name, cls=cls, reason=reason)
    with transaction.atomic():
        row = (
            Classification.objects.select_for_update()
            .filter(organization=organization, endpoint=endpoint, what=what, name=name)
            .first()
        )
        before = row.cls if row is not None else ""
        if row is not None and (row.cls, row.reason) == (cls, reason):
            return row
        if row is None:
            row = Classification(organization=organization, endpoint=endpoint, what=what, name=name)
        row.cls, row.reason, row.updated_by = cls, reason, actor.label[:200]
        row.save()
        ClassificationChange.objects.create(
            organization_slug=organization.slug if organization else "",
            endpoint=endpoint,
            what=what,
            name=name,
            cls_before=before,
            cls_after=cls,
            reason=reason,
            actor=actor.label[:200],
        )
        if organization is not None:
            audit(
                organization=organization,
                actor=actor,
                action="update" if before else "create",
                obj=row,
                changes={"cls": [before or None, cls], "reason": [None, reason]},
            )
    return row


def classes_for(*, organization_id: int) -> dict[tuple[str, str, str], str]:
    """(endpoint, what, name) -> class, for one organization: its own over the deployment's."""
    rows = Classification.objects.filter(Q(organization_id=organization_id) | Q(organization__isnull=True))
    out: dict[tuple[str, str, str], str] = {}
    for row in sorted(rows, key=lambda r: r.organization_id is not None):  # the organization's last: it wins
        out[(row.endpoint, row.what, row.name)] = row.cls
    return out
