"""The event loop's own database connection, for the group commit's one statement.

A usage record is written before its response finishes (DESIGN property 3), so at low
concurrency every request waits for one INSERT. On a database thread that wait also pays two
hops between the loop and the thread and the thread's waits for the interpreter; here the loop
sends the statement itself on one psycopg AsyncConnection and awaits the answer.

Only the statement that succeeds on a healthy connection runs here. Anything else goes to the
thread path that has always written records (ledger/recording.py `record_many`, with its
retries, its record-by-record split of a refused batch and the fault tests behind them):

- any error (the database restarted or unreachable, a record refused): the connection is
  closed, the batch is written on a thread from the start (the statement is idempotent by
  request id, so one that committed before its answer was lost is not written twice), and
  this connection is not tried again for `RETRY_SECONDS`;
- a batch whose completion needs the database (a request recorded before, a slice charged whole
  by expiry) is completed on a thread after its statement.

Its settings are the default database's (behind a transaction pooler, through the pooler and
without prepared statements, as config/settings/pooling.py sets for every connection).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections

RETRY_SECONDS = 1.0  # after a failure, batches go to the threads for this long
CONNECT_TIMEOUT = 2  # seconds; libpq's own default waits forever
APPLICATION_NAME = "capgate-loop-records"  # how pg_stat_activity shows it


class Unavailable(Exception):
    """This connection is not used just now: the caller writes on a thread instead."""


def connection_params() -> dict[str, Any]:
    """psycopg's connect() arguments for the default database, as Django's backend builds them
    (OPTIONS included, prepared statements as pooling.py sets them), without Django's sync
    cursor class."""
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    params.setdefault("application_name", APPLICATION_NAME)
    params["autocommit"] = True  # the statement is its own transaction (ledger/recording.py _insert_sql)
    return params


class LoopConnection:
    """One per event loop (held by its Recorder). Used by one batch at a time: the recorder
    never has two writes in flight."""

    def __init__(self) -> None:
        self._conn: psycopg.AsyncConnection | None = None
        self._resting_until = 0.0
        self.statements = 0  # statements answered here (the tests read it)
        self.failures = 0

    @property
    def enabled(self) -> bool:
        return bool(settings.CAPGATE["LOOP_RECORDS"]) and time.monotonic() >= self._resting_until

    async def fetchone(self, sql: str, params: list[Any]) -> tuple:
        """The statement's one row. Raises Unavailable when resting after a failure; any other
        exception (psycopg's, OSError) means the statement may or may not have committed, and
        the connection is closed."""
        if not self.enabled:
            raise Unavailable
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(**connection_params())
            cursor = await self._conn.execute(sql, params)
            row = await cursor.fetchone()
        except psycopg.IntegrityError:
            raise  # the records are refused, the connection is fine (autocommit: nothing is open)
        except BaseException:
            self.failures += 1
            self._resting_until = time.monotonic() + RETRY_SECONDS
            await self.close()
            raise
        self.statements += 1
        assert row is not None  # the statement always returns its one row
        return row

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()  # psycopg closes a broken connection without raising
