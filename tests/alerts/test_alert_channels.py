"""Alerts people keep reading (issue 10, section 3): signed webhooks with retries on a real
local HTTP server, the destination rule, run budgets quiet by default, one threshold at a time,
throttled refusals that say what tipped them, and the channels API."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from alerts import alerts, webhooks
from alerts.alert_models import AlertChannel, AlertDelivery, AlertSettings
from alerts.alerts import note_refusal, on_windows_changed
from alerts.models import AlertEvent
from alerts.tasks import send_alert_email, send_alert_webhook
from ledger.errors import BudgetExceeded
from tests.alerts.test_alerts import NOV, spend
from tests.conftest import usd, window_of


class Receiver:
    """A real HTTP server on 127.0.0.1 answering each POST with the next planned status."""

    def __init__(self, statuses: list[int]):
        self.statuses = list(statuses)
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/capgate"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def captured(monkeypatch) -> dict[str, list[int]]:
    """Tasks are captured, not published (no worker here; other checkouts share the broker)."""
    seen: dict[str, list[int]] = {"email": [], "webhook": []}
    monkeypatch.setattr(send_alert_email, "apply_async", lambda args, **kw: seen["email"].append(args[0]))
    monkeypatch.setattr(send_alert_webhook, "apply_async", lambda args, **kw: seen["webhook"].append(args[0]))
    alerts._refusals_pending.clear()
    return seen


@pytest.fixture
def receiver():
    r = Receiver([500])
    yield r
    r.stop()


def _webhook(tenant, url: str, **kw) -> tuple[AlertChannel, str]:
    from alerts.channels import create_channel
    from tenants.audit import Actor

    return create_channel(
        organization=tenant.org,
        actor=Actor(label="test"),
        name=kw.pop("name", "ops hook"),
        kind="webhook",
        url=url,
        **kw,
    )


def _verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    expected = hmac.new(
        secret.encode(), headers["x-capgate-timestamp"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(headers["x-capgate-signature"], f"sha256={expected}")


@pytest.mark.django_db
def test_a_signed_webhook_is_retried_after_a_500_and_then_delivered(
    acme, receiver, captured, django_capture_on_commit_callbacks
):
    # given: a webhook channel, and a $1 cap at 60% (the 50% threshold)
    channel, secret = _webhook(acme, receiver.url)
    budget = acme.budget(amount="1", name="Org cap")
    with django_capture_on_commit_callbacks(execute=True):
        spend(acme, usd("0.60"))
        on_windows_changed(window_ids=[window_of(budget).id])
    delivery = AlertDelivery.objects.get()
    assert captured["webhook"] == [delivery.id]
    # when: the task's first attempt meets a 500
    with pytest.raises(webhooks.WebhookFailed):
        webhooks.deliver(delivery_id=delivery.id)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("pending", 1, 500)
    # and the catch-up retries once the backoff has passed
    sent = webhooks.send_pending(now=timezone.now() + timedelta(seconds=31))
    # then: two POSTs, both signed over timestamp + body with the channel's secret
    delivery.refresh_from_db()
    assert sent == 1 and (delivery.status, delivery.attempts, delivery.response_status) == ("sent", 2, 200)
    assert len(receiver.received) == 2
    for headers, body in receiver.received:
        assert _verify(secret, headers, body)
        assert headers["x-capgate-delivery"] == str(delivery.id)
    assert not _verify("whsec_wrong", *receiver.received[1])
    payload = json.loads(receiver.received[1][1])
    assert payload["type"] == "budget.threshold" and payload["threshold_percent"] == 50
    assert payload["organization"] == "acme" and payload["url"].endswith(f"/o/acme/budgets/{budget.id}/")
    assert payload["tipped_by"]["request_id"]


@pytest.mark.django_db
def test_slack_format_posts_text(acme, captured):
    r = Receiver([200])
    try:
        _webhook(acme, r.url, payload_format="slack")
        budget = acme.budget(amount="1")
        spend(acme, usd("0.60"))
        on_windows_changed(window_ids=[window_of(budget).id])
        assert webhooks.deliver(delivery_id=AlertDelivery.objects.get().id) == "sent"
    finally:
        r.stop()
    body = json.loads(r.received[0][1])
    assert list(body) == ["text"] and "50%" in body["text"]


@pytest.mark.django_db
def test_a_webhook_to_the_gateways_own_network_is_refused_at_connect_time(acme, receiver, settings, monkeypatch):
    # given: a channel saved while loopback was allowed, then the operator allows no networks
    _webhook(acme, receiver.url)
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    budget = acme.budget(amount="1")
    spend(acme, usd("0.60"))
    on_windows_changed(window_ids=[window_of(budget).id])
    delivery = AlertDelivery.objects.get()
    # when
    status = webhooks.deliver(delivery_id=delivery.id)
    # then: failed at once, nothing reached the receiver
    delivery.refresh_from_db()
    assert status == "failed" and "not allowed" in delivery.last_error
    assert receiver.received == []


@pytest.mark.django_db
def test_without_the_destination_guard_the_webhook_reaches_loopback(acme, receiver, settings, monkeypatch):
    # guard removal: the same delivery with the connect-time address check taken out
    from gateway.upstream import transport as upstream

    _webhook(acme, receiver.url)
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    monkeypatch.setattr(upstream, "check_addresses", lambda host, addresses: list(addresses))
    budget = acme.budget(amount="1")
    spend(acme, usd("0.60"))
    on_windows_changed(window_ids=[window_of(budget).id])
    with pytest.raises(webhooks.WebhookFailed):  # the receiver's planned 500
        webhooks.deliver(delivery_id=AlertDelivery.objects.get().id)
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_run_budgets_do_not_alert_unless_the_organization_opts_in(acme, captured):
    # given: a run budget at 60%
    run = acme.budget(amount="1", scope="run", period="lifetime", run_id="agent-7")
    spend(acme, usd("0.60"), subject=acme.subject(run_id="agent-7"))
    # when
    on_windows_changed(window_ids=[window_of(run).id])
    # then
    assert not AlertEvent.objects.exists() and captured["email"] == []
    # when the organization turns run alerts on
    AlertSettings.objects.create(organization=acme.org, alert_run_budgets=True)
    on_windows_changed(window_ids=[window_of(run).id])
    assert list(AlertEvent.objects.values_list("threshold", flat=True)) == [50]


@pytest.mark.django_db
def test_a_budget_created_mid_period_fires_only_the_highest_threshold_crossed(
    acme, captured, django_capture_on_commit_callbacks
):
    # given: 85 cents already spent this month, then a $1 budget with 10/50/80/100%
    spend(acme, usd("0.85"))
    budget = acme.budget(amount="1", thresholds=[10, 50, 80, 100])
    # when: its first window starts at the period's spend, and the next charge is drained
    with django_capture_on_commit_callbacks(execute=True):
        spend(acme, usd("0.01"))
        on_windows_changed(window_ids=[window_of(budget).id])
    # then: one email (80%); 10% and 50% are recorded as skipped and never fire later
    events = {e.threshold: e.status for e in AlertEvent.objects.filter(budget=budget)}
    assert events == {10: "skipped", 50: "skipped", 80: "pending"}
    assert captured["email"] == [AlertEvent.objects.get(budget=budget, threshold=80).id]
    on_windows_changed(window_ids=[window_of(budget).id])
    assert len(captured["email"]) == 1


@pytest.mark.django_db
def test_refusals_alert_once_per_window_per_hour_with_a_count_and_what_tipped_it(
    acme, captured, monkeypatch, django_capture_on_commit_callbacks
):
    # given: a full $0.10 cap
    budget = acme.budget(amount="0.10")
    acme.admit(worst_nano=usd("0.10"), now=NOV)
    with pytest.raises(BudgetExceeded) as refused:
        acme.admit(worst_nano=usd("0.05"), now=NOV)
    window_id = refused.value.window_id
    tipped = {"request_id": "req_abc", "key": "cg_12345678", "customer": "acme-co", "run": "", "model": "gpt-x"}
    monkeypatch.setattr(alerts, "REFUSAL_FLUSH", timedelta(0))  # write every refusal's count at once
    # when: five refusals in one hour, then one the next hour
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(5):
            note_refusal(window_id=window_id, tipped_by=tipped, now=NOV)
        note_refusal(window_id=window_id, tipped_by=tipped, now=NOV + timedelta(hours=1))
    # then: one event per hour, the first counting five; two emails in all
    events = list(AlertEvent.objects.filter(kind="refusal").order_by("bucket"))
    assert [e.refusals for e in events] == [5, 1]
    assert events[0].tipped_by == tipped
    assert captured["email"] == [e.id for e in events]
    # and the email names the refused request and links to the budget
    from alerts.emails import render_alert

    text = render_alert(AlertEvent.objects.select_related("budget__organization", "window").get(pk=events[1].pk)).text
    assert "req_abc" in text and "customer acme-co" in text and "model gpt-x" in text
    assert f"/o/acme/budgets/{budget.id}/" in text
    assert "5 requests were refused" in text


@pytest.mark.django_db
def test_channels_api_validates_hides_the_secret_and_keeps_outsiders_out(acme, outsider, settings):

    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    owner = _client(acme)
    stranger = _client(outsider)
    base = "/api/orgs/acme/alert-channels/"
    # a webhook to loopback: refused with the API's error shape, nothing saved
    bad = owner.post(base, {"name": "x", "kind": "webhook", "url": "http://127.0.0.1:9/hook"}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()["errors"]
    # a public one: the secret is shown once
    made = owner.post(
        base,
        {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/capgate", "payload_format": "slack"},
        format="json",
    )
    assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
    listed = owner.get(base).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [r["secret"] for r in rows] == [None]
    # an outsider: 404 for reading, changing and deleting; nothing changes
    pk = made.json()["id"]
    assert stranger.get(base).status_code == 404
    assert stranger.patch(f"{base}{pk}/", {"enabled": False}, format="json").status_code == 404
    assert stranger.delete(f"{base}{pk}/").status_code == 404
    assert AlertChannel.objects.get(pk=pk).enabled is True
    # settings: run alerts off by default, an owner turns them on, an outsider cannot
    url = "/api/orgs/acme/alert-settings/current/"
    assert owner.get(url).json() == {"alert_run_budgets": False}
    assert stranger.put(url, {"alert_run_budgets": True}, format="json").status_code == 404
    assert owner.put(url, {"alert_run_budgets": True}, format="json").json() == {"alert_run_budgets": True}


def _client(tenant) -> APIClient:
    from django.contrib.auth import get_user_model

    from tenants.models import Member

    user = get_user_model().objects.create_user(f"owner-{tenant.org.slug}", f"owner@{tenant.org.slug}.example", "pw")
    Member.objects.create(organization=tenant.org, user=user, role=Member.Role.OWNER)
    client = APIClient()
    client.force_authenticate(user)
    return client
