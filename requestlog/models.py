"""The request log: one row per gateway request, whatever became of it.

Admitted requests already have their row — the UsageRecord (served, failed_upstream,
estimated, released), the book of record. Requests refused before admission (402, 429, and
other errors once the key is known) have none there, and must not get one: usage records are
money, kept for the audit and for lifetime windows. They get a `Refusal` row instead, written
in batches off the admission path (requestlog/buffer.py). `RequestLogEntry` is a database
view, UNION ALL of the two, that every reader (dashboard, API, CSV) queries as one table.
"""

from django.db import models
from django.db.models import Q

from catalog.models import Connection
from ledger.models import Budget
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project


class Refusal(models.Model):
    """A gateway request answered with an error before anything was reserved."""

    class Status(models.TextChoices):
        REFUSED = "refused"  # 402: a ceiling (named by `code`, `budget`) or a cap rule refused it
        RATE_LIMITED = "rate_limited"  # 429: a rate limit or the tenant's upstream concurrency
        REJECTED = "rejected"  # any other error after the key was known (400, 401, 403, 404, 409, 503)

    request_id = models.CharField(max_length=100, unique=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    member = models.ForeignKey(Member, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Indexed by (key, time) and (customer, time) below, which also serve the deletes' lookups.
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    run_id = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    endpoint = models.CharField(max_length=20, blank=True)  # chat | messages | embeddings | responses
    status = models.CharField(max_length=20, choices=Status.choices)
    code = models.CharField(max_length=100)  # the error code the client read
    http_status = models.PositiveSmallIntegerField()
    budget = models.ForeignKey(Budget, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    reserved_nano = models.BigIntegerField(default=0)  # the worst case that did not fit (402 by a ceiling)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField()  # when the gateway answered, not when the row was flushed

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(reserved_nano__gte=0), name="refusal_reserved_nonnegative"),
        ]
        indexes = [
            models.Index(fields=["organization", "created_at"], name="refusal_org_time_idx"),
            models.Index(fields=["created_at"], name="refusal_retention_idx"),  # the retention sweep
            # The log's key, customer and run filters read a page along these, as the usage
            # records' own (requestlog/pages.py), not the organization's 90 days of refusals.
            models.Index(fields=["api_key", "created_at"], name="refusal_key_time_idx"),
            models.Index(fields=["end_customer", "created_at"], name="refusal_customer_time_idx"),
            models.Index(
                fields=["organization", "run_id", "created_at"], condition=~Q(run_id=""), name="refusal_run_time_idx"
            ),
        ]


class RequestLogEntry(models.Model):
    """Read-only: the `requestlog_entry` view (migration 0001). `request_id` is unique across
    both sides: gateway ids are `req_` + a uuid, and a request has a usage record only if it
    was admitted and a refusal row only if it was not."""

    class Status(models.TextChoices):
        SERVED = "served"
        FAILED_UPSTREAM = "failed_upstream"
        ESTIMATED = "estimated"
        RELEASED = "released"
        REFUSED = "refused"
        RATE_LIMITED = "rate_limited"
        REJECTED = "rejected"

    request_id = models.CharField(max_length=100, primary_key=True)
    source = models.CharField(max_length=10)  # usage | refusal
    row_id = models.BigIntegerField()  # the UsageRecord's or Refusal's id
    organization = models.ForeignKey(Organization, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False)
    project = models.ForeignKey(Project, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False)
    member = models.ForeignKey(Member, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False)
    api_key = models.ForeignKey(ApiKey, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False)
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False
    )
    connection = models.ForeignKey(
        Connection, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False
    )
    budget = models.ForeignKey(Budget, on_delete=models.DO_NOTHING, null=True, related_name="+", db_constraint=False)
    run_id = models.CharField(max_length=200, null=True)
    model = models.CharField(max_length=200)
    provider_model = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=Status.choices)
    code = models.CharField(max_length=100)
    http_status = models.PositiveSmallIntegerField(null=True)
    input_tokens = models.BigIntegerField()
    output_tokens = models.BigIntegerField()
    reserved_nano = models.BigIntegerField()
    cost_nano = models.BigIntegerField()
    excess_nano = models.BigIntegerField()
    latency_ms = models.PositiveIntegerField(null=True)
    message = models.TextField()
    at = models.DateTimeField()  # admitted at (usage) or answered at (refusal)
    input_bound = models.CharField(max_length=5)  # "exact" | "bytes" | "" (see UsageRecord)
    job_id = models.CharField(max_length=200, null=True)  # the provider job this request submitted

    class Meta:
        managed = False
        db_table = "requestlog_entry"
