"""Where alerts go: the organization's alert channels (email addresses, signed webhooks), the
webhook delivery log, and the run-budget alert setting. Each POST calls one alerts/channels.py
service; its InvalidChange comes back as a form error and nothing is changed.

A webhook's signing secret is shown once, in the response that created or rotated it. A webhook
URL can itself be a credential (Slack's are), so only owners and admins see it whole."""

from __future__ import annotations

from operator import attrgetter
from typing import Any
from urllib.parse import urlparse

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect

from alerts import channels
from alerts.alert_api import AlertChannelSerializer
from alerts.alert_models import AlertChannel, AlertDelivery
from dashboard.access import org_view, render_org, require_manage
from dashboard.fields import api_field, comma_list, show_list
from dashboard.views.crud import Editor, Resource, delete_action, edit_page
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


CHANNELS = Resource(
    AlertChannel, "Channel", "alert_channels", delete_url="dashboard:alert_channel_delete", label=attrgetter("name")
)


class ChannelEditor(Editor):
    resource = CHANNELS
    note = (
        "Webhooks are signed: X-Capgate-Signature is “sha256=” and the hex HMAC-SHA256 of "
        "“<X-Capgate-Timestamp>.<body>” with the channel's secret (docs/operations.md)."
    )

    def form(self, data: QueryDict | None, access: Access, row: AlertChannel | None, query: QueryDict) -> ChannelForm:
        initial = {f: getattr(row, f) for f in channels.FIELDS} if row else None
        return ChannelForm(data, initial=initial, channel=row)

    def save(self, access: Access, row: AlertChannel | None, form: ChannelForm) -> tuple[AlertChannel, str]:
        if row is None:
            return channels.create_channel(
                organization=access.organization, actor=access.actor, **form.service_kwargs()
            )
        data = form.service_kwargs()
        data.pop("kind", None)
        _changes, secret = channels.update_channel(
            channel=row, actor=access.actor, rotate_secret=data.pop("rotate_secret", False), **data
        )
        return row, secret

    def saved(self, request: HttpRequest, access: Access, row: AlertChannel | None, result: Any) -> HttpResponse | None:
        channel, secret = result
        if secret:  # rendered once, in this response only
            return render_org(
                request,
                access,
                "dashboard/alert_channel_secret.html",
                "alert_channels",
                channel=channel,
                secret=secret,
            )
        return super().saved(request, access, row, channel)

    def title(self, row: AlertChannel | None) -> str:
        return f"Edit alert channel “{row.name}”" if row else "New alert channel"


alert_channel_edit = edit_page(ChannelEditor())
alert_channel_delete = delete_action(CHANNELS, channels.delete_channel, instance="channel")
