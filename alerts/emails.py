"""Alert emails: who gets them and what they say (templates in templates/emails/).

Rendering only: claiming, sending and recording delivery live in alerts/alert_delivery.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string
from django.urls import reverse

from alerts.alert_models import AlertChannel
from alerts.models import AlertEvent
from core.money import format_usd
from ledger.models import Budget
from tenants.models import Member

# Without a timeout a hung SMTP server would hold the worker (and the event's claim) forever.
DEFAULT_SMTP_TIMEOUT = 30


def format_percent(spent_nano: int, amount_nano: int) -> str:
    if amount_nano <= 0:
        return "100%" if spent_nano > 0 else "0%"
    pct = (Decimal(spent_nano) * 100 / Decimal(amount_nano)).quantize(Decimal("0.1"))
    return f"{pct.to_integral_value()}%" if pct == pct.to_integral_value() else f"{pct}%"


def recipients_for(budget: Budget) -> list[str]:
    """The budget's own recipients, else the organization's owners; plus the addresses of the
    organization's enabled email channels. One message to all of them."""

    chosen = [r.strip() for r in budget.recipients or [] if isinstance(r, str) and "@" in r]
    if not chosen:
        chosen = list(
            Member.objects.filter(organization_id=budget.organization_id, role=Member.Role.OWNER)
            .exclude(user__email="")
            .values_list("user__email", flat=True)
        )
    for emails in AlertChannel.objects.filter(
        organization_id=budget.organization_id, enabled=True, kind=AlertChannel.Kind.EMAIL
    ).values_list("emails", flat=True):
        chosen += [e.strip() for e in emails or [] if isinstance(e, str) and "@" in e]
    return sorted(set(chosen))


def subject_label(budget: Budget) -> str:
    """What the budget caps, in words: "organization Acme", "key prod (cg_Ab12…)"."""
    scope = Budget.Scope
    match budget.scope:
        case scope.PROJECT:
            return f"project {budget.project.name}" if budget.project else "a project"
        case scope.MEMBER:
            user = budget.member.user if budget.member else None
            return f"member {user.email or user.get_username()}" if user else "a member"
        case scope.KEY:
            return f"key {budget.api_key}" if budget.api_key else "a key"
        case scope.END_CUSTOMER:
            return f"end customer {budget.end_customer}" if budget.end_customer else "an end customer"
        case scope.RUN:
            return f"run {budget.run_id}"
        case _:
            return f"organization {budget.organization.name}"


def period_label(event: AlertEvent) -> str:
    window, budget = event.window, event.budget
    if window.period_end is None:
        return "lifetime"
    try:
        zone = ZoneInfo(budget.timezone)
    except (KeyError, ValueError):
        zone = ZoneInfo("UTC")
    start, end = window.period_start.astimezone(zone), window.period_end.astimezone(zone)
    return f"{budget.period}: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({budget.timezone})"


def dashboard_url(event: AlertEvent) -> str:
    """The dashboard page for the event: the budget that alerted, or the audit page for drift.
    Just the base URL if the dashboard cannot say: a link must never stop an alert."""
    base = settings.CAPGATE.get("DASHBOARD_URL", "http://127.0.0.1:8000").rstrip("/")
    slug = event.budget.organization.slug
    try:
        if event.kind == AlertEvent.Kind.AUDIT_DRIFT:
            path = reverse("dashboard:audit", kwargs={"slug": slug})
        else:
            path = reverse("dashboard:budget_edit", kwargs={"slug": slug, "pk": event.budget_id})
    except Exception:  # NoReverseMatch, or a dashboard that fails to import
        path = "/"
    return base + path


def earlier_refusals(event: AlertEvent) -> tuple[int, object] | None:
    """For a refusal alert: how many requests the window refused in its previous alerted hour,
    when that hour saw more than the one its own alert reported."""
    if event.kind != AlertEvent.Kind.REFUSAL:
        return None
    prev = (
        AlertEvent.objects.filter(window_id=event.window_id, kind=AlertEvent.Kind.REFUSAL, bucket__lt=event.bucket)
        .order_by("-bucket")
        .first()
    )
    if prev is None or prev.refusals <= 1:
        return None
    return prev.refusals, prev.created_at


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str
    html: str


def render_alert(event: AlertEvent) -> Rendered:
    budget = event.budget
    context = {
        "event": event,
        "kind": event.kind,
        "organization": budget.organization.name,
        "budget_name": budget.name or f"{budget.scope.replace('_', ' ')} budget",
        "scope": budget.scope.replace("_", " "),
        "subject_label": subject_label(budget),
        "mode": budget.mode,
        "blocking": budget.mode == Budget.Mode.BLOCK,
        "threshold": event.threshold,
        "spent": format_usd(event.spent_nano),
        "reserved": format_usd(event.reserved_nano),
        "amount": format_usd(event.amount_nano),
        "percent": format_percent(event.spent_nano, event.amount_nano),
        "period": period_label(event),
        "detail": event.detail,
        "dashboard_url": dashboard_url(event),
        "tipped_by": {k: v for k, v in (event.tipped_by or {}).items() if v},
        "refusals": event.refusals,
        "earlier": earlier_refusals(event),
    }
    subject = " ".join(render_to_string("emails/alert_subject.txt", context).split())
    return Rendered(
        subject=subject,
        text=render_to_string("emails/alert.txt", context),
        html=render_to_string("emails/alert.html", context),
    )


def send_alert(*, event: AlertEvent, recipients: list[str]) -> None:
    """Send one message to all recipients through Django's email backend. Raises on failure
    (smtplib errors are OSErrors): the caller records it and retries."""
    rendered = render_alert(event)
    timeout = getattr(settings, "EMAIL_TIMEOUT", None) or DEFAULT_SMTP_TIMEOUT
    message = EmailMultiAlternatives(
        subject=rendered.subject,
        body=rendered.text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=recipients,
        connection=get_connection(timeout=timeout),
    )
    message.attach_alternative(rendered.html, "text/html")
    message.send()
