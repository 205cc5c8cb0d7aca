"""Writes on tenants: projects, members, gateway keys, end customers, API tokens, and the audit
log every administrative change goes through.

Every function here is called by the dashboard, the management API and `manage.py apply` alike,
so each change is validated and audited once, in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email, validate_slug
from django.db import models, transaction
from django.utils import timezone

from core.errors import CapgateError
from core.money import MAX_AMOUNT_NANO, MAX_AMOUNT_USD
from tenants.models import (
    KEY_PREFIX,
    ApiKey,
    ApiToken,
    AuditLogEntry,
    EndCustomer,
    Member,
    Organization,
    Project,
    hash_key,
)
from tenants.signals import subject_deleting

SECRET_CHANGED = "(changed)"


class InvalidChange(CapgateError):
    """A change that breaks a rule. `param` names the field, so forms and the API can show the
    message next to it."""

    status = 400
    code = "invalid"


class NotAllowed(CapgateError):
    status = 403
    code = "permission_denied"


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
        return cls(label=f"token {token.name} ({token.prefix}…)", user_id=token.created_by_id)


APPLY = Actor(label="apply", operator=True)


# --- audit ------------------------------------------------------------------------------------


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
    *, organization: Organization, actor: Actor, action: str, obj: models.Model,
    changes: Mapping[str, Any] | None = None,
) -> AuditLogEntry:
    return AuditLogEntry.objects.create(
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
    *, obj: models.Model, organization: Organization, actor: Actor, fields: Mapping[str, Any],
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
        name: [SECRET_CHANGED, SECRET_CHANGED] if name in secret_fields
        else [_jsonable(before[name]), _jsonable(getattr(obj, name))]
        for name in changed
    }
    audit(organization=organization, actor=actor, action=AuditLogEntry.Action.UPDATE, obj=obj, changes=changes)
    return changes


# --- organizations and projects -----------------------------------------------------------------

ORGANIZATION_FIELDS = ("name", "allow_unpriced", "default_run_budget_nano")
PROJECT_FIELDS = (
    "name", "slug", "default_customer_budget_nano", "default_customer_budget_period",
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
    audit(organization=organization, actor=actor, action="create", obj=project,
          changes=snapshot(project, PROJECT_FIELDS))
    return project


def update_project(*, project: Project, actor: Actor, **fields: Any) -> dict[str, list[Any]]:
    _only(fields, PROJECT_FIELDS)
    if "slug" in fields:
        _check_slug(fields["slug"], "slug")
        if project.organization.projects.filter(slug=fields["slug"]).exclude(pk=project.pk).exists():
            raise InvalidChange(f"A project with slug {fields['slug']!r} exists.", param="slug")
    _check_project_defaults({**snapshot(project, PROJECT_FIELDS), **fields})
    return save_changes(obj=project, organization=project.organization, actor=actor, fields=fields)


# A deletion races the gateway: an admission inserting a reservation that names the subject takes
# a KEY SHARE lock on its row, and Django's delete collects the rows to SET NULL before deleting.
# Locking the subject rows first (FOR UPDATE) makes new admissions wait and then find it gone (503,
# nothing reserved); one that was already inserting finishes first and is collected. A deadlock
# with an admission holding the subject's budget windows aborts one side; the deletion retries.
DELETE_ATTEMPTS = 5
LOCK_SUBJECTS_FOR_DELETE = True  # guard point: tests switch it off to show the race


def _deleting(fn):
    """Run a subject deletion in its own transaction, retried when a concurrent admission
    deadlocks it or slips a reference in."""
    import functools

    from django.db import IntegrityError, OperationalError

    @functools.wraps(fn)
    def run(**kwargs):
        for attempt in range(DELETE_ATTEMPTS):
            try:
                with transaction.atomic():
                    return fn(**kwargs)
            except (IntegrityError, OperationalError):
                if attempt == DELETE_ATTEMPTS - 1:
                    raise
        return None
    return run


def _lock_for_delete(model: type[models.Model], pks: Iterable[int]) -> None:
    if LOCK_SUBJECTS_FOR_DELETE:
        list(model._default_manager.select_for_update().filter(pk__in=list(pks)).order_by("pk").values_list("pk", flat=True))


@_deleting
def delete_project(*, project: Project, actor: Actor) -> None:
    _lock_for_delete(Project, [project.pk])
    _lock_for_delete(ApiKey, project.api_keys.values_list("pk", flat=True))
    _lock_for_delete(EndCustomer, project.end_customers.values_list("pk", flat=True))
    with transaction.atomic():
        freeze_subject_name(organization_id=project.organization_id, name="project", pk=project.pk, label=str(project))
        for key in project.api_keys.all():  # deleted with the project
            freeze_subject_name(organization_id=project.organization_id, name="api_key", pk=key.pk, label=str(key))
        audit(organization=project.organization, actor=actor, action="delete", obj=project)
        project.delete()


# --- members ------------------------------------------------------------------------------------


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
    _check_role(role)
    with transaction.atomic():
        _lock_owner_change(member=member, new_role=role, actor=actor)
        return save_changes(obj=member, organization=member.organization, actor=actor, fields={"role": role})


@_deleting
def remove_member(*, member: Member, actor: Actor) -> None:
    """Remove a member, in one audited transaction:
    1. keep an owner; 2. revoke every key the member holds (each revocation audited): a removed
    member's keys stop working; 3. freeze the member's name on their usage records, so their
    spend history stays attributed after the reference goes; 4. delete the membership."""
    with transaction.atomic():
        _lock_owner_change(member=member, new_role=None, actor=actor)
        _lock_for_delete(Member, [member.pk])
        for key in ApiKey.objects.select_for_update().filter(member=member, revoked_at__isnull=True).order_by("id"):
            revoke_key(key=key, actor=actor)
        freeze_subject_name(organization_id=member.organization_id, name="member", pk=member.pk, label=str(member))
        audit(organization=member.organization, actor=actor, action="delete", obj=member)
        member.delete()


def freeze_subject_name(*, organization_id: int, name: str, pk: int, label: str) -> None:
    """Have the subject's name written into the `subject` of its usage records before it is
    deleted (their foreign key then goes NULL; the id and name stay). The write is the ledger's
    (ledger.recording.freeze_subject_name, connected to `subject_deleting` in ledger/apps.py):
    tenants sits below it. It runs here, synchronously, inside the deletion's transaction.
    Records of requests still in flight get the name from the deletion's audit entry when they
    are written (ledger.recording)."""
    subject_deleting.send(sender=None, organization_id=organization_id, name=name, pk=pk, label=label)


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
    if actor.member_id is None or not Member.objects.filter(
        pk=actor.member_id, organization_id=organization_id, role=Member.Role.OWNER
    ).exists():
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
    if was_owner and not Member.objects.filter(
        organization_id=member.organization_id, role=Member.Role.OWNER
    ).exclude(pk=member.pk).exists():
        raise InvalidChange("An organization keeps at least one owner.", param="role")
    _require_owner(actor, member.organization_id)
    if RACE_DELAY_SECONDS:
        import time

        time.sleep(RACE_DELAY_SECONDS)


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
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_OUTPUT_CEILING):
        raise InvalidChange(f"A whole number of tokens from 1 to {MAX_OUTPUT_CEILING:,}, or empty.", param=param)


def create_key(
    *, organization: Organization, project: Project, name: str, actor: Actor, member: Member | None = None,
    allowed_models: list[str] | None = None, expires_at: datetime | None = None, raw: str | None = None,
    default_max_output_tokens: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a gateway key; returns (key, raw secret). The raw secret is not stored anywhere.

    `raw` may be given (the demo prints a fixed one); otherwise it is generated."""
    fields = {"name": name, "project": project, "member": member, "allowed_models": allowed_models or [],
              "default_max_output_tokens": default_max_output_tokens}
    _check_key_fields(organization, fields)
    if raw is None:
        raw, prefix, digest = ApiKey.generate()
    else:
        prefix, digest = _check_raw_key(raw)
    key = ApiKey.objects.create(
        organization=organization, prefix=prefix, key_hash=digest, expires_at=expires_at, **fields
    )
    audit(organization=organization, actor=actor, action="create", obj=key,
          changes={**snapshot(key, KEY_FIELDS), "secret": [None, SECRET_CHANGED]})
    return key, raw


def _check_raw_key(raw: str) -> tuple[str, str]:
    if not raw.startswith(KEY_PREFIX) or len(raw) < 24:
        raise InvalidChange(f"A key secret starts with {KEY_PREFIX!r} and has at least 24 characters.",
                            param="secret")
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
    return save_changes(obj=key, organization=key.organization, actor=actor, fields=changes,
                         secret_fields=secret_fields)


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
    audit(organization=project.organization, actor=actor, action="create", obj=customer,
          changes={"project": [None, project.slug], "external_id": [None, external_id]})
    return customer


@_deleting
def delete_end_customer(*, customer: EndCustomer, actor: Actor) -> None:
    org = customer.project.organization
    _lock_for_delete(EndCustomer, [customer.pk])
    with transaction.atomic():
        freeze_subject_name(organization_id=org.id, name="end_customer", pk=customer.pk, label=str(customer))
        audit(organization=org, actor=actor, action="delete", obj=customer)
        customer.delete()


# --- management API tokens ----------------------------------------------------------------------


def create_token(*, organization: Organization, name: str, scope: str, actor: Actor) -> tuple[ApiToken, str]:
    if scope not in ApiToken.Scope.values:
        raise InvalidChange("Scope is read or write.", param="scope")
    if not name.strip():
        raise InvalidChange("A token needs a name.", param="name")
    raw, prefix, digest = ApiToken.generate()
    token = ApiToken.objects.create(
        organization=organization, name=name, scope=scope, prefix=prefix, token_hash=digest,
        created_by_id=actor.user_id,
    )
    audit(organization=organization, actor=actor, action="create", obj=token, changes={"scope": [None, scope]})
    return token, raw


def revoke_token(*, token: ApiToken, actor: Actor) -> None:
    if token.revoked_at is None:
        save_changes(obj=token, organization=token.organization, actor=actor, fields={"revoked_at": timezone.now()})


def authenticate_token(raw: str) -> ApiToken | None:
    token = ApiToken.objects.select_related("organization").filter(
        token_hash=hash_key(raw), revoked_at__isnull=True
    ).first()
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
