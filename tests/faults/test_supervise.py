"""scripts/supervise.sh, which scripts/up.sh runs every long-running process under: a process
that exits is started again with backoff, and TERM stops the supervisor and its process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.conftest import ROOT, stop_process, wait_until

SUPERVISE = ROOT / "scripts" / "supervise.sh"


def children(pid: int) -> list[int]:
    """The supervisor's live processes (its children, from /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def supervise(name: str, *command: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["bash", str(SUPERVISE), name, *command],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_process_that_exits_is_started_again_with_growing_waits(tmp_path):
    # given: a process that exits at once, every time
    runs = tmp_path / "runs"
    sup = supervise("quick", "sh", "-c", f"date +%s.%N >> {runs}; exit 3", log=tmp_path / "log")
    try:
        # when: it has been started four times
        wait_until(lambda: runs.exists() and len(runs.read_text().split()) >= 4, timeout=20, what="four runs")
    finally:
        stop_process(sup)
    # then: each restart waited longer (1 s, 2 s, 4 s): a crash loop does not spin
    starts = [float(t) for t in runs.read_text().split()][:4]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert [round(g) for g in gaps] == [1, 2, 4], gaps
    assert "exited with status 3" in (tmp_path / "log").read_text()
    assert sup.returncode == 0


def test_term_stops_the_supervisor_and_kills_a_process_that_ignores_it(tmp_path):
    # given: a process that ignores TERM, under a supervisor that gives it 1 s to stop
    sup = supervise(
        "stubborn",
        "sh",
        "-c",
        "trap '' TERM; while :; do sleep 0.1; done",
        log=tmp_path / "log",
        env={"CAPGATE_SUPERVISE_STOP_SECONDS": "1"},
    )
    try:
        child = wait_until(lambda: children(sup.pid), timeout=10, what="the process to start")[0]
        time.sleep(0.5)
        # when: the supervisor is told to stop
        sup.send_signal(signal.SIGTERM)
        sup.wait(10)
    finally:
        stop_process(sup)
    # then: it is gone, and so is its process (killed after its stop time), not restarted
    assert sup.returncode == 0
    wait_until(lambda: not alive(child), timeout=5, what="the process to be killed")
    assert "killing pid" in (tmp_path / "log").read_text()


@pytest.mark.django_db(transaction=True)
def test_a_killed_celery_worker_is_restarted_and_works_again(private_redis, tmp_path, monkeypatch):
    """The real worker, as scripts/up.sh runs it (prefork), killed with SIGKILL."""
    from config.celery import app
    from tests.faults.conftest import database_url

    monkeypatch.setitem(app.conf, "broker_url", private_redis.url)
    env = {
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": private_redis.url,
        "CAPGATE_DATA_DIR": str(tmp_path / "worker-data"),
    }
    command = ["celery", "-A", "config", "worker", "--loglevel", "info", "--concurrency", "1"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"h-{os.getpid()}@%h"]
    sup = supervise("worker", str(ROOT / ".venv" / "bin" / "celery"), *command[1:], log=tmp_path / "log", env=env)
    try:
        first = wait_until(lambda: started(tmp_path / "log"), timeout=20, what="the worker to start")[0]
        wait_until(lambda: _pong(app), timeout=60, interval=0.5, what="the worker to answer")
        # when: the worker is killed outright
        os.kill(first, signal.SIGKILL)
        # then: another one is started in its place, and it answers
        second = wait_until(lambda: started(tmp_path / "log")[1:], timeout=20, what="a new worker")[0]
        wait_until(lambda: _pong(app), timeout=60, interval=0.5, what="the new worker to answer")
        assert alive(second) and second in children(sup.pid)
    finally:
        stop_process(sup, timeout=20)
    log = (tmp_path / "log").read_text()
    assert "exited with status 137" in log and "stopped" in log


def started(log: Path) -> list[int]:
    """The pids the supervisor has started, in order (from its log)."""
    return [int(m) for m in re.findall(r"started pid (\d+)", log.read_text())] if log.exists() else []


def _pong(app) -> bool:
    return bool(app.control.ping(timeout=1))
