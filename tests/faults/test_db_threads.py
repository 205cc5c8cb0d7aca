"""A gateway database thread keeps its connection between calls; after a PostgreSQL restart
that connection is dead. The next call on the thread must still succeed: the dead connection is
dropped before use (its socket says the server closed it), or else costs one failed attempt,
retried at once on a fresh connection. On a private cluster (the shared one serves others)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import DatabaseError, connection

from gateway.upstream import dbthreads
from tests.faults.conftest import PrivatePostgres

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bare_cluster() -> Iterator[PrivatePostgres]:
    """A private cluster with no schema: these tests only ask it `SELECT 1`."""
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


def _select_one() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


def _after_a_restart(pg: PrivatePostgres) -> list[object]:
    """One database thread that holds its connection through a restart; then two calls on it.
    Returns what each call returned or raised."""
    thread = ThreadPoolExecutor(1)
    try:
        with pg.as_default():
            assert thread.submit(dbthreads._call, _select_one).result() == 1  # the thread now holds a connection
            connection.close()
            pg.stop()
            pg.start()
            results: list[object] = []
            for _ in range(2):
                try:
                    results.append(thread.submit(dbthreads._call, _select_one).result())
                except DatabaseError as exc:
                    results.append(exc)
            thread.submit(lambda: connection.close()).result()  # looked up on that thread
            return results
    finally:
        thread.shutdown()


def test_the_first_call_after_a_restart_succeeds_on_a_fresh_connection(bare_cluster):
    assert _after_a_restart(bare_cluster) == [1, 1]


def test_without_the_socket_check_a_dead_connection_costs_one_attempt_retried_at_once(bare_cluster, monkeypatch):
    # given: the held connection is not checked before use: the call finds it dead
    monkeypatch.setattr(dbthreads.GUARDS, "drop_dead_held", False)
    # then: the call is retried at once on a fresh connection, and succeeds
    assert _after_a_restart(bare_cluster) == [1, 1]


def test_removal_without_either_guard_the_first_call_after_a_restart_fails(bare_cluster, monkeypatch):
    monkeypatch.setattr(dbthreads.GUARDS, "drop_dead_held", False)
    monkeypatch.setattr(dbthreads.GUARDS, "retry_lost", False)
    first, second = _after_a_restart(bare_cluster)
    assert isinstance(first, DatabaseError)  # the request that met the dead connection
    assert second == 1  # the connection was dropped after failing: the next call reconnects
