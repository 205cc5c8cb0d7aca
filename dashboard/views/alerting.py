"""Where alerts go: the organization's alert channels (email addresses, signed webhooks), the
webhook delivery log, and the run-budget alert setting. Each POST calls one alerts/channels.py
service; its InvalidChange comes back as a form error and nothing is changed.

A webhook's signing secret is shown once, in the response that created or rotated it. A webhook
URL can itself be a credential (Slack's are), so only owners and admins see it whole."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from alerts import channels
from alerts.alert_api import AlertChannelSerializer
from alerts.alert_models import AlertChannel, AlertDelivery
from core.errors import InvalidChange
from dashboard.access import org_view, render_org, require_manage
from dashboard.fields import api_field, comma_list, show_list
from dashboard.forms import add_service_error
from tenants.selectors import Access


class ChannelForm(forms.Form):
    name = forms.CharField(max_length=100)
    kind = api_field(
        AlertChannelSerializer,
        "kind",
        initial="email",
        help_text="email: added to every alert email; webhook: a signed POST per alert",
    )
    emails = api_field(
        AlertChannelSerializer,
        "emails",
        parse=comma_list,
        show=show_list,
        required=False,
        widget=forms.Textarea,
        help_text="email channels: comma-separated",
    )
    url = forms.CharField(
        required=False, max_length=500, label="Webhook URL", help_text="webhook channels: a public http(s) URL"
    )
    payload_format = api_field(
        AlertChannelSerializer,
        "payload_format",
        initial="capgate",
        help_text='slack: {"text": …} for Slack-compatible incoming webhooks',
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, channel: AlertChannel | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if channel is not None:
            self.fields["kind"].disabled = True  # a channel's kind is fixed (update_channel)
            if channel.kind == AlertChannel.Kind.WEBHOOK:
                self.fields["rotate_secret"] = forms.BooleanField(
                    required=False,
                    label="Rotate the signing secret",
                    help_text="a new secret is shown once; the old one stops verifying at once",
                )

    def service_kwargs(self) -> dict[str, Any]:
        d = dict(self.cleaned_data)
        # Only the kind's own target is sent: the other field may hold a stale value from the form.
        d.pop("url" if d.get("kind", "email") == AlertChannel.Kind.EMAIL else "emails", None)
        return d


class SettingsForm(forms.Form):
    alert_run_budgets = forms.BooleanField(
        required=False,
        label="Alert on per-run budgets",
        help_text="X-Capgate-Run budgets are enforced either way; off, they send no alerts",
    )


def _shown_url(url: str, access: Access) -> str:
    if access.can_manage or not url:
        return url
    return f"{urlparse(url).scheme}://{urlparse(url).hostname}/…"


@org_view(manage=True)
def alert_channels(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    current = channels.alert_settings(organization=org)
    # Bound on every POST: an unticked box sends nothing, and an empty POST still means "off".
    settings_form = SettingsForm(
        request.POST if request.method == "POST" else None, initial={"alert_run_budgets": current.alert_run_budgets}
    )
    if request.method == "POST":
        require_manage(access)
        if settings_form.is_valid():
            channels.set_alert_settings(
                organization=org, actor=access.actor, alert_run_budgets=settings_form.cleaned_data["alert_run_budgets"]
            )
            messages.success(request, "Alert settings saved.")
            return redirect("dashboard:alert_channels", org.slug)
    rows = [(c, _shown_url(c.url, access)) for c in org.alert_channels.order_by("name")]
    deliveries = (
        AlertDelivery.objects.filter(organization=org)
        .select_related("channel", "event__budget")
        .order_by("-created_at", "-id")
    )
    page = Paginator(deliveries, 50).get_page(request.GET.get("page"))
    return render_org(
        request,
        access,
        "dashboard/alert_channels.html",
        "alert_channels",
        channels=rows,
        settings_form=settings_form,
        page=page,
    )


@org_view(manage=True)
def alert_channel_edit(request: HttpRequest, access: Access, pk: int | None = None) -> HttpResponse:
    require_manage(access)
    org = access.organization
    channel = get_object_or_404(AlertChannel, pk=pk, organization=org) if pk else None
    initial = {f: getattr(channel, f) for f in channels.FIELDS} if channel else None
    form = ChannelForm(request.POST or None, initial=initial, channel=channel)
    if request.method == "POST" and form.is_valid():
        try:
            if channel is None:
                channel, secret = channels.create_channel(organization=org, actor=access.actor, **form.service_kwargs())
            else:
                data = form.service_kwargs()
                data.pop("kind", None)
                _changes, secret = channels.update_channel(
                    channel=channel, actor=access.actor, rotate_secret=data.pop("rotate_secret", False), **data
                )
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            if secret:  # rendered once, in this response only
                return render_org(
                    request,
                    access,
                    "dashboard/alert_channel_secret.html",
                    "alert_channels",
                    channel=channel,
                    secret=secret,
                )
            messages.success(request, f"Channel “{channel.name}” saved.")
            return redirect("dashboard:alert_channels", org.slug)
    title = f"Edit alert channel “{channel.name}”" if channel else "New alert channel"
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "alert_channels",
        form=form,
        title=title,
        submit="Save",
        delete_url="dashboard:alert_channel_delete" if channel else None,
        obj=channel,
        note="Webhooks are signed: X-Capgate-Signature is “sha256=” and the hex HMAC-SHA256 of "
        "“<X-Capgate-Timestamp>.<body>” with the channel's secret (docs/operations.md).",
    )


@require_POST
@org_view(manage=True)
def alert_channel_delete(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    channel = get_object_or_404(AlertChannel, pk=pk, organization=access.organization)
    channels.delete_channel(channel=channel, actor=access.actor)
    messages.success(request, f"Channel “{channel.name}” deleted.")
    return redirect("dashboard:alert_channels", access.organization.slug)
