"""The alert channels page: outsiders get 404 and change nothing, viewers read (without a
webhook's full URL) and cannot write, a webhook's secret is shown once, bad input is a form error
that changes nothing, the run-budget setting and the delivery log."""

from __future__ import annotations

import pytest
from django.urls import reverse

from alerts import channels
from alerts.alert_models import AlertChannel, AlertDelivery, AlertSettings
from alerts.models import AlertEvent
from tenants.audit import Actor
from tenants.models import AuditLogEntry
from tests.api.conftest import Org
from tests.conftest import window_of

from .test_dashboard import browser

HOOK = "https://hooks.example.com/services/T000/B000/abcdefsecretpath"


def alert_state() -> list:
    return [
        sorted(AlertChannel.objects.values_list("id", "name", "kind", "url", "emails", "enabled", "secret")),
        sorted(AlertSettings.objects.values_list("organization_id", "alert_run_budgets")),
        AuditLogEntry.objects.count(),
    ]


def hook(o: Org, **kw) -> AlertChannel:
    channel, _ = channels.create_channel(
        organization=o.tenant.org, actor=Actor(label="test"), **{"name": "ops", "kind": "webhook", "url": HOOK, **kw}
    )
    return channel


def urls(o: Org, channel: AlertChannel) -> list[tuple[str, str]]:
    s = o.slug
    return [
        ("get", reverse("dashboard:alert_channels", args=[s])),
        ("post", reverse("dashboard:alert_channels", args=[s])),
        ("get", reverse("dashboard:alert_channel_new", args=[s])),
        ("post", reverse("dashboard:alert_channel_new", args=[s])),
        ("get", reverse("dashboard:alert_channel_edit", args=[s, channel.id])),
        ("post", reverse("dashboard:alert_channel_edit", args=[s, channel.id])),
        ("post", reverse("dashboard:alert_channel_delete", args=[s, channel.id])),
    ]


PAYLOAD = {
    "name": "x",
    "kind": "email",
    "emails": "x@example.com",
    "alert_run_budgets": "on",
    "enabled": "on",
    "rotate_secret": "on",
}


@pytest.mark.django_db
def test_outsider_gets_404_and_changes_nothing(org_a: Org, org_b: Org):
    channel = hook(org_a)
    c = browser(org_b.owner)
    before = alert_state()
    for method, url in urls(org_a, channel):
        assert getattr(c, method)(url, PAYLOAD).status_code == 404, (method, url)
    # acme's channel id through globex's own URLs
    theirs = hook(org_b, name="theirs")
    before = alert_state()
    for method, url in urls(org_b, theirs):
        if f"/{theirs.id}/" in url:
            url = url.replace(f"/{theirs.id}/", f"/{channel.id}/")
            assert getattr(c, method)(url, PAYLOAD).status_code == 404, (method, url)
    assert alert_state() == before
    assert HOOK not in c.get(reverse("dashboard:alert_channels", args=[org_b.slug])).content.decode().replace(
        theirs.url, ""
    )


@pytest.mark.django_db
def test_viewer_reads_without_the_webhook_url_and_cannot_write(org_a: Org, role_users):
    channel = hook(org_a)
    c = browser(role_users["viewer"][0])
    before = alert_state()
    page = c.get(reverse("dashboard:alert_channels", args=[org_a.slug]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "ops" in html and "hooks.example.com" in html and "abcdefsecretpath" not in html
    for method, url in urls(org_a, channel):
        if method == "post" or "/new/" in url or f"/{channel.id}/" in url:
            assert getattr(c, method)(url, PAYLOAD).status_code == 403, (method, url)
    assert alert_state() == before


@pytest.mark.django_db
def test_owner_creates_a_webhook_and_sees_its_secret_once(org_a: Org):
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:alert_channel_new", args=[org_a.slug]),
        {
            "name": "slack",
            "kind": "webhook",
            "url": HOOK,
            "payload_format": "slack",
            "enabled": "on",
            "emails": "stale@example.com",
        },
    )
    assert r.status_code == 200
    channel = AlertChannel.objects.get(name="slack")
    assert (channel.kind, channel.url, channel.payload_format, channel.emails) == ("webhook", HOOK, "slack", [])
    assert channel.secret.startswith("whsec_") and channel.secret in r.content.decode()
    listing = c.get(reverse("dashboard:alert_channels", args=[org_a.slug])).content.decode()
    assert channel.secret not in listing and HOOK in listing
    edit = reverse("dashboard:alert_channel_edit", args=[org_a.slug, channel.id])
    assert channel.secret not in c.get(edit).content.decode()
    # rotating shows the new secret once; an edit without rotating shows none
    old = channel.secret
    r = c.post(edit, {"name": "slack", "url": HOOK, "payload_format": "slack", "enabled": "on", "rotate_secret": "on"})
    channel.refresh_from_db()
    assert channel.secret != old and channel.secret in r.content.decode()
    r = c.post(edit, {"name": "slack2", "url": HOOK, "payload_format": "capgate"})
    assert r.status_code == 302
    channel.refresh_from_db()
    assert (channel.name, channel.enabled, channel.payload_format) == ("slack2", False, "capgate")
    assert c.post(reverse("dashboard:alert_channel_delete", args=[org_a.slug, channel.id])).status_code == 302
    assert not AlertChannel.objects.filter(pk=channel.pk).exists()


@pytest.mark.django_db
def test_owner_creates_an_email_channel(org_a: Org):
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:alert_channel_new", args=[org_a.slug]),
        {
            "name": "oncall",
            "kind": "email",
            "emails": "a@example.com, b@example.com",
            "url": HOOK,
            "payload_format": "capgate",
            "enabled": "on",
        },
    )
    assert r.status_code == 302
    channel = AlertChannel.objects.get(name="oncall")
    assert (channel.emails, channel.url, channel.secret) == (["a@example.com", "b@example.com"], "", "")


@pytest.mark.parametrize(
    "data,field",
    [
        ({"kind": "email", "emails": "not-an-address"}, "emails"),
        ({"kind": "email", "emails": ""}, "emails"),
        ({"kind": "webhook", "url": "http://169.254.169.254/latest"}, "url"),  # not a public address
        ({"kind": "webhook", "url": "ftp://example.com/"}, "url"),
        ({"kind": "webhook", "url": HOOK, "name": "ops"}, "name"),  # taken
    ],
)
@pytest.mark.django_db
def test_bad_channels_are_form_errors_and_change_nothing(org_a: Org, data, field):
    hook(org_a)
    c = browser(org_a.owner)
    before = alert_state()
    r = c.post(
        reverse("dashboard:alert_channel_new", args=[org_a.slug]),
        {"name": "new", "payload_format": "capgate", "enabled": "on", **data},
    )
    assert r.status_code == 200 and field in r.context["form"].errors, r.context["form"].errors
    assert 'class="error-summary"' in r.content.decode()
    assert alert_state() == before


@pytest.mark.django_db
def test_run_budget_alerts_setting_and_delivery_log(org_a: Org):
    c = browser(org_a.owner)
    url = reverse("dashboard:alert_channels", args=[org_a.slug])
    assert c.post(url, {"alert_run_budgets": "on"}).status_code == 302
    assert channels.alert_settings(organization=org_a.tenant.org).alert_run_budgets is True
    assert c.post(url, {}).status_code == 302
    assert channels.alert_settings(organization=org_a.tenant.org).alert_run_budgets is False
    # a failed delivery is listed with its HTTP status and error
    channel = hook(org_a)
    org_a.tenant.admit(worst_nano=1)  # creates the budget's window
    window = window_of(org_a.budget)
    event = AlertEvent.objects.create(
        organization=org_a.tenant.org, budget=org_a.budget, window=window, kind="threshold", threshold=80
    )
    AlertDelivery.objects.create(
        event=event,
        channel=channel,
        organization=org_a.tenant.org,
        status="failed",
        attempts=5,
        response_status=500,
        last_error="HTTP 500 from receiver",
    )
    html = c.get(url).content.decode()
    assert "HTTP 500 from receiver" in html and "80%" in html
