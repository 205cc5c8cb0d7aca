"""Real processes for the fault tests: gateway subprocesses on the test database (or a private
PostgreSQL cluster), a private Redis, and beat's renew_and_expire run in a loop.

Everything listens on 127.0.0.1 and is stopped by its own process id at teardown.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from django.db import connection, connections

import capcheck
from tests.gateway.conftest import gateway, upstream, wired  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_port() -> int:
    """A free port for a private PostgreSQL cluster or redis-server: from
    CAPGATE_TEST_PRIVATE_PORTS ("25450-25499") when set, so parallel test runs on one machine
    keep to their own ranges; else any free port."""
    span = os.environ.get("CAPGATE_TEST_PRIVATE_PORTS", "")
    if not span:
        return free_port()
    low, high = (int(p) for p in span.split("-"))
    for port in range(low, high + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in CAPGATE_TEST_PRIVATE_PORTS={span}")


def database_url(*, port: int | None = None, name: str | None = None) -> str:
    """The test database's URL (pytest-django has created and named it), or another database on
    another port with the same credentials."""
    db = connection.settings_dict
    return (
        f"postgres://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST'] or '127.0.0.1'}:"
        f"{port or db['PORT'] or 5432}/{quote(name or db['NAME'])}"
    )


def wait_until(predicate, *, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen, *, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class GatewayProcess:
    url: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


@contextmanager
def gateway_process(*, database: str, data_dir: Path, env: dict[str, str] | None = None) -> Iterator[GatewayProcess]:
    """uvicorn serving config.asgi with the production settings (a connection pool), as
    scripts/up.sh runs it, on its own port; stopped at the end unless it was killed."""
    port = free_port()
    log = data_dir / f"gateway-{port}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "DATABASE_URL": database,
        "CAPGATE_DATA_DIR": str(data_dir),
        "CAPGATE_DB_POOL_MIN": "1",
        "CAPGATE_DB_POOL_MAX": "8",
        "CAPGATE_LOG_LEVEL": "WARNING",
        # One admission per request, so a test can count requests in flight by their reservations;
        # tests of headroom slices under faults pass CAPGATE_SLICES=true.
        "CAPGATE_SLICES": "false",
        **(env or {}),
    }
    with open(log, "wb") as out:
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
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    handle = GatewayProcess(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited with {proc.returncode}:\n{handle.tail()}")
            try:
                return httpx.get(handle.url + "/v1/models", timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, interval=0.2, what="the gateway process to listen")
        yield handle
    finally:
        stop_process(proc)


class PrivatePostgres:
    """A throwaway cluster (scripts/pg-cluster.sh) that a test may stop and start: never the
    shared one on 15432."""

    def __init__(self) -> None:
        # Reachable by the postgres user (pytest's tmp_path is 0700 root's when run as root).
        self.dir = Path(tempfile.mkdtemp(prefix="capgate-pg-"))
        self.dir.chmod(0o755)
        self.port = private_port()
        self.url = database_url(port=self.port, name="capgate")

    def _script(self, *args: str) -> None:
        subprocess.run(["bash", str(ROOT / "scripts" / "pg-cluster.sh"), *args], check=True, timeout=120)

    def start(self) -> None:
        self._script("start", str(self.dir), str(self.port))

    def stop(self) -> None:
        self._script("stop", str(self.dir))

    def clone(self, data: Path) -> None:
        """Start from a copy of a stopped cluster's data directory (migrated once a session:
        initdb and migrate cost 10-20 s a test), on this cluster's own port and socket."""
        subprocess.run(["cp", "-a", str(data), str(self.dir / "data")], check=True, timeout=120)
        with open(self.dir / "data" / "postgresql.conf", "a") as conf:  # later lines win
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.dir / 'sock'}'\n")
        (self.dir / "sock").mkdir()
        if os.geteuid() == 0:  # the cluster runs as postgres (scripts/pg-cluster.sh)
            for path in (self.dir, self.dir / "sock"):
                shutil.chown(path, "postgres", "postgres")

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
            cwd=ROOT,
            check=True,
            timeout=180,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.base", "DATABASE_URL": self.url},
        )

    def destroy(self) -> None:
        self._script("destroy", str(self.dir))

    @contextmanager
    def as_default(self) -> Iterator[None]:
        """Point this thread's default connection at the private cluster (as DatabaseOutage in
        tests/gateway points it at a dead port), then back at the test database."""
        settings = connections.settings["default"]
        saved = settings["PORT"], settings["NAME"]
        connection.close()
        settings["PORT"], settings["NAME"] = self.port, "capgate"
        try:
            yield
        finally:
            connection.close()
            settings["PORT"], settings["NAME"] = saved


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = private_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        redis_server = shutil.which("redis-server")
        assert redis_server, "redis-server is not installed (bash scripts/services.sh start installs it)"
        self.proc = subprocess.Popen(
            [
                redis_server,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)

        def pong() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(pong, timeout=10, what="redis to answer")
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@dataclass
class Renewer:
    """Beat's renew_and_expire, every `interval`, in a thread with its own connection."""

    interval: float = 0.25
    results: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="renewer", daemon=True)

    def _run(self) -> None:
        from ledger.tasks import renew_and_expire

        try:
            while not self._halt.is_set():
                try:
                    self.results.append(renew_and_expire())
                except Exception as exc:  # reported by the test, never swallowed silently
                    self.errors.append(repr(exc))
                    connection.close()
                self._halt.wait(self.interval)
        finally:
            connection.close()

    def start(self) -> Renewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=30)

    @property
    def renewed(self) -> int:
        return sum(r["renewed"] for r in self.results)

    @property
    def expired(self) -> int:
        return sum(r["expired"] for r in self.results)


def fire_in_background(setup: capcheck.Setup, plan: capcheck.Plan, sent: list[capcheck.Sent]) -> threading.Thread:
    """capcheck's load generator in a thread (it runs its own event loop)."""
    thread = threading.Thread(target=capcheck.fire, args=(setup, plan, sent), name="load", daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="session")
def migrated_cluster() -> Iterator[Path]:
    """A private cluster initialised and migrated once, then stopped: its data directory."""
    pg = PrivatePostgres()
    try:
        pg.start()
        pg.migrate()
        pg.stop()
        yield pg.dir / "data"
    finally:
        pg.destroy()


@pytest.fixture
def private_postgres(migrated_cluster) -> Iterator[PrivatePostgres]:
    """A fresh, migrated cluster of the test's own: a copy of `migrated_cluster`."""
    pg = PrivatePostgres()
    try:
        pg.clone(migrated_cluster)
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path / "redis")
    r.start()
    try:
        yield r
    finally:
        r.stop()
