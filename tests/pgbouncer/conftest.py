"""Money tests through PgBouncer in transaction mode (scripts/services.sh starts it in front of
the cluster): the test's connections, every racing thread's and the live gateway's go through
the pooler with the settings config/settings/pooling.py gives it; the slices' LISTEN connects
directly, as CAPGATE_LISTEN_DATABASE_URL makes it in a deployment."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connections

from config.settings import pooling
from gateway.upstream import runtime
from tests.gateway.conftest import gateway, upstream, wired  # noqa: F401  (fixtures)

PGBOUNCER_URL = os.environ.get("CAPGATE_PGBOUNCER_URL", "postgres://capgate:capgate@127.0.0.1:16432/capgate")


def _address() -> tuple[str, int]:
    url = urlsplit(PGBOUNCER_URL)
    return url.hostname or "127.0.0.1", url.port or 16432


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def pgbouncer(transactional_db, settings):
    """This process's database connections go through PgBouncer until the test ends."""
    host, port = _address()
    assert _reachable(host, port), f"PgBouncer is not listening on {host}:{port}: run scripts/services.sh start"
    # The one settings dict every connection of the alias is made from (Django's test setup
    # already named the test database in it), changed in place so that each thread's next
    # connection, the live gateway's database threads' included, is made through the pooler.
    default = connections.settings["default"]
    direct = dict(default)
    connections.close_all()
    default.clear()
    default.update(pooling.for_transaction_pooler({**direct, "HOST": host, "PORT": port}))
    settings.CAPGATE = {**settings.CAPGATE, "LISTEN_DATABASE": direct}
    console = Console(default["NAME"], host, port)
    try:
        yield console
    finally:
        # The gateway's database threads keep their connections between tests (tests/gateway
        # conftest.py): the ones through the pooler end here, with the pooler's settings.
        runtime.close_thread_connections()
        connections.close_all()
        default.clear()
        default.update(direct)
        console.release()


class Console:
    """PgBouncer's admin console for the test database: the count of transactions it carried
    (SHOW STATS), the proof that the traffic went through it; and KILL, which closes its server
    connections to the database (else they stay open, and the test database cannot be dropped)."""

    def __init__(self, dbname: str, host: str, port: int) -> None:
        self.dbname, self.host, self.port = dbname, host, port

    def _connect(self) -> psycopg.Connection:
        url = urlsplit(PGBOUNCER_URL)
        info = psycopg.conninfo.make_conninfo(
            dbname="pgbouncer", user=url.username, password=url.password, host=self.host, port=str(self.port)
        )
        # The console speaks the simple query protocol only (a client-side cursor's).
        return psycopg.connect(info, autocommit=True, cursor_factory=psycopg.ClientCursor)

    def transactions(self) -> int:
        with self._connect() as conn:
            cur = conn.execute("SHOW STATS")
            names = [c.name for c in cur.description or []]
            for row in cur.fetchall():
                stats = dict(zip(names, row, strict=True))
                if stats["database"] == self.dbname:
                    return int(stats["total_xact_count"])
        return 0

    def release(self) -> None:
        with self._connect() as conn:
            conn.execute(f"KILL {self.dbname}")
            conn.execute(f"RESUME {self.dbname}")  # KILL also pauses it; the next test connects again
