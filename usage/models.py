"""The book of record. Each request outcome is one UsageRecord; unapplied rows are the outbox
that usage/drain.py applies to the budget windows."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from catalog.models import Connection
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project


class UsageRecord(models.Model):
    class Status(models.TextChoices):
        SERVED = "served"
        FAILED_UPSTREAM = "failed_upstream"  # known not billed: zero cost, hold released
        ESTIMATED = "estimated"  # outcome unknown: charged at the reserved worst case
        RELEASED = "released"  # the caller released its reservation unused

    request_id = models.CharField(max_length=100, unique=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="usage_records")
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    member = models.ForeignKey(Member, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    run_id = models.CharField(max_length=200, null=True, blank=True)
    reservation_id = models.UUIDField(null=True, blank=True)
    connection = models.ForeignKey(Connection, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    model = models.CharField(max_length=200, blank=True)  # the name the caller asked for
    provider_model = models.CharField(max_length=200, blank=True)  # what the upstream served
    status = models.CharField(max_length=20, choices=Status.choices)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    cost_nano = models.BigIntegerField(default=0)
    reserved_nano = models.BigIntegerField(default=0)  # the worst case admitted for it
    # What the provider billed above the reserved worst case: the only way past a cap, measured.
    excess_nano = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    admitted_at = models.DateTimeField()  # usage belongs to the windows of this moment
    created_at = models.DateTimeField(auto_now_add=True)
    applied = models.BooleanField(default=False)
    applied_at = models.DateTimeField(null=True, blank=True)
    # The windows this record was charged to (kept so a late correction hits the same ones).
    window_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(cost_nano__gte=0), name="usage_cost_nonnegative"),
            models.CheckConstraint(condition=Q(reserved_nano__gte=0), name="usage_reserved_nonnegative"),
            models.CheckConstraint(condition=Q(excess_nano__gte=0), name="usage_excess_nonnegative"),
        ]
        indexes = [
            # The outbox: the drain scans only unapplied rows.
            models.Index(fields=["id"], condition=Q(applied=False), name="usage_outbox_idx"),
            models.Index(fields=["organization", "admitted_at"]),
            models.Index(fields=["end_customer", "admitted_at"]),
            models.Index(fields=["api_key", "admitted_at"]),
        ]
