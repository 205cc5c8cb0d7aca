"""Writes on an organization's alert channels and alert settings: validated and audited.

A webhook's secret is generated here and returned once (the API and dashboard show it on
creation, never again); `rotate_secret=True` issues a new one."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction

from alerts.alert_models import AlertChannel, AlertSettings, new_webhook_secret
from catalog.services import check_destination
from core.errors import InvalidChange
from tenants.audit import Actor, audit, save_changes, snapshot
from tenants.models import Organization

FIELDS = ("name", "kind", "emails", "url", "payload_format", "enabled")
MAX_EMAILS = 20


def _check(fields: dict[str, Any], *, kind: str) -> None:
    if "name" in fields and not (fields["name"] or "").strip():
        raise InvalidChange("A channel needs a name.", param="name")
    if kind not in AlertChannel.Kind.values:
        raise InvalidChange(f"Kind must be one of {', '.join(AlertChannel.Kind.values)}.", param="kind")
    if "payload_format" in fields and fields["payload_format"] not in AlertChannel.Format.values:
        raise InvalidChange(
            f"Payload format must be one of {', '.join(AlertChannel.Format.values)}.", param="payload_format"
        )
    if kind == AlertChannel.Kind.EMAIL:
        emails = fields.get("emails", [])
        if not isinstance(emails, list) or not emails or len(emails) > MAX_EMAILS:
            raise InvalidChange(f"An email channel needs 1 to {MAX_EMAILS} addresses.", param="emails")
        for address in emails:
            try:
                validate_email(address)
            except (ValidationError, TypeError):
                raise InvalidChange(f"{address!r} is not an email address.", param="emails") from None
    else:
        url = fields.get("url") or ""
        if urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
            raise InvalidChange("A webhook needs an http(s) URL.", param="url")
        check_destination(url, param="url", what="A webhook URL")


@transaction.atomic
def create_channel(*, organization: Organization, actor: Actor, **fields: Any) -> tuple[AlertChannel, str]:
    """Returns the channel and, for a webhook, its signing secret (shown once)."""
    kind = fields.get("kind", "")
    _check(fields, kind=kind)
    if organization.alert_channels.filter(name=fields["name"]).exists():
        raise InvalidChange(f"A channel named {fields['name']!r} exists.", param="name")
    secret = new_webhook_secret() if kind == AlertChannel.Kind.WEBHOOK else ""
    if kind == AlertChannel.Kind.EMAIL:
        fields = {**fields, "url": ""}
    else:
        fields = {**fields, "emails": []}
    channel = AlertChannel.objects.create(organization=organization, secret=secret, **fields)
    audit(
        organization=organization,
        actor=actor,
        action="create",
        obj=channel,
        changes={k: [None, v] for k, v in snapshot(channel, FIELDS).items()},
    )
    return channel, secret


@transaction.atomic
def update_channel(
    *, channel: AlertChannel, actor: Actor, rotate_secret: bool = False, **fields: Any
) -> tuple[dict[str, list[Any]], str]:
    """The kind cannot change. Returns the changes and the new secret if rotated."""
    fields.pop("kind", None)
    merged = {**snapshot(channel, FIELDS), **fields}
    _check(merged, kind=channel.kind)
    if (
        "name" in fields
        and channel.organization.alert_channels.filter(name=fields["name"]).exclude(pk=channel.pk).exists()
    ):
        raise InvalidChange(f"A channel named {fields['name']!r} exists.", param="name")
    secret = ""
    secret_fields: list[str] = []
    if rotate_secret and channel.kind == AlertChannel.Kind.WEBHOOK:
        secret = fields["secret"] = new_webhook_secret()
        secret_fields = ["secret"]
    changes = save_changes(
        obj=channel, organization=channel.organization, actor=actor, fields=fields, secret_fields=secret_fields
    )
    return changes, secret


def delete_channel(*, channel: AlertChannel, actor: Actor) -> None:
    audit(organization=channel.organization, actor=actor, action="delete", obj=channel)
    channel.delete()


def alert_settings(*, organization: Organization) -> AlertSettings:
    return AlertSettings.objects.filter(organization=organization).first() or AlertSettings(organization=organization)


@transaction.atomic
def set_alert_settings(*, organization: Organization, actor: Actor, alert_run_budgets: bool) -> AlertSettings:
    current, _ = AlertSettings.objects.get_or_create(organization=organization)
    save_changes(
        obj=current,
        organization=organization,
        actor=actor,
        fields={"alert_run_budgets": bool(alert_run_budgets)},
        secret_fields=[],
    )
    return current
