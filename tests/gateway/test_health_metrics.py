"""GET /healthz, /readyz and /metrics (issue 10, section 1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from config import health
from ledger.models import Reservation
from tests.faults.conftest import ROOT, database_url, free_port, stop_process, wait_until
from tests.gateway.conftest import KEY

CHAT = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in an exposition, 0 if absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_healthz_and_readyz_answer_without_auth(gateway):
    # when
    live = httpx.get(gateway.url + "/healthz")
    ready = httpx.get(gateway.url + "/readyz")
    # then
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "migrations": "ok", "spool": "ok"}}


def test_readyz_names_the_failing_check_and_no_path(gateway, settings, tmp_path):
    # given: the data dir is a file, so the spool directory cannot be created or written
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": blocker}
    # when
    resp = httpx.get(gateway.url + "/readyz")
    # then
    assert resp.status_code == 503
    body = resp.json()
    assert body["failing"] == ["spool"]
    assert body["checks"] == {"database": "ok", "migrations": "ok", "spool": "failing: not writable"}
    assert str(tmp_path) not in resp.text


def test_readyz_reports_unapplied_migrations(db, monkeypatch):
    # given: the schema is one migration behind the code
    from django.db.migrations.executor import MigrationExecutor

    monkeypatch.setattr(health, "_migrations_ok", False)
    monkeypatch.setattr(MigrationExecutor, "migration_plan", lambda self, targets: [("usage", "0099_x")])
    # when
    status, body = health.readiness()
    # then
    assert status == 503 and body["checks"]["migrations"] == "failing: 1 unapplied"


def test_metrics_count_requests_by_endpoint_status_and_refusal_code(gateway, wired):
    # given: a $0.001 blocking cap, which one echo call's worst case exceeds
    wired.budget(amount="0.001")
    before = httpx.get(gateway.url + "/metrics").text
    # when
    refused = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    unauthorized = httpx.get(gateway.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    after = httpx.get(gateway.url + "/metrics")
    # then
    assert refused.status_code == 402 and unauthorized.status_code == 401
    assert after.headers["content-type"].startswith("text/plain")
    delta = {
        labels: sample(after.text, "capgate_requests_total", **dict(labels))
        - sample(before, "capgate_requests_total", **dict(labels))
        for labels in [
            (("endpoint", "chat_completions"), ("status", "402"), ("code", "organization_budget")),
            (("endpoint", "models"), ("status", "401"), ("code", "")),
        ]
    }
    assert list(delta.values()) == [1.0, 1.0]
    assert sample(after.text, "capgate_admission_latency_seconds_count") >= 1
    for name in ("capgate_outbox_depth", "capgate_drain_lag_seconds", "capgate_spool_depth", "capgate_state_up"):
        assert re.search(rf"^{name} ", after.text, re.M), name
    # bounded labels: no request id, key or customer ever appears
    assert "req_" not in after.text and KEY not in after.text


def test_metrics_report_live_reservations_and_upstream_calls(gateway, wired, upstream):
    # given: a held reservation (the reservation API) and one call to the fake OpenAI upstream
    created = httpx.post(
        gateway.url + "/v1/reservations",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "echo-1", "amount_usd": "0.25"},
    )
    served = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={**CHAT, "model": "gpt-test"},
    )
    wait_until(lambda: Reservation.objects.count() == 1, timeout=10, what="the served call to settle")
    # when
    text = httpx.get(gateway.url + "/metrics").text
    # then
    assert created.status_code in (200, 201), created.text
    assert served.status_code == 200, served.text
    assert sample(text, "capgate_live_reservations", organization="acme") == 1
    assert sample(text, "capgate_reserved_usd", organization="acme") > 0
    assert sample(text, "capgate_upstream_latency_seconds_count", connection=str(wired.openai.id)) >= 1


def test_metrics_say_which_periodic_task_has_stopped_running(gateway):
    """Beat's tasks (ledger/periodic.py): one ran a second ago, one last ran 10 minutes ago on a
    15 s schedule (beat or the workers stopped), one beat registered a minute ago that never ran."""
    from datetime import timedelta

    from django.utils import timezone

    from ledger.periodic import record_success, register_schedule

    # given
    now = timezone.now()
    record_success(task="ledger.tasks.drain_usage", interval_seconds=5.0, now=now - timedelta(seconds=1))
    record_success(task="ledger.tasks.renew_and_expire", interval_seconds=15.0, now=now - timedelta(minutes=10))
    register_schedule(intervals={"alerts.tasks.audit_counters": 300.0}, now=now - timedelta(minutes=1))
    # when
    text = httpx.get(gateway.url + "/metrics").text
    # then
    stale = {
        task: sample(text, "capgate_beat_task_stale", task=task)
        for task in ("ledger.tasks.drain_usage", "ledger.tasks.renew_and_expire", "alerts.tasks.audit_counters")
    }
    assert stale == {
        "ledger.tasks.drain_usage": 0.0,
        "ledger.tasks.renew_and_expire": 1.0,
        "alerts.tasks.audit_counters": 0.0,
    }
    assert 600 <= sample(text, "capgate_beat_task_age_seconds", task="ledger.tasks.renew_and_expire") < 660
    assert sample(text, "capgate_beat_task_interval_seconds", task="ledger.tasks.renew_and_expire") == 15.0


def test_metrics_bearer_token(gateway, settings):
    # given
    settings.CAPGATE = {**settings.CAPGATE, "METRICS_TOKEN": "s3cret-token"}
    # when
    anonymous = httpx.get(gateway.url + "/metrics")
    wrong = httpx.get(gateway.url + "/metrics", headers={"Authorization": "Bearer nope"})
    right = httpx.get(gateway.url + "/metrics", headers={"Authorization": "Bearer s3cret-token"})
    # then
    assert anonymous.status_code == 401 and wrong.status_code == 401
    assert right.status_code == 200 and "capgate_state_up" in right.text


def _own_counts(multiproc_dir: Path, tmp: Path) -> dict[str, float]:
    """Each worker's own count of 401s on /v1/models, read from its own file alone: what a
    scrape would report if it did not add the workers up."""
    counts = {}
    for path in multiproc_dir.glob("counter_*.db"):
        alone = tmp / path.stem
        alone.mkdir(parents=True)
        shutil.copy(path, alone / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        counts[path.stem] = sum(
            s.value
            for m in registry.collect()
            for s in m.samples
            if s.name == "capgate_requests_total" and s.labels.get("endpoint") == "models"
        )
    return counts


@pytest.mark.django_db(transaction=True)
def test_metrics_from_two_uvicorn_workers_count_both(tmp_path):
    # given: uvicorn with two workers on the test database, sharing one multiprocess directory
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": database_url(),
        "CAPGATE_DATA_DIR": str(tmp_path / "data"),
        "CAPGATE_DB_POOL_MIN": "1",
        "CAPGATE_DB_POOL_MAX": "6",
        "CAPGATE_LOG_LEVEL": "WARNING",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }
    log = open(tmp_path / "uvicorn.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "uvicorn.log").read_text()
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, interval=0.2, what="uvicorn to listen")

        def unauthorized(_: int) -> int:  # a new connection each: the kernel picks the worker
            return httpx.get(
                url + "/v1/models", headers={"Authorization": "Bearer nope", "Connection": "close"}, timeout=10
            ).status_code

        # when: 401s in concurrent bursts until both workers have answered some (at most 400)
        sent = 0
        with ThreadPoolExecutor(16) as pool:
            while sent < 400:
                assert set(pool.map(unauthorized, range(40))) == {401}
                sent += 40
                if sum(1 for n in _own_counts(multiproc, tmp_path / f"probe{sent}").values() if n > 0) >= 2:
                    break
        scrapes = [httpx.get(url + "/metrics", headers={"Connection": "close"}, timeout=10).text for _ in range(6)]
        own = _own_counts(multiproc, tmp_path / "final")
    finally:
        stop_process(proc)
        log.close()
    # then: two workers each counted some, and every scrape (whichever worker answered) sees all
    workers = [n for n in own.values() if n > 0]
    assert len(workers) >= 2, own
    assert sum(workers) == sent
    for text in scrapes:
        assert sample(text, "capgate_requests_total", endpoint="models", status="401") == sent
    # and the check fails without the multiprocess sum: each worker alone reports fewer
    assert all(n < sent for n in workers)


def test_every_fixed_gateway_path_has_its_own_metrics_label():
    """A refusal on an endpoint counts under that endpoint, not `other` (labels are a fixed set)."""
    from gateway.http.metrics import endpoint_label
    from gateway.http.routes import ROUTES

    fixed = {r.path for r in ROUTES if "{" not in r.path}
    assert {p: endpoint_label(p) for p in fixed if endpoint_label(p) == "other"} == {}
    assert endpoint_label("/v1/responses/resp_1/cancel") == "other"  # an id never becomes a label
