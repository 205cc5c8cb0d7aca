"""What follows from recorded spend: alert events and the runs of the counter audit. The book
of record itself (UsageRecord) is the ledger's (ledger/models.py)."""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from ledger.models import Budget, Window
from tenants.models import Organization


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
    """One run of the counter audit (alerts/audit.py): what it checked and every drift found."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)  # None while it runs
    windows_checked = models.PositiveIntegerField(default=0)
    drift_count = models.PositiveIntegerField(default=0)
    # [{"window_id", "budget_id", "organization_id", "counter", "expected_nano", "actual_nano"}]
    drifts = models.JSONField(default=list, blank=True)
    # The scheduled audit's lease: True while it runs, None after. One True row at most (the
    # constraint), so two scheduled audits never run at once.
    running = models.BooleanField(null=True, blank=True)
    # An incremental run checked the windows changed since the previous run and a rolling
    # sample of the rest: the live windows after this id (None: a full run).
    sample_after_id = models.BigIntegerField(null=True, blank=True)
    incremental = models.BooleanField(default=False, db_default=False)

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="audit_run_recent_idx")]
        constraints = [models.UniqueConstraint(fields=["running"], name="audit_one_running")]

    @property
    def ok(self) -> bool:
        return self.drift_count == 0


# Channels, webhook deliveries and alert settings live in their own module (registered here).
from alerts.alert_models import AlertChannel, AlertDelivery, AlertSettings  # noqa: E402, F401
