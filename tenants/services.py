"""Writes on tenants: organizations, projects, gateway keys, end customers, API tokens.

Every function here is called by the dashboard, the management API and `manage.py apply` alike,
so each change is validated and audited once, in one place. Members and the owner rules are in
`tenants/members.py`; the audit log and Actor in `tenants/audit.py`; deleting a subject the
gateway may be admitting in `tenants/deletion.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_slug
from django.db import transaction
from django.utils import timezone

from core.errors import InvalidChange
from core.money import MAX_AMOUNT_NANO, MAX_AMOUNT_USD
from tenants.audit import SECRET_CHANGED, Actor, audit, save_changes, snapshot
from tenants.deletion import deleting, freeze_subject_name, lock_for_delete
from tenants.models import (
    KEY_PREFIX,
    ApiKey,
    ApiToken,
    EndCustomer,
    Member,
    Organization,
    Project,
    hash_key,
)

# --- organizations and projects -----------------------------------------------------------------

ORGANIZATION_FIELDS = ("name", "allow_unpriced", "default_run_budget_nano")
PROJECT_FIELDS = (
    "name",
    "slug",
    "default_customer_budget_nano",
    "default_customer_budget_period",
    "default_customer_budget_mode",
)
_PERIODS = ("day", "week", "month", "lifetime")
_MODES = ("alert", "block")


def _check_nano(value: int | None, field: str) -> None:
    if value is not None and (value < 0 or value > MAX_AMOUNT_NANO):
        raise InvalidChange(f"Must be between 0 and {MAX_AMOUNT_USD:,} USD.", param=field)


def create_organization(*, slug: str, name: str, actor: Actor, **fields: Any) -> Organization:
    _check_slug(slug, "slug")
    if Organization.objects.filter(slug=slug).exists():
        raise InvalidChange(f"An organization with slug {slug!r} exists.", param="slug")
    _check_nano(fields.get("default_run_budget_nano"), "default_run_budget_usd")
    org = Organization.objects.create(slug=slug, name=name, **fields)
    audit(organization=org, actor=actor, action="create", obj=org, changes=snapshot(org, ORGANIZATION_FIELDS))
    return org


def update_organization(*, organization: Organization, actor: Actor, **fields: Any) -> dict[str, list[Any]]:
    _only(fields, ORGANIZATION_FIELDS)
    _check_nano(fields.get("default_run_budget_nano"), "default_run_budget_usd")
    return save_changes(obj=organization, organization=organization, actor=actor, fields=fields)


def _check_slug(slug: str, field: str) -> None:
    try:
        validate_slug(slug)
    except DjangoValidationError as exc:
        raise InvalidChange("Use letters, numbers, hyphens or underscores.", param=field) from exc


def _check_project_defaults(fields: Mapping[str, Any]) -> None:
    _check_nano(fields.get("default_customer_budget_nano"), "default_customer_budget_usd")
    if fields.get("default_customer_budget_period", "month") not in _PERIODS:
        raise InvalidChange(f"Must be one of {', '.join(_PERIODS)}.", param="default_customer_budget_period")
    if fields.get("default_customer_budget_mode", "block") not in _MODES:
        raise InvalidChange("Must be alert or block.", param="default_customer_budget_mode")


def create_project(*, organization: Organization, slug: str, name: str, actor: Actor, **fields: Any) -> Project:
    _only(fields, PROJECT_FIELDS)
    _check_slug(slug, "slug")
    _check_project_defaults(fields)
    if organization.projects.filter(slug=slug).exists():
        raise InvalidChange(f"A project with slug {slug!r} exists.", param="slug")
    project = Project.objects.create(organization=organization, slug=slug, name=name, **fields)
    audit(
        organization=organization, actor=actor, action="create", obj=project, changes=snapshot(project, PROJECT_FIELDS)
    )
    return project


def update_project(*, project: Project, actor: Actor, **fields: Any) -> dict[str, list[Any]]:
    _only(fields, PROJECT_FIELDS)
    if "slug" in fields:
        _check_slug(fields["slug"], "slug")
        if project.organization.projects.filter(slug=fields["slug"]).exclude(pk=project.pk).exists():
            raise InvalidChange(f"A project with slug {fields['slug']!r} exists.", param="slug")
    _check_project_defaults({**snapshot(project, PROJECT_FIELDS), **fields})
    return save_changes(obj=project, organization=project.organization, actor=actor, fields=fields)


@deleting
def delete_project(*, project: Project, actor: Actor) -> None:
    lock_for_delete(Project, [project.pk])
    lock_for_delete(ApiKey, project.api_keys.values_list("pk", flat=True))
    lock_for_delete(EndCustomer, project.end_customers.values_list("pk", flat=True))
    with transaction.atomic():
        freeze_subject_name(organization_id=project.organization_id, name="project", pk=project.pk, label=str(project))
        for key in project.api_keys.all():  # deleted with the project
            freeze_subject_name(organization_id=project.organization_id, name="api_key", pk=key.pk, label=str(key))
        audit(organization=project.organization, actor=actor, action="delete", obj=project)
        project.delete()


# --- gateway keys -------------------------------------------------------------------------------

KEY_FIELDS = ("name", "project", "member", "allowed_models", "expires_at", "default_max_output_tokens")
MAX_OUTPUT_CEILING = 1_000_000


def _check_key_fields(organization: Organization, fields: Mapping[str, Any]) -> None:
    if "name" in fields and not str(fields["name"]).strip():
        raise InvalidChange("A key needs a name.", param="name")
    project = fields.get("project")
    if project is not None and project.organization_id != organization.id:
        raise InvalidChange("No such project.", param="project")
    member = fields.get("member")
    if member is not None and member.organization_id != organization.id:
        raise InvalidChange("No such member.", param="member")
    allowed = fields.get("allowed_models", [])
    if not isinstance(allowed, list) or not all(isinstance(m, str) and m for m in allowed):
        raise InvalidChange("A list of model names.", param="allowed_models")
    check_output_ceiling(fields.get("default_max_output_tokens"))


def check_output_ceiling(value: Any, *, param: str = "default_max_output_tokens") -> None:
    """A default output ceiling: empty, or a whole number of tokens from 1 to 1,000,000."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_CEILING
    ):
        raise InvalidChange(f"A whole number of tokens from 1 to {MAX_OUTPUT_CEILING:,}, or empty.", param=param)


def create_key(
    *,
    organization: Organization,
    project: Project,
    name: str,
    actor: Actor,
    member: Member | None = None,
    allowed_models: list[str] | None = None,
    expires_at: datetime | None = None,
    raw: str | None = None,
    default_max_output_tokens: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a gateway key; returns (key, raw secret). The raw secret is not stored anywhere.

    `raw` may be given (the demo prints a fixed one); otherwise it is generated."""
    fields = {
        "name": name,
        "project": project,
        "member": member,
        "allowed_models": allowed_models or [],
        "default_max_output_tokens": default_max_output_tokens,
    }
    _check_key_fields(organization, fields)
    if raw is None:
        raw, prefix, digest = ApiKey.generate()
    else:
        prefix, digest = _check_raw_key(raw)
    key = ApiKey.objects.create(
        organization=organization, prefix=prefix, key_hash=digest, expires_at=expires_at, **fields
    )
    audit(
        organization=organization,
        actor=actor,
        action="create",
        obj=key,
        changes={**snapshot(key, KEY_FIELDS), "secret": [None, SECRET_CHANGED]},
    )
    return key, raw


def _check_raw_key(raw: str) -> tuple[str, str]:
    if not raw.startswith(KEY_PREFIX) or len(raw) < 24:
        raise InvalidChange(f"A key secret starts with {KEY_PREFIX!r} and has at least 24 characters.", param="secret")
    digest = hash_key(raw)
    if ApiKey.objects.filter(key_hash=digest).exists():
        raise InvalidChange("That secret is already in use.", param="secret")
    return raw[:12], digest


def update_key(*, key: ApiKey, actor: Actor, raw: str | None = None, **fields: Any) -> dict[str, list[Any]]:
    _only(fields, KEY_FIELDS)
    _check_key_fields(key.organization, fields)
    changes: dict[str, Any] = dict(fields)
    secret_fields = []
    if raw is not None and hash_key(raw) != key.key_hash:
        changes["prefix"], changes["key_hash"] = _check_raw_key(raw)
        secret_fields = ["prefix", "key_hash"]
    return save_changes(
        obj=key, organization=key.organization, actor=actor, fields=changes, secret_fields=secret_fields
    )


def revoke_key(*, key: ApiKey, actor: Actor) -> None:
    if key.revoked_at is None:
        save_changes(obj=key, organization=key.organization, actor=actor, fields={"revoked_at": timezone.now()})


# --- end customers ------------------------------------------------------------------------------


def create_end_customer(*, project: Project, external_id: str, actor: Actor) -> EndCustomer:
    external_id = (external_id or "").strip()
    if not external_id or len(external_id) > 200:
        raise InvalidChange("An id of 1 to 200 characters.", param="external_id")
    if project.end_customers.filter(external_id=external_id).exists():
        raise InvalidChange(f"End customer {external_id!r} exists in this project.", param="external_id")
    customer = EndCustomer.objects.create(project=project, external_id=external_id)
    audit(
        organization=project.organization,
        actor=actor,
        action="create",
        obj=customer,
        changes={"project": [None, project.slug], "external_id": [None, external_id]},
    )
    return customer


@deleting
def delete_end_customer(*, customer: EndCustomer, actor: Actor) -> None:
    org = customer.project.organization
    lock_for_delete(EndCustomer, [customer.pk])
    with transaction.atomic():
        freeze_subject_name(organization_id=org.id, name="end_customer", pk=customer.pk, label=str(customer))
        audit(organization=org, actor=actor, action="delete", obj=customer)
        customer.delete()


# --- management API tokens ----------------------------------------------------------------------


def create_token(*, member: Member, name: str, scope: str, actor: Actor) -> tuple[ApiToken, str]:
    """A token for `member`: it acts with the member's role as it is at each request (never above
    its scope) and is revoked when the member is removed."""
    if scope not in ApiToken.Scope.values:
        raise InvalidChange("Scope is read or write.", param="scope")
    if not name.strip():
        raise InvalidChange("A token needs a name.", param="name")
    raw, prefix, digest = ApiToken.generate()
    token = ApiToken.objects.create(
        organization_id=member.organization_id,
        member=member,
        name=name,
        scope=scope,
        prefix=prefix,
        token_hash=digest,
        created_by_id=member.user_id,
    )
    audit(
        organization=member.organization,
        actor=actor,
        action="create",
        obj=token,
        changes={"scope": [None, scope], "member": [None, str(member)], "role": [None, token.role]},
    )
    return token, raw


def revoke_token(*, token: ApiToken, actor: Actor) -> None:
    if token.revoked_at is None:
        save_changes(obj=token, organization=token.organization, actor=actor, fields={"revoked_at": timezone.now()})


def authenticate_token(raw: str) -> ApiToken | None:
    """The live token for `raw`, or None. Live: not revoked, and its member still in the
    organization with an active user; read at every request, so a removal, demotion or
    deactivation applies to the next request."""
    token = (
        ApiToken.objects.select_related("organization", "member__user")
        .filter(
            token_hash=hash_key(raw),
            revoked_at__isnull=True,
            member__isnull=False,
            member__user__is_active=True,
        )
        .first()
    )
    if token is not None:
        # One cheap update per request; coarse (a minute) so a busy token does not write each call.
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def _only(fields: Mapping[str, Any], allowed: Iterable[str]) -> None:
    unknown = set(fields) - set(allowed)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
