"""Outages of what the gateway depends on: the drain, PostgreSQL, Redis. In each, the cap holds
(the four properties, read from the database) and nothing is lost or counted twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

import capcheck
from alerts import alerts
from alerts.models import AlertEvent
from ledger.models import Budget, Reservation, UsageRecord, Window
from ledger.tasks import drain_usage
from tenants.models import Member
from tests.faults.conftest import (
    ROOT,
    database_url,
    fire_in_background,
    gateway_process,
    stop_process,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def wave(start: int, n: int, mode: str = "plain") -> list[capcheck.Sent]:
    return [capcheck.Sent(index=start + i, key="A", mode=mode) for i in range(n)]


def settled(org_id: int) -> bool:
    return not (
        Reservation.objects.filter(organization_id=org_id).exists()
        or UsageRecord.objects.filter(organization_id=org_id, applied=False).exists()
    )


# --- the drain ------------------------------------------------------------------------------


@pytest.fixture
def no_drain(settings):
    """A gateway whose own micro-batch drain never runs (requested before `gateway`), and no
    worker: records stay in the outbox until this test drains them."""
    settings.CAPGATE = {**settings.CAPGATE, "DRAIN_INTERVAL": 3600.0}


def test_with_the_drain_stopped_the_cap_holds_and_everything_settles_after(no_drain, gateway):
    # given: a $1 cap, $0.037 worst cases (27 fit on holds alone), no drain in the background
    plan = capcheck.Plan(url=gateway.url, delay_ms=0)
    setup = capcheck.create_run(plan=plan, scenario="basic", concurrency=0)
    org = setup.organization
    cap = 10**9
    sampler = capcheck.Sampler(org.id, 0.01)
    sampler.start()
    try:
        # when: traffic continues in three waves while the drain is down
        first, second, third = wave(0, 20), wave(20, 20), wave(40, 20)
        capcheck.fire(setup, plan, first)
        capcheck.fire(setup, plan, second)
        # then: at least what the holds leave room for is served; an admission about to refuse
        # applies the finished calls' records itself (ledger.admission.settle_finished), so more
        # may be; what is spent and held never passes the cap, and refusals are the cap's
        served = [s.status for s in first + second].count(200)
        assert served >= 27
        assert {s.code for s in first + second if s.status != 200} <= {"organization_budget"}
        window = Window.objects.get(budget__organization=org)
        assert window.spent_nano + window.reserved_nano <= cap
        # when: the worker comes back and drains
        drain_usage()
        window.refresh_from_db()
        assert (window.spent_nano, window.reserved_nano) == (served * setup.tokens.actual_nano, 0)
        # then: the room the holds kept comes back and is used
        capcheck.fire(setup, plan, third)
        assert [s.status for s in third].count(200) >= min(20, (cap - window.spent_nano) // setup.tokens.worst_nano)
        drain_usage()
    finally:
        peaks = sampler.stop()
    assert settled(org.id)
    report = capcheck.check_organization(organization_id=org.id, sent=first + second + third, peaks=peaks)
    assert report.ok, report.problems
    assert report.records == {"served": report.served}


# --- PostgreSQL -----------------------------------------------------------------------------


def test_postgres_stopped_mid_run_fails_closed_spools_and_lands_every_record_once(private_postgres, tmp_path):
    """On a private cluster: the shared one on 15432 serves other test runs."""
    pg = private_postgres
    data = tmp_path / "gw"
    env = {"CAPGATE_DB_POOL_TIMEOUT": "2"}  # fail closed in 2 s, not the default 10 s
    with gateway_process(database=pg.url, data_dir=data, env=env) as gw, pg.as_default():
        # given: six requests admitted whose answers take 4 s
        plan = capcheck.Plan(url=gw.url, delay_ms=4000, request_timeout=60)
        setup = capcheck.create_run(plan=plan, scenario="basic", concurrency=0)
        org_id = setup.organization.id
        in_flight, refused = wave(0, 6), wave(6, 3)
        load = fire_in_background(setup, plan, in_flight)
        wait_until(
            lambda: Reservation.objects.filter(organization_id=org_id).count() == 6, timeout=20, what="six admissions"
        )
        # when: PostgreSQL stops while they are with the provider
        connection.close()
        pg.stop()
        # then: new requests are refused before the provider call
        capcheck.fire(setup, plan, refused)
        assert [(s.status, s.code) for s in refused] == [(503, "budget_unavailable")] * 3, gw.tail()
        # and the answers finishing during the outage are served, their records spooled to disk
        load.join(timeout=60)
        assert [s.status for s in in_flight] == [200] * 6, gw.tail()
        spooled = [p for p in (data / "spool").glob("*.jsonl")]
        assert sum(len(p.read_text().splitlines()) for p in spooled) == 6
        backup = tmp_path / "spool-copy.jsonl"
        backup.write_text("".join(p.read_text() for p in spooled))
        # when: PostgreSQL is back, the gateway replays its spool and drains
        pg.start()
        wait_until(
            lambda: _settled_retrying(org_id), timeout=90, interval=0.25, what="the spool to land"
        )  # each gateway thread drops its dead connection on first use: slow on a loaded 2-core machine
        # then: every spooled record landed once, at its true cost
        records = UsageRecord.objects.filter(organization_id=org_id)
        assert sorted(r.request_id for r in records) == sorted(s.request_id for s in in_flight)
        assert {(r.status, r.cost_nano) for r in records} == {("served", setup.tokens.actual_nano)}
        window = Window.objects.get(budget__organization_id=org_id)
        assert (window.spent_nano, window.reserved_nano) == (6 * setup.tokens.actual_nano, 0)
        # the replayer removes its file once every record in it is in: the drain can settle them
        # between the last insert and the unlink
        wait_until(lambda: not list((data / "spool").glob("*.jsonl")), timeout=15, what="the replayed spool removed")
        # when: the same spool is replayed again (a replayer that died after inserting)
        shutil.copy(backup, data / "spool" / "spool-99999.jsonl")
        wait_until(lambda: not list((data / "spool").glob("*.jsonl")), timeout=15, what="the second replay")
        # then: nothing is counted twice
        assert records.count() == 6
        window.refresh_from_db()
        assert (window.spent_nano, window.reserved_nano) == (6 * setup.tokens.actual_nano, 0)
        report = capcheck.check_organization(organization_id=org_id, sent=in_flight + refused)
        assert report.ok, report.problems


def _settled_retrying(org_id: int) -> bool:
    try:
        return settled(org_id)
    except Exception:  # our own connection died with the server: reconnect next time
        connection.close()
        return False


# --- Redis ----------------------------------------------------------------------------------


def test_with_redis_stopped_the_gateway_admits_and_records_and_alerts_resume_after(
    gateway, private_redis, tmp_path, monkeypatch, caplog
):
    """A private Redis (others use the shared one) behind a real worker with embedded beat,
    on a one-second schedule (tests/faults/fast_celery.py)."""
    from config.celery import app

    # given: this process (the gateway's drain queues alert emails) and a worker on that Redis
    monkeypatch.setitem(app.conf, "broker_url", private_redis.url)
    monkeypatch.setattr(alerts, "CATCHUP_AFTER", timedelta(seconds=1))  # catch-up may send at once
    plan = capcheck.Plan(url=gateway.url, delay_ms=0)
    setup = capcheck.create_run(plan=plan, scenario="basic", concurrency=0)
    org = setup.organization
    Budget.objects.filter(organization=org).update(thresholds=[10, 30, 50])
    owner = get_user_model().objects.create_user("olivia", "olivia@example.com", "pw")
    Member.objects.create(organization=org, user=owner, role=Member.Role.OWNER)
    worker = _worker(private_redis.url, tmp_path)
    try:
        first = wave(0, 10)  # $0.12: crosses 10%
        capcheck.fire(setup, plan, first)
        wait_until(
            lambda: AlertEvent.objects.filter(status="sent").count() == 1,
            timeout=60,
            interval=0.2,
            what=f"the worker to send the 10% email; worker log:\n{_tail(tmp_path)}",
        )
        # when: Redis goes away
        private_redis.stop()
        second = wave(10, 20)  # $0.36 in all: crosses 30%
        capcheck.fire(setup, plan, second)
        # then: the gateway keeps admitting and recording, and its drain is unaffected
        assert [s.status for s in second] == [200] * 20
        wait_until(lambda: settled(org.id), timeout=15, what="the drain")
        # (the drain checks thresholds just after its commit, and queues the email after that)
        event = wait_until(lambda: AlertEvent.objects.filter(threshold=30).first(), timeout=10, what="the 30% event")
        wait_until(
            lambda: f"could not queue the email of event {event.id}" in caplog.text,
            timeout=10,
            what="the failed queueing to be logged",
        )
        event.refresh_from_db()
        assert (event.status, event.attempts) == ("pending", 0)
        time.sleep(2)  # a few of beat's one-second ticks fail too
        # when: Redis is back on the same port
        private_redis.start()
        # then: beat's catch-up runs on the worker again and the waiting email goes out
        wait_until(
            lambda: AlertEvent.objects.filter(threshold=30, status="sent").exists(),
            timeout=90,
            interval=0.25,
            what=f"the catch-up to send the 30% email; worker log:\n{_tail(tmp_path)}",
        )
    finally:
        stop_process(worker)
    event.refresh_from_db()
    assert event.recipients == ["olivia@example.com"] and event.attempts == 1
    report = capcheck.check_organization(organization_id=org.id, sent=first + second)
    assert report.ok, report.problems
    assert report.served == 30


def _worker(redis_url: str, tmp_path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": redis_url,
        "CAPGATE_DATA_DIR": str(tmp_path / "worker-data"),
        "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
    }
    with open(tmp_path / "worker.log", "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.faults.fast_celery",
                "worker",
                "-B",
                "-s",
                str(tmp_path / "beat-schedule"),
                "--pool=solo",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _tail(tmp_path) -> str:
    log = tmp_path / "worker.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""
