"""A Redis outage while the worker holds a webhook retry: the worker outlives it and the retry
is delivered (core/celery_consumer.py). A real worker with embedded beat on a one-second
schedule (tests/faults/fast_celery.py), a private Redis, and a real local HTTP receiver."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.utils import timezone

from alerts.alert_models import AlertDelivery
from alerts.alerts import on_windows_changed
from ledger.models import PeriodicRun
from tests.alerts.test_alert_channels import Receiver, _webhook
from tests.alerts.test_alerts import spend
from tests.conftest import usd, window_of
from tests.faults.conftest import ROOT, database_url, stop_process, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_holding_a_webhook_retry_outlives_a_redis_outage_and_delivers_it(
    acme, private_redis, tmp_path, monkeypatch
):
    from config.celery import app

    # given: a webhook whose receiver answers the first POST with a 500, and a worker on a
    # private Redis that this process publishes to
    monkeypatch.setitem(app.conf, "broker_url", private_redis.url)
    receiver = Receiver([500])
    worker = worker_process(private_redis.url, tmp_path)
    try:
        _webhook(acme, receiver.url)
        budget = acme.budget(amount="1", name="Org cap")
        spend(acme, usd("0.60"))
        on_windows_changed(window_ids=[window_of(budget).id])  # queues the delivery's task
        delivery = AlertDelivery.objects.get()
        # when: the first attempt fails and the worker holds the task's retry (a 30 s countdown)
        wait_until(
            lambda: _log(tmp_path).count("alerts.tasks.send_alert_webhook[") >= 2 and "Retry in" in _log(tmp_path),
            timeout=60,
            interval=0.2,
            what=f"the webhook's retry to reach the worker; worker log:\n{_log(tmp_path)[-3000:]}",
        )
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts, delivery.response_status) == ("pending", 1, 500)
        # and Redis is down for 20 s
        private_redis.stop()
        time.sleep(20)
        # then: the worker is still there
        assert worker.poll() is None, f"the worker exited during the outage:\n{_log(tmp_path)[-4000:]}"
        private_redis.start()
        back = timezone.now()
        # and once the retry is due it is delivered, by the worker that lived through the outage
        wait_until(
            lambda: AlertDelivery.objects.filter(id=delivery.id, status="sent").exists(),
            timeout=60,
            interval=0.25,
            what=f"the retry to be delivered; worker log:\n{_log(tmp_path)[-4000:]}",
        )
        assert worker.poll() is None
    finally:
        stop_process(worker)
        receiver.stop()
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_status) == (2, 200)
    assert len(receiver.received) == 2
    assert all(headers["x-capgate-delivery"] == str(delivery.id) for headers, _ in receiver.received)
    assert "Unrecoverable error" not in _log(tmp_path)
    # and the worker's periodic runs were recorded (the beat staleness signal's source): beat
    # registered every task of its schedule, and the catch-up's success since Redis came back
    runs = {run.task: run for run in PeriodicRun.objects.all()}
    assert set(runs) == {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert runs["alerts.tasks.send_pending_alerts"].last_success_at > back
    assert runs["alerts.tasks.send_pending_alerts"].interval_seconds == 1.0


def worker_process(redis_url: str, tmp_path: Path) -> subprocess.Popen:
    """A worker with embedded beat, as the other Redis outage test runs it (without gossip,
    mingle and heartbeat, which would talk to other test runs' workers)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": redis_url,
        "CAPGATE_DATA_DIR": str(tmp_path / "worker-data"),
        "CAPGATE_UPSTREAM_ALLOWED_NETWORKS": "127.0.0.0/8",  # the receiver is on this machine
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


def _log(tmp_path: Path) -> str:
    log = tmp_path / "worker.log"
    return log.read_text(errors="replace") if log.exists() else ""
