"""Who owns what: organizations, their projects, members, gateway keys and end customers."""

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q

KEY_PREFIX = "cg_"


def hash_key(raw: str) -> str:
    # Keys are 32 random bytes: a fast hash is enough (no dictionary to guard against).
    return hashlib.sha256(raw.encode()).hexdigest()


class Organization(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    # When true, models with no price may be called even under a blocking budget; blocking
    # budgets then do not govern that traffic (the dashboard says so).
    allow_unpriced = models.BooleanField(default=False)
    # A run id sent without X-Capgate-Run-Budget-Usd gets this lifetime cap, when set.
    default_run_budget_nano = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(default_run_budget_nano__isnull=True) | Q(default_run_budget_nano__gte=0),
                name="org_default_run_budget_nonnegative",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Project(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100)
    # Default cap for every end customer of this project that has no budget of its own.
    default_customer_budget_nano = models.BigIntegerField(null=True, blank=True)
    default_customer_budget_period = models.CharField(max_length=10, default="month")
    default_customer_budget_mode = models.CharField(max_length=10, default="block")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "slug"], name="project_slug_unique_per_org"),
            models.CheckConstraint(
                condition=Q(default_customer_budget_nano__isnull=True) | Q(default_customer_budget_nano__gte=0),
                name="project_default_customer_budget_nonnegative",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Member(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "user"], name="member_unique_per_org"),
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.role})"


class ApiKey(models.Model):
    """A gateway key. Only its SHA-256 is stored; `prefix` is what the dashboard shows."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    member = models.ForeignKey(Member, on_delete=models.SET_NULL, null=True, blank=True, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    allowed_models = models.JSONField(default=list, blank=True)  # empty: every routed model
    # Output ceiling sent upstream when a request names none (the tighter of this and the
    # route's own default wins), so a bare "Hello" does not reserve the model's maximum output.
    default_max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def generate() -> tuple[str, str, str]:
        """Return (raw key, visible prefix, hash). The raw key is shown once, never stored."""
        raw = KEY_PREFIX + secrets.token_urlsafe(32)
        return raw, raw[:12], hash_key(raw)

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


class EndCustomer(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="end_customers")
    external_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "external_id"], name="end_customer_unique_per_project"),
        ]

    def __str__(self) -> str:
        return self.external_id


TOKEN_PREFIX = "cgt_"


# Roles from least to most power: a token acts with the lower of its member's role and its scope's.
ROLE_ORDER = (Member.Role.VIEWER, Member.Role.MEMBER, Member.Role.ADMIN, Member.Role.OWNER)


class ApiToken(models.Model):
    """A management API token for one organization (not a gateway key: it cannot call /v1/).

    Only its SHA-256 is stored, like gateway keys; `prefix` is what the dashboard shows.
    A token belongs to the member who created it and acts with that member's current role, never
    above its scope (read: viewer; write: admin); with no member it authenticates nothing.
    """

    class Scope(models.TextChoices):
        READ = "read"
        WRITE = "write"

    # The most a scope allows: write never reaches owner (granting or taking the owner role
    # needs an owner signed in, or the operator).
    SCOPE_CEILING = {Scope.READ: Member.Role.VIEWER, Scope.WRITE: Member.Role.ADMIN}

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_tokens")
    # The member it acts for. Removing the member revokes the token (tenants/members.py); a member
    # deleted any other way (their user deleted) leaves it NULL, which authenticates nothing.
    member = models.ForeignKey(Member, on_delete=models.SET_NULL, null=True, blank=True, related_name="api_tokens")
    name = models.CharField(max_length=200)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.READ)
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.scope})"

    @staticmethod
    def generate() -> tuple[str, str, str]:
        """Return (raw token, visible prefix, hash). The raw token is shown once, never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        return raw, raw[:12], hash_key(raw)

    @property
    def can_write(self) -> bool:
        return self.scope == self.Scope.WRITE

    def role_for(self, member_role: str | None) -> str | None:
        """The role this token acts with for a member of `member_role` (None: no member, none)."""
        if member_role is None:
            return None
        ceiling = self.SCOPE_CEILING[self.Scope(self.scope)]
        return min(member_role, ceiling, key=ROLE_ORDER.index)

    @property
    def role(self) -> str | None:
        """The role it acts with now (reads `member`: select it with the token)."""
        return self.role_for(self.member.role if self.member is not None else None)


class AuditLogEntry(models.Model):
    """One administrative change: who changed which object, when, from what to what.

    `changes` maps a field to [from, to] (secrets appear as "(changed)", never in clear).
    Rows outlive the object they describe, so the object is named, not referenced.
    """

    class Action(models.TextChoices):
        CREATE = "create"
        UPDATE = "update"
        DELETE = "delete"

    # Null for deployment-wide changes that belong to no organization (the list-price catalog).
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="audit_log", null=True, blank=True
    )
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor = models.CharField(max_length=200)  # "alice@example.com", "token ci (cgt_abc…)", "apply"
    action = models.CharField(max_length=10, choices=Action.choices)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=300)
    changes = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["organization", "-created_at"]),
            # retention deletes by age across organizations (tenants/audit.py, prune_audit_log)
            models.Index(fields=["created_at"], name="audit_log_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type} {self.object_repr}"
