"""The book of record. Each request outcome is one UsageRecord; unapplied rows are the outbox
that ledger/drain.py applies to the budget windows."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from budgets.models import Budget, Charged, Window
from catalog.models import Connection
from tenants.models import Organization


class UsageRecord(Charged):
    class Status(models.TextChoices):
        SERVED = "served"
        FAILED_UPSTREAM = "failed_upstream"  # known not billed: zero cost, hold released
        ESTIMATED = "estimated"  # outcome unknown: charged at the reserved worst case
        RELEASED = "released"  # the caller released its reservation unused

    request_id = models.CharField(max_length=100, unique=True)
    # Who was charged: the subject columns of budgets.models.Charged, and frozen here as
    # {"project": {"id", "name"}, "member": ..., "api_key": ..., "end_customer": ...}. Those
    # foreign keys go NULL when a subject is deleted; this stays, so spend history remains
    # attributed (names are filled in when the subject is deleted).
    subject = models.JSONField(default=dict, blank=True)
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
    # What the provider reported this request cost, when a report came from the call itself
    # (the gateway) or its caller (the reservation API's settle). Usually equal to cost_nano; a
    # report that reached an already-final record is kept here instead of being lost, and the
    # per-request audit (usage/audit.py) flags every record where the two differ.
    reported_cost_nano = models.BigIntegerField(null=True, blank=True)
    # The reservation API's settle is final: a later settle of the same reservation at another
    # cost is a conflict, answered 409 to that caller and kept here once (the first such report).
    # It is never applied and it is not drift: the record's cost is the first settle's.
    conflicting_cost_nano = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    # How the reserved worst case bounded the prompt: "exact" (the model's tokenizer), "bytes"
    # (the byte bound), or "" when not known (reservation API, expiry).
    input_bound = models.CharField(max_length=5, blank=True, default="")
    # A provider job's id (jobs/): this record settles the job the request submitted.
    job_id = models.CharField(max_length=200, null=True, blank=True)
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
            # The per-request audit: records whose cost differs from what was reported for them.
            models.Index(
                fields=["id"],
                condition=Q(reported_cost_nano__isnull=False) & ~Q(reported_cost_nano=F("cost_nano")),
                name="usage_report_mismatch_idx",
            ),
        ]


class AlertEvent(models.Model):
    """A budget event worth an email: a threshold crossed, a ceiling's first refusal, or a
    counter the audit found drifting. One per (window, kind, threshold) — the unique
    constraint, not a read-then-insert, is what keeps racing drains to one email.

    The row is also the email's outbox: delivery is claimed by compare-and-set on `status`, so
    the queued task, its retries and the catch-up (`send_pending_alerts`) never send it twice.
    """

    class Kind(models.TextChoices):
        THRESHOLD = "threshold"  # spent crossed `threshold` percent of the amount
        REFUSAL = "refusal"  # a blocking ceiling refused a request for the first time
        AUDIT_DRIFT = "audit_drift"  # a counter disagrees with the rows it summarises

    class Delivery(models.TextChoices):
        PENDING = "pending"  # not sent yet; with attempts > 0 it is waiting to retry
        SENDING = "sending"  # claimed by a worker
        SENT = "sent"
        FAILED = "failed"  # gave up (attempts exhausted, or no one to send to): see last_error
        # Not sent: a higher threshold was crossed at the same time (a budget created or
        # lowered mid-period, or one large request); recorded so it never fires later.
        SKIPPED = "skipped"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="alert_events")
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alert_events")
    window = models.ForeignKey(Window, on_delete=models.CASCADE, related_name="alert_events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # Percent of the amount for thresholds; 0 for the other kinds (not NULL: NULLs are distinct
    # in a unique constraint, so NULL would let racing workers insert the event twice).
    threshold = models.PositiveSmallIntegerField(default=0)
    # The window as it was when the event was created (what the email reports).
    spent_nano = models.BigIntegerField(default=0)
    reserved_nano = models.BigIntegerField(default=0)
    amount_nano = models.BigIntegerField(default=0)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Refusal events are one per window per hour: the hour (hours since the epoch, UTC); 0 for
    # the other kinds. `refusals` counts the refused requests that hour (at least 1).
    bucket = models.PositiveIntegerField(default=0)
    refusals = models.PositiveIntegerField(default=0)
    # What tipped it: {"request_id", "key", "customer", "run", "model"} of the refused request,
    # or of the last usage record charged to the window when a threshold was crossed.
    tipped_by = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=10, choices=Delivery.choices, default=Delivery.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    recipients = models.JSONField(default=list, blank=True)  # who it was (last) sent to
    claimed_at = models.DateTimeField(null=True, blank=True)  # the current claim (a token)
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # when the catch-up may try
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["window", "kind", "threshold", "bucket"], name="alert_event_unique_per_window_bucket"
            ),
            models.CheckConstraint(
                condition=Q(kind="threshold", threshold__gt=0) | (~Q(kind="threshold") & Q(threshold=0)),
                name="alert_event_threshold_matches_kind",
            ),
        ]
        indexes = [
            # The catch-up scans only undelivered events.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=["pending", "sending"]),
                name="alert_event_outbox_idx",
            ),
            models.Index(fields=["organization", "-created_at"], name="alert_event_org_recent_idx"),
        ]

    def __str__(self) -> str:
        what = f"{self.threshold}%" if self.kind == self.Kind.THRESHOLD else self.kind
        return f"{what} on window {self.window_id}"


class AuditRun(models.Model):
    """One run of the counter audit (usage/audit.py): what it checked and every drift found."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    windows_checked = models.PositiveIntegerField(default=0)
    drift_count = models.PositiveIntegerField(default=0)
    # [{"window_id", "budget_id", "organization_id", "counter", "expected_nano", "actual_nano"}]
    drifts = models.JSONField(default=list, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="audit_run_recent_idx")]

    @property
    def ok(self) -> bool:
        return self.drift_count == 0


# Channels, webhook deliveries and alert settings live in their own module (registered here).
from usage.alert_models import AlertChannel, AlertDelivery, AlertSettings  # noqa: E402, F401
