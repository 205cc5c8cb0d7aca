"""Where an organization's alerts go: its channels (email addresses, signed webhooks), each
webhook delivery with its attempts, and the organization's alert settings.

Imported by alerts/models.py so Django registers them with the `usage` app.
"""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q
from django.utils import timezone

from catalog.models import EncryptedTextField
from tenants.models import Organization


def new_webhook_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class AlertSettings(models.Model):
    """Per-organization alert choices. No row means the defaults."""

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="alert_settings")
    # A run budget exists per X-Capgate-Run: an agent fleet makes hundreds a day. They are
    # enforced either way; emailing about each one is opt-in.
    alert_run_budgets = models.BooleanField(default=False)


class AlertChannel(models.Model):
    """Where an organization's alerts go besides the budget's own recipients."""

    class Kind(models.TextChoices):
        EMAIL = "email"  # `emails`: added to every alert email's recipients
        WEBHOOK = "webhook"  # `url`: a signed POST per alert

    class Format(models.TextChoices):
        CAPGATE = "capgate"  # the event as JSON (docs/operations.md, "Alert webhooks")
        SLACK = "slack"  # {"text": ...}: a Slack (or Mattermost, ...) incoming webhook

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="alert_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    emails = models.JSONField(default=list, blank=True)
    url = models.URLField(max_length=500, blank=True)
    payload_format = models.CharField(max_length=10, choices=Format.choices, default=Format.CAPGATE)
    # HMAC-SHA256 key for the signature header; shown once when created, stored encrypted.
    secret = EncryptedTextField(blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="alert_channel_unique_name"),
            models.CheckConstraint(condition=Q(kind="email") | ~Q(url=""), name="alert_channel_webhook_has_url"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AlertDelivery(models.Model):
    """One alert sent to one webhook channel: its own outbox row, claimed like AlertEvent."""

    class Status(models.TextChoices):
        PENDING = "pending"  # not delivered yet; with attempts > 0, waiting to retry
        SENDING = "sending"  # claimed by a worker
        SENT = "sent"  # the receiver answered 2xx
        FAILED = "failed"  # attempts exhausted, or the destination is not allowed

    event = models.ForeignKey("usage.AlertEvent", on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)  # the last answer's HTTP status
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "channel"], name="alert_delivery_once_per_channel"),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=["pending", "sending"]),
                name="alert_delivery_outbox_idx",
            ),
            models.Index(fields=["organization", "-created_at"], name="alert_delivery_org_recent_idx"),
        ]
