"""Rate limits: requests and tokens per minute, declared like budgets (per organization,
project, key or end customer). Counters live in Redis (ratelimits/services.py), not here."""

from django.db import models
from django.db.models import Q

from tenants.models import ApiKey, EndCustomer, Organization, Project


class RateLimit(models.Model):
    class Scope(models.TextChoices):
        ORGANIZATION = "organization"
        PROJECT = "project"
        KEY = "key"
        END_CUSTOMER = "end_customer"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="rate_limits")
    name = models.CharField(max_length=200, blank=True)
    scope = models.CharField(max_length=20, choices=Scope.choices)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="rate_limits")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="rate_limits")
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.CASCADE, null=True, blank=True, related_name="rate_limits"
    )
    # Either may be empty (not limited); a limit limits at least one of them. Both hold up to
    # services.MAX_PER_MINUTE (a 32-bit column refused the API's own maximum with a 500).
    requests_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    # Tokens as admission bounds them: the input bound plus the output ceiling (not the usage).
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(scope="organization", project__isnull=True, api_key__isnull=True, end_customer__isnull=True)
                    | Q(scope="project", project__isnull=False, api_key__isnull=True, end_customer__isnull=True)
                    | Q(scope="key", api_key__isnull=False, project__isnull=True, end_customer__isnull=True)
                    | Q(scope="end_customer", end_customer__isnull=False, project__isnull=True, api_key__isnull=True)
                ),
                name="rate_limit_scope_names_its_subject",
            ),
            models.CheckConstraint(
                condition=Q(requests_per_minute__isnull=False) | Q(tokens_per_minute__isnull=False),
                name="rate_limit_limits_something",
            ),
            models.CheckConstraint(
                condition=(Q(requests_per_minute__isnull=True) | Q(requests_per_minute__gte=1))
                & (Q(tokens_per_minute__isnull=True) | Q(tokens_per_minute__gte=1)),
                name="rate_limit_positive",
            ),
        ]
        indexes = [models.Index(fields=["organization", "scope"])]

    def __str__(self) -> str:
        return self.name or f"{self.scope} rate limit {self.pk}"

    @property
    def label(self) -> str:
        """The limit's name as a refused caller reads it."""
        return self.name or f"{self.scope}_rate_limit_{self.pk}"
