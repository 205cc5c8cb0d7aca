"""Alerts: threshold crossings and first refusals become one AlertEvent each, however many
workers race, and each event is emailed once — through a real SMTP server on loopback."""

from __future__ import annotations

import logging
import socket
import time
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth import get_user_model
from django.db import connection

from alerts import alert_delivery, alerts
from alerts.alert_delivery import send_pending
from alerts.alerts import note_refusal, on_windows_changed
from alerts.models import AlertEvent
from alerts.tasks import send_alert_email
from ledger.drain import drain_all
from ledger.errors import BudgetExceeded
from ledger.models import Window
from ledger.recording import Outcome, record
from tenants.models import Member
from tests.concurrency import race
from tests.conftest import usd, window_of

NOV = datetime(2026, 11, 15, 12, tzinfo=UTC)


# --- helpers shared with the other usage tests ----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpInbox:
    """A real SMTP server (aiosmtpd) on 127.0.0.1, in a thread; keeps what it receives."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self._controller: Controller | None = None

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 Message accepted for delivery"

    def start(self) -> SmtpInbox:
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def wait_for(self, n: int, timeout: float = 60) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.messages


def use_smtp(settings, port: int) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_TIMEOUT = 5


class dropped_constraint:  # noqa: N801 (a context manager read as a phrase)
    """Remove a database constraint for one guard-removal test, and put it back.

    The rows the test created are deleted first: they may violate it.
    """

    def __init__(self, table: str, name: str, definition: str):
        self.table, self.name, self.definition = table, name, definition

    def __enter__(self):
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {self.table} DROP CONSTRAINT {self.name}")
        return self

    def __exit__(self, *exc):
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {self.table}")
            cursor.execute(f"ALTER TABLE {self.table} ADD CONSTRAINT {self.name} {self.definition}")


def spend(tenant, cost_nano: int, *, worst_nano: int | None = None, now: datetime = NOV, **kw) -> None:
    r = tenant.admit(worst_nano=cost_nano if worst_nano is None else worst_nano, now=now, **kw)
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=cost_nano))
    drain_all()


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def real_broker():
    """Requested by a test that wants the email task really published."""


@pytest.fixture(autouse=True)
def queued(request, monkeypatch) -> list[int]:
    """The event ids whose email task was queued. Publishing is captured, not sent to Redis:
    no worker runs here, and other checkouts share the broker."""
    ids: list[int] = []
    if "real_broker" not in request.fixturenames:
        monkeypatch.setattr(send_alert_email, "apply_async", lambda args, **kw: ids.append(args[0]))
    return ids


@pytest.fixture
def owners(acme, outsider):
    users = get_user_model().objects
    alice = users.create_user("alice", "alice@example.com", "pw")
    bob = users.create_user("bob", "bob@example.com", "pw")
    carol = users.create_user("carol", "carol@globex.example", "pw")
    Member.objects.create(organization=acme.org, user=alice, role=Member.Role.OWNER)
    Member.objects.create(organization=acme.org, user=bob, role=Member.Role.MEMBER)
    Member.objects.create(organization=outsider.org, user=carol, role=Member.Role.OWNER)
    return alice, bob, carol


@pytest.fixture
def inbox(settings):
    box = SmtpInbox().start()
    use_smtp(settings, box.port)
    settings.CAPGATE = {**settings.CAPGATE, "DASHBOARD_URL": "https://capgate.example.com/"}
    yield box
    box.stop()


def thresholds_of(window: Window) -> list[int]:
    return sorted(AlertEvent.objects.filter(window=window, kind="threshold").values_list("threshold", flat=True))


# --- creating events ------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_threshold_crossed_by_the_drain_gets_one_event_and_one_email(
    acme, queued, django_capture_on_commit_callbacks
):
    # given: a $1 blocking monthly cap with the default thresholds 50/80/100
    budget = acme.budget(amount="1")
    after_commit = lambda: django_capture_on_commit_callbacks(execute=True)  # noqa: E731
    # when: spend goes to $0.60, then $0.85, then past the cap by a provider's overbilling
    with after_commit():
        spend(acme, usd("0.60"))
    first = thresholds_of(window_of(budget))
    with after_commit():
        spend(acme, usd("0.25"))
    second = thresholds_of(window_of(budget))
    with after_commit():
        spend(acme, usd("0.40"), worst_nano=usd("0.10"))
    with after_commit():
        on_windows_changed(window_ids=[window_of(budget).id])  # nothing new to cross
    # then
    assert (first, second, thresholds_of(window_of(budget))) == ([50], [50, 80], [50, 80, 100])
    events = list(AlertEvent.objects.order_by("threshold"))
    assert queued == [e.id for e in events]
    assert [(e.spent_nano, e.amount_nano, e.status) for e in events] == [
        (usd("0.60"), usd("1"), "pending"),
        (usd("0.85"), usd("1"), "pending"),
        (usd("1.25"), usd("1"), "pending"),
    ]


@pytest.mark.django_db
def test_alert_budgets_alert_at_their_own_thresholds_and_nothing_before_spend(
    acme, queued, django_capture_on_commit_callbacks
):
    # given: an alert-only budget at 25% and 90%, and a $0 blocking budget with nothing spent
    alert = acme.budget(amount="1", mode="alert", thresholds=[25, 90, "junk"])
    zero = acme.budget(amount="0", scope="key", api_key=acme.add_key("idle"))
    acme.admit(worst_nano=0, key=acme.keys[-1], now=NOV)  # creates the $0 window
    # when
    with django_capture_on_commit_callbacks(execute=True):
        spend(acme, usd("0.30"))
        on_windows_changed(window_ids=[window_of(alert).id, window_of(zero).id])
    # then: 25% only; a budget nobody spent from has crossed nothing
    assert thresholds_of(window_of(alert)) == [25]
    assert thresholds_of(window_of(zero)) == []
    assert len(queued) == 1


@pytest.mark.django_db(transaction=True)
def test_racing_workers_create_one_event_per_threshold(acme, queued, monkeypatch):
    # given: a window at 90% and every racer past the shortcut read (as if all read at once)
    budget = acme.budget(amount="1", mode="alert")
    spend(acme, usd("0.90"))
    AlertEvent.objects.all().delete()
    del queued[:]
    monkeypatch.setattr(alerts, "_alerted", lambda ids: set())
    window_id = window_of(budget).id
    # when: 30 workers check the same window at once
    race(30, lambda i: on_windows_changed(window_ids=[window_id]))
    # then: the unique constraint let one insert per threshold win; only the winner of the
    # highest threshold crossed queued an email (50% was crossed with it: recorded, skipped)
    assert thresholds_of(window_of(budget)) == [50, 80]
    assert sorted(queued) == list(AlertEvent.objects.filter(status="pending").values_list("id", flat=True))
    assert AlertEvent.objects.get(threshold=50).status == "skipped"


@pytest.mark.django_db(transaction=True)
def test_without_the_unique_constraint_racing_workers_alert_twice(acme, queued, monkeypatch):
    # given: the guard removed
    budget = acme.budget(amount="1", mode="alert")
    spend(acme, usd("0.90"))
    AlertEvent.objects.all().delete()
    monkeypatch.setattr(alerts, "_alerted", lambda ids: set())
    window_id = window_of(budget).id
    with dropped_constraint(
        "usage_alertevent", "alert_event_unique_per_window_bucket", "UNIQUE (window_id, kind, threshold, bucket)"
    ):
        # when
        race(30, lambda i: on_windows_changed(window_ids=[window_id]))
        # then: the same threshold is alerted (and emailed) more than once
        count = AlertEvent.objects.filter(threshold=50).count()
    assert count > 1


@pytest.mark.django_db(transaction=True)
def test_a_broken_alert_never_breaks_the_drain(acme, queued, monkeypatch, caplog):
    # given: alert creation that blows up
    budget = acme.budget(amount="1")

    def broken(ids):
        raise RuntimeError("alert bug")

    monkeypatch.setattr(alerts, "_create_threshold_events", broken)
    # when
    with caplog.at_level(logging.ERROR, logger="alerts.alerts"):
        spend(acme, usd("0.70"))
    # then: the spend is applied all the same, and the failure is on the log
    assert window_of(budget).spent_nano == usd("0.70")
    assert not AlertEvent.objects.exists()
    assert "alert bug" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_the_event_waits_and_the_catch_up_sends_it(
    acme, owners, real_broker, settings, caplog, monkeypatch
):
    # given: Redis unreachable (a closed port), and an SMTP server
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # it would beat the app's setting
    monkeypatch.delenv("CELERY_BROKER_WRITE_URL", raising=False)
    box = SmtpInbox().start()
    use_smtp(settings, box.port)
    app = send_alert_email.app
    old_url = app.conf["broker_url"]
    app.conf["broker_url"] = f"redis://127.0.0.1:{free_port()}/0"
    try:
        budget = acme.budget(amount="1")
        # when: a drain crosses 50%
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="alerts.alerts"):
            spend(acme, usd("0.55"))
        elapsed = time.monotonic() - started
    finally:
        app.conf["broker_url"] = old_url
    # then: the drain finished, promptly; the event waits, and the failure is logged
    assert window_of(budget).spent_nano == usd("0.55")
    assert elapsed < 3, "queueing must fail fast, not hold the drain"
    event = AlertEvent.objects.get()
    assert (event.status, event.attempts) == ("pending", 0)
    assert "could not queue" in caplog.text
    assert box.messages == []
    # and when: the catch-up runs after the broker is back (here: directly, a minute later)
    assert send_pending(now=event.next_attempt_at) == 1
    try:
        assert len(box.wait_for(1)) == 1
    finally:
        box.stop()
    event.refresh_from_db()
    assert event.status == "sent"


@pytest.mark.django_db
def test_the_first_refusal_of_a_ceiling_is_alerted_once(acme, queued):
    # given: a $0.10 cap, full
    budget = acme.budget(amount="0.10")
    alert_only = acme.budget(amount="0.01", mode="alert")
    acme.admit(worst_nano=usd("0.08"), now=NOV)
    refusals = []
    for _ in range(3):
        with pytest.raises(BudgetExceeded) as refused:
            acme.admit(worst_nano=usd("0.05"), now=NOV)
        refusals.append(refused.value)
    # when: the gateway reports each 402
    for refusal in refusals:
        note_refusal(window_id=refusal.window_id)
    note_refusal(window_id=window_of(alert_only).id)  # an alert budget never refuses
    # then
    event = AlertEvent.objects.get()
    assert (event.kind, event.window_id, event.threshold) == ("refusal", window_of(budget).id, 0)
    assert (event.spent_nano, event.reserved_nano, event.amount_nano) == (
        0,
        usd("0.08"),
        usd("0.10"),
    )


@pytest.mark.django_db(transaction=True)
def test_racing_refusals_create_one_event(acme, queued):
    budget = acme.budget(amount="0.10")
    acme.admit(worst_nano=usd("0.10"))
    window_id = window_of(budget).id
    race(30, lambda i: note_refusal(window_id=window_id))
    assert AlertEvent.objects.filter(kind="refusal").count() == 1
    assert len(queued) == 1


# --- delivering events ----------------------------------------------------------------------


def _event(acme, *, amount="1", spent="0.60", **budget_kw) -> AlertEvent:
    budget = acme.budget(amount=amount, name=budget_kw.pop("name", "Org monthly cap"), **budget_kw)
    spend(acme, usd(spent))
    on_windows_changed(window_ids=[window_of(budget).id])
    return AlertEvent.objects.filter(budget=budget).order_by("threshold").first()


def _bodies(message: EmailMessage) -> tuple[str, str]:
    return message.get_body(("plain",)).get_content(), message.get_body(("html",)).get_content()


@pytest.mark.django_db
def test_the_email_says_which_budget_how_much_of_what_the_period_and_links_the_dashboard(acme, owners, inbox):
    # given: $0.60 spent of a $1 monthly blocking cap: the 50% event
    event = _event(acme)
    # when
    assert send_alert_email(event.id) == "sent"
    # then: one message, to the organization's owner only
    [message] = inbox.wait_for(1)
    assert inbox.envelopes[0][1] == ["alice@example.com"]
    assert message["Subject"] == "[capgate] Acme: Org monthly cap reached 50% ($0.60 of $1.00)"
    text, html = _bodies(message)
    assert "Spent:    $0.60 of $1.00 (60%)" in text
    assert "organization budget for organization Acme" in text
    assert "Period:   month: 2026-11-01 00:00 to 2026-12-01 00:00 (UTC)" in text
    assert "Mode:     block" in text
    link = f"https://capgate.example.com/o/acme/budgets/{event.budget_id}/"  # that budget, not the list
    assert f"See the budget on the dashboard: {link}" in text
    assert f'href="{link}"' in html and "$0.60 of $1.00" in html
    event.refresh_from_db()
    assert (event.status, event.attempts, event.recipients) == ("sent", 1, ["alice@example.com"])
    assert event.sent_at is not None and event.last_error == ""


@pytest.mark.django_db
def test_budget_recipients_replace_the_owners_and_name_the_key(acme, owners, inbox):
    # given: a lifetime cap on one key, with its own recipients
    key = acme.add_key("batch-jobs")
    budget = acme.budget(
        amount="0.02",
        scope="key",
        api_key=key,
        period="lifetime",
        recipients=["ops@acme.example", "finance@acme.example"],
    )
    spend(acme, usd("0.012"), key=key)
    on_windows_changed(window_ids=[window_of(budget).id])
    # when
    send_alert_email(AlertEvent.objects.get(budget=budget, threshold=50).id)
    # then
    [message] = inbox.wait_for(1)
    assert sorted(inbox.envelopes[0][1]) == ["finance@acme.example", "ops@acme.example"]
    assert message["Subject"] == "[capgate] Acme: key budget reached 50% ($0.012 of $0.02)"
    text, _ = _bodies(message)
    assert f"key budget for key batch-jobs ({key.prefix}" in text
    assert "Period:   lifetime" in text


@pytest.mark.django_db
def test_a_refusal_email_says_what_was_refused(acme, owners, inbox):
    budget = acme.budget(amount="0.10", name="Tight cap")
    acme.admit(worst_nano=usd("0.08"), now=NOV)
    with pytest.raises(BudgetExceeded) as refused:
        acme.admit(worst_nano=usd("0.05"), now=NOV)
    note_refusal(window_id=refused.value.window_id)
    send_alert_email(AlertEvent.objects.get(budget=budget).id)
    [message] = inbox.wait_for(1)
    assert message["Subject"] == "[capgate] Acme: Tight cap refused a request ($0.00 of $0.10 spent)"
    text, _ = _bodies(message)
    assert "Reserved: $0.08 held by requests in flight" in text


@pytest.mark.django_db
def test_sending_is_idempotent(acme, owners, inbox):
    event = _event(acme)
    assert send_alert_email(event.id) == "sent"
    assert send_alert_email(event.id) == "skipped"
    assert send_pending(now=datetime.now(UTC) + timedelta(days=1)) == 0
    time.sleep(0.3)
    assert len(inbox.messages) == 1


@pytest.mark.django_db
def test_smtp_down_records_the_failure_loses_nothing_and_a_later_send_succeeds(acme, owners, settings):
    # given: no SMTP server listening yet
    box = SmtpInbox()
    use_smtp(settings, box.port)
    event = _event(acme)
    # when: the task runs
    with pytest.raises(OSError):
        send_alert_email(event.id)
    # then: the failure is on the event, which waits for its retry
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("pending", 1)
    assert "Connection refused" in event.last_error or "ConnectionRefused" in event.last_error
    assert event.next_attempt_at > datetime.now(UTC)
    assert send_pending() == 0  # not due yet
    # and when: the server is back and the retry is due
    box.start()
    try:
        assert send_pending(now=event.next_attempt_at) == 1
        assert len(box.wait_for(1)) == 1
    finally:
        box.stop()
    event.refresh_from_db()
    assert (event.status, event.attempts, event.last_error) == ("sent", 2, "")


@pytest.mark.django_db
def test_the_task_retries_with_backoff_then_leaves_the_event_to_the_catch_up(acme, owners, settings):
    use_smtp(settings, free_port())  # nothing listens there
    event = _event(acme)
    assert send_alert_email.max_retries == 5
    assert send_alert_email.retry_backoff == alert_delivery.RETRY_BACKOFF
    # when: run as a worker would, retries included (eagerly: no countdown waits)
    result = send_alert_email.apply((event.id,))
    # then: 1 try + 5 retries, all recorded; still pending for the catch-up
    assert result.failed()
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("pending", 6)
    assert [alert_delivery.backoff(n).total_seconds() for n in (1, 2, 3, 8, 9)] == [30, 60, 120, 3600, 3600]


@pytest.mark.django_db
def test_after_the_last_attempt_the_event_is_failed_and_not_retried(acme, owners, settings):
    use_smtp(settings, free_port())
    event = _event(acme)
    AlertEvent.objects.filter(pk=event.pk).update(attempts=alert_delivery.MAX_ATTEMPTS - 1)
    assert send_alert_email(event.id) == "failed"  # not raised: a retry would not help
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("failed", alert_delivery.MAX_ATTEMPTS)
    assert send_pending(now=datetime.now(UTC) + timedelta(days=1)) == 0


@pytest.mark.django_db
def test_no_recipients_is_a_recorded_failure(acme, inbox):
    event = _event(acme)  # no owners, no budget recipients
    assert send_alert_email(event.id) == "failed"
    event.refresh_from_db()
    assert event.status == "failed" and "no recipients" in event.last_error


@pytest.mark.django_db
def test_a_claim_abandoned_by_a_dead_worker_is_taken_over_after_its_ttl(acme, owners, inbox):
    event = _event(acme)
    now = datetime.now(UTC)
    AlertEvent.objects.filter(pk=event.pk).update(status="sending", claimed_at=now, attempts=1)
    assert send_pending(now=now + timedelta(minutes=1)) == 0  # someone is still on it
    assert send_pending(now=now + alert_delivery.CLAIM_TTL + timedelta(seconds=1)) == 1
    assert len(inbox.wait_for(1)) == 1
