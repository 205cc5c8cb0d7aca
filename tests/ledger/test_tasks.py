"""Celery tasks and beat: each periodic task does its one job, and is safe when two runs
overlap. Task functions are called directly (no worker) except in the last test, which runs a
real worker with embedded beat against the real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from alerts.models import AlertEvent
from alerts.tasks import audit_counters, send_pending_alerts
from config.celery import app
from core.env import BASE_DIR
from ledger import drain as drain_module
from ledger import recording
from ledger.models import GatewayInstance, Reservation, UsageRecord
from ledger.recording import Outcome, record
from ledger.tasks import drain_usage, renew_and_expire, replay_spool
from tenants.models import Member
from tests.alerts.test_alerts import SmtpInbox, dropped_constraint
from tests.concurrency import race
from tests.conftest import usd, window_of

WORST = usd("0.037")


@pytest.fixture(autouse=True)
def no_published_emails(monkeypatch):
    """Alert emails are captured, not published to the shared Redis (see test_alerts)."""
    from alerts.tasks import send_alert_email

    monkeypatch.setattr(send_alert_email, "apply_async", lambda args, **kw: None)


def test_every_beat_entry_names_a_registered_task_and_expires_with_its_interval():
    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule
    assert {e["task"]: e["schedule"] for e in schedule.values()} == {
        "ledger.tasks.renew_and_expire": 15.0,
        "ledger.tasks.drain_usage": 5.0,
        "ledger.tasks.replay_spool": 10.0,
        "alerts.tasks.send_pending_alerts": 60.0,
        "alerts.tasks.audit_counters": 300.0,
        "requestlog.tasks.purge_request_log": 3600.0,
        "jobs.tasks.poll_jobs": 5.0,
        "gateway.tasks.prune_gateway_history": 3600.0,
        "alerts.tasks.prune_alert_history": 3600.0,
        "ledger.tasks.prune_ledger_history": 3600.0,
        "tenants.tasks.prune_audit_history": 3600.0,
    }
    for entry in schedule.values():
        assert entry["task"] in app.tasks
        assert entry["options"]["expires"] == entry["schedule"]


# --- renew_and_expire -----------------------------------------------------------------------


@pytest.mark.django_db
def test_renew_and_expire_keeps_live_owners_and_charges_the_dead_at_worst_case(acme):
    # given: two gateway processes, one heartbeating, one silent for an hour; each owns a
    # reservation whose lease lapsed 80 s ago; and a live one's request past its hard deadline
    budget = acme.budget(amount="1", period="lifetime")  # one window, whatever the hour
    now = timezone.now()
    alive = GatewayInstance.objects.create(name="alive", heartbeat_at=now)
    dead = GatewayInstance.objects.create(name="dead", heartbeat_at=now - timedelta(hours=1))
    lapsed = now - timedelta(seconds=200)  # admitted then: lease (120 s) ran out 80 s ago
    mine = acme.admit(worst_nano=WORST, now=lapsed, owner_id=alive.id).reservation
    theirs = acme.admit(worst_nano=WORST, now=lapsed, owner_id=dead.id).reservation
    too_old = acme.admit(worst_nano=WORST, now=now - timedelta(hours=3), owner_id=alive.id).reservation
    # when
    result = renew_and_expire()
    # then: the live owner's lease runs again; the other two are charged at worst case
    assert result == {"renewed": 1, "expired": 2}
    assert Reservation.objects.get(pk=mine.pk).expires_at > now
    charged = UsageRecord.objects.filter(request_id__in=[theirs.request_id, too_old.request_id])
    assert {(r.status, r.cost_nano, r.applied) for r in charged} == {("estimated", WORST, True)}
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (2 * WORST, WORST)
    assert list(Reservation.objects.values_list("pk", flat=True)) == [mine.pk]


def _lapsed_reservations(acme, n: int) -> list[Reservation]:
    # Admitted now with a lease that lapses at once (not an hour ago: that could be last month).
    return [acme.admit(worst_nano=WORST, lease=timedelta(microseconds=1)).reservation for _ in range(n)]


def _widen_expiry_race(monkeypatch):
    # Every racer reads the lapsed reservations and finds no record for them before anyone
    # inserts one, and every drain reads its holds before anyone applies them: the
    # interleaving a missing guard would need, every time.
    real_build = recording.build_record

    def slow_build(**kw):
        time.sleep(0.03)
        return real_build(**kw)

    monkeypatch.setattr(recording, "build_record", slow_build)
    monkeypatch.setattr(drain_module, "RACE_DELAY_SECONDS", 0.1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_expiry_charges_each_lapsed_reservation_once(acme, monkeypatch):
    # given: 10 lapsed reservations and one live one under a $1 cap
    budget = acme.budget(amount="1")
    lapsed = _lapsed_reservations(acme, 10)
    live = acme.admit(worst_nano=WORST).reservation
    _widen_expiry_race(monkeypatch)
    # when: 20 beat runs overlap
    race(20, lambda i: renew_and_expire())
    # then: one estimated record each, charged once; the live one is untouched
    records = UsageRecord.objects.filter(request_id__in=[r.request_id for r in lapsed])
    assert records.count() == 10 and not records.exclude(status="estimated", applied=True).exists()
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (10 * WORST, WORST)
    assert list(Reservation.objects.values_list("pk", flat=True)) == [live.pk]


def _unclaimed(condition, *, limit):
    # The claim removed: every expiry run reads every lapsed reservation, locking nothing.
    return list(Reservation.objects.filter(condition).order_by("expires_at")[:limit])


@pytest.mark.django_db(transaction=True)
def test_without_the_claim_the_unique_request_id_still_charges_once(acme, monkeypatch):
    # given: the first guard removed (SKIP LOCKED claim); the backstop (unique request id) stays
    budget = acme.budget(amount="1")
    _lapsed_reservations(acme, 10)
    _widen_expiry_race(monkeypatch)
    monkeypatch.setattr(recording, "claim_lapsed", _unclaimed)
    # when
    race(20, lambda i: renew_and_expire())
    # then
    assert UsageRecord.objects.count() == 10
    assert window_of(budget).spent_nano == 10 * WORST


@pytest.mark.django_db(transaction=True)
def test_without_both_guards_concurrent_expiry_double_charges(acme, monkeypatch):
    # given: both guards removed — the SKIP LOCKED claim, and the unique request id that makes
    # the expiry insert ON CONFLICT DO NOTHING (an alert budget: zero holds, so no counter goes
    # negative first)
    budget = acme.budget(amount="100", mode="alert")
    _lapsed_reservations(acme, 10)
    _widen_expiry_race(monkeypatch)
    monkeypatch.setattr(recording, "claim_lapsed", _unclaimed)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'usage_usagerecord'::regclass "
            "AND pg_get_constraintdef(oid) = 'UNIQUE (request_id)'"
        )
        [(name,)] = cursor.fetchall()
    with dropped_constraint("usage_usagerecord", name, "UNIQUE (request_id)"):
        # when
        race(20, lambda i: renew_and_expire())
        # then: lapsed reservations are charged more than once in the book of record. (The window
        # counter may or may not count a duplicate twice: the one-statement drain charges a
        # record through its reservation's holds, and a duplicate drained after the first one
        # deleted them charges no window — that depends on the interleaving, so only the records,
        # which are what the customer is billed from, are asserted.)
        charged = UsageRecord.objects.aggregate(n=Count("id"), total=Sum("cost_nano"))
    assert budget.mode == "alert"
    assert charged["n"] > 10
    assert charged["total"] > 10 * WORST


# --- drain_usage, replay_spool, the alert catch-up, the audit -------------------------------


@pytest.mark.django_db(transaction=True)
def test_overlapping_drain_runs_apply_each_record_once(acme):
    budget = acme.budget(amount="100")
    for _ in range(200):
        r = acme.admit(worst_nano=WORST)
        record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.012")))
    applied = race(4, lambda i: drain_usage())
    assert sum(applied) == 200
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (200 * usd("0.012"), 0)
    assert drain_usage() == 0


def test_replay_spool_moves_spooled_records_into_the_outbox(acme, settings, tmp_path):
    from ledger import spool

    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": tmp_path}
    budget = acme.budget(amount="1")
    reservation = acme.admit(worst_nano=WORST).reservation
    spool.append(reservation=reservation, outcome=Outcome(status="served", cost_nano=usd("0.012")))
    assert replay_spool() == 1
    assert drain_usage() == 1
    assert window_of(budget).spent_nano == usd("0.012")
    assert replay_spool() == 0  # the spool is empty; nothing counted twice


@pytest.mark.django_db
def test_send_pending_alerts_and_audit_counters_call_their_services(acme, monkeypatch):
    from alerts import alert_delivery

    monkeypatch.setattr(alert_delivery, "send_pending", lambda: 2)
    assert send_pending_alerts() == 2
    acme.budget(amount="1")
    acme.admit(worst_nano=WORST)
    assert audit_counters() == {"windows_checked": 1, "drifts": 0}


# --- a real worker ---------------------------------------------------------------------------


def _database_url() -> str:
    db = connection.settings_dict
    return (
        f"postgres://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{quote(db['NAME'])}"
    )


def _forget_queue(redis_url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    client.close()


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_with_beat_drains_alerts_and_emails(acme, tmp_path):
    # given: $0.60 of usage on a $1 cap left unapplied (as by a gateway that died), an owner,
    # an SMTP server, and a worker with embedded beat on its own queue of the real Redis
    from django.contrib.auth import get_user_model

    budget = acme.budget(amount="1", name="Org cap")
    r = acme.admit(worst_nano=usd("0.60"))
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.60")))
    owner = get_user_model().objects.create_user("olivia", "olivia@acme.example", "pw")
    Member.objects.create(organization=acme.org, user=owner, role=Member.Role.OWNER)
    inbox = SmtpInbox().start()
    queue = f"capgate-test-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": os.environ.get("REDIS_URL", settings.REDIS_URL),
        "CAPGATE_CELERY_QUEUE": queue,
        "CAPGATE_DATA_DIR": str(tmp_path / "data"),  # never the developer's spool
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(inbox.port),
    }
    env.pop("CELERY_BROKER_URL", None)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-B",
                "-s",
                str(tmp_path / "beat"),
                "--pool=solo",
                "-Q",
                queue,
                "-n",
                f"{queue}@localhost",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # when: beat's drain_usage runs (every 5 s), the drain crosses 50%, the alert task runs
        messages = inbox.wait_for(1, timeout=120)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        inbox.stop()
        _forget_queue(env["REDIS_URL"], queue)
    # then
    assert len(messages) == 1, log.read_text()[-4000:]
    assert messages[0]["Subject"] == "[capgate] Acme: Org cap reached 50% ($0.60 of $1.00)"
    assert UsageRecord.objects.get().applied
    assert window_of(budget).spent_nano == usd("0.60")
    event = AlertEvent.objects.get()
    assert (event.status, event.recipients) == ("sent", ["olivia@acme.example"])
    assert UsageRecord.objects.aggregate(s=Sum("cost_nano"))["s"] == usd("0.60")


@pytest.mark.django_db
def test_manage_py_drain_settles_the_outbox_and_optionally_lapsed_leases(acme):
    from io import StringIO

    from django.core.management import call_command

    budget = acme.budget(amount="1", period="lifetime")
    r = acme.admit(worst_nano=WORST)
    record(reservation=r.reservation, outcome=Outcome(status="served", cost_nano=usd("0.01")))
    acme.admit(worst_nano=WORST, lease=timedelta(microseconds=1))
    out = StringIO()
    call_command("drain", "--expire", stdout=out)
    assert out.getvalue().strip() == "1 lapsed reservations charged at worst case, 1 other records applied"
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (usd("0.01") + WORST, 0)
