"""The gateway's database threads: lanes of threads that each keep one connection for the life of
the process, and what keeps those connections usable across a database restart (a dead held
connection is dropped before use or retried once at once; the pool reconnects steadily)."""

from __future__ import annotations

import asyncio
import logging
import select
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from core.guards import Guards

log = logging.getLogger("capgate.gateway")
T = TypeVar("T")


SETTLE_THREADS = 4


def _pool_size() -> int:
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool") or {}
    # Each gateway thread holds a pool connection for the life of the process; leave the
    # dashboard/API's reserved slice (CAPGATE_DB_WEB_CONNECTIONS) to Django's request threads,
    # one to the heartbeat's own thread (the `live` lane) and one to /readyz's (`probe`).
    reserved = int(getattr(settings, "CAPGATE_DB_WEB_CONNECTIONS", 6)) + 2
    return max(SETTLE_THREADS + 1, int(pool.get("max_size", 26)) - reserved) if pool else 20


_executors: dict[str, ThreadPoolExecutor] = {}
_executor_lock = threading.Lock()


def executor(lane: str = "admit") -> ThreadPoolExecutor:
    """Four lanes of database threads. `settle` (recording outcomes, draining) has its own few
    threads so that a burst of admissions and refusals queued on `admit` never delays the
    records that give room back to the caps; `live` is the heartbeat's one thread, so that
    proving this process alive never waits behind requests (beat charges a silent process's
    reservations at worst case); `probe` is /readyz's one thread (gateway/http/ops.py)."""
    with _executor_lock:
        if lane not in _executors:
            total = _pool_size()
            if lane in ("live", "probe"):
                size = 1
            elif lane == "settle":
                size = SETTLE_THREADS
            else:
                size = max(4, total - SETTLE_THREADS)
            _executors[lane] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"capgate-db-{lane}")
        return _executors[lane]


def run_soon(fn: Callable[..., object], /, *, lane: str = "settle", **kwargs: object) -> None:
    """Run `fn(**kwargs)` on a database thread of `lane` without waiting for it, for work the
    answer does not depend on (a refusal's alert). Its error is logged, never raised here."""

    def done(future: Future) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            log.error("%s failed", getattr(fn, "__qualname__", fn), exc_info=error)

    try:
        executor(lane).submit(fn, **kwargs).add_done_callback(done)
    except RuntimeError:  # the lane is shut down: the process is stopping
        log.exception("%s not run: the %s lane is shut down", getattr(fn, "__qualname__", fn), lane)


# How often the connection pool tries to reconnect while the database is away. psycopg_pool
# backs off exponentially (1 s, 2 s, 4 s, ...), so after a 20 s outage its next attempt could be
# 15 s after the database was back, every admission meanwhile timing out of the pool with 503.
# A refused local connect costs next to nothing: try at a steady pace instead.
RECONNECT_EVERY_SECONDS = 0.25


def reconnect_steadily() -> None:
    """Make the pool's reconnection attempts steady rather than exponential (its own tunables,
    class-wide: every pool of this process)."""
    from psycopg_pool.base import AttemptWithBackoff

    AttemptWithBackoff.INITIAL_DELAY = RECONNECT_EVERY_SECONDS
    AttemptWithBackoff.DELAY_BACKOFF = 1.0


# Removal tests: tests/faults/test_db_threads.py (a request failing on a connection a restart killed).
GUARDS = Guards(
    drop_dead_held="a held connection that looks dead is dropped before use",
    retry_lost="a call that finds its held connection dead in use is retried once, at once, on a fresh one",
)


def _close_quietly() -> None:
    try:
        connection.close()
    except DatabaseError:
        pass


def _held_connection_usable() -> bool:
    """Whether this thread holds a connection that still looks alive; a dead one is dropped.

    Each pool thread keeps its connection between calls. An idle connection in autocommit
    (these threads never LISTEN) has nothing to read unless the server ended it: a restarted
    or stopped PostgreSQL sends its termination notice and closes the socket. One poll() of the
    socket, no round trip, tells such a connection apart, so the call runs on a fresh one
    instead of failing (a false alarm costs one reconnect)."""
    raw = connection.connection
    if raw is None:
        return False
    if not GUARDS.drop_dead_held:
        return True
    try:
        if raw.closed or raw.broken:
            raise OSError("closed")
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return True
    except Exception:  # cannot be polled (closed, no socket): as good as dead, reconnect
        pass
    _close_quietly()
    return False


def _connection_lost() -> bool:
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", True) or getattr(raw, "broken", True))


def _call(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run fn on this thread's connection. A held connection that the socket poll could not
    tell was dead (the server vanished without closing it) costs one failed attempt: it is
    dropped and fn runs again at once on a fresh one from the pool (which checks what it hands
    out). A failure on a fresh connection is the database being away: raised, not retried.

    The retry is safe because the connection was lost before or during fn, so fn's
    transaction did not commit, short of a commit whose answer was lost on the way back; every
    function run here is keyed by request id or is a compare-and-set, so that case fails on the
    unique key instead of counting twice."""
    reused = _held_connection_usable()
    try:
        return fn(*args, **kwargs)
    except (OperationalError, InterfaceError):
        retry = GUARDS.retry_lost and reused and _connection_lost()
        _close_quietly()
        if not retry:
            raise
        log.warning("database connection lost while idle: retrying on a fresh connection")
    except DatabaseError:
        _close_quietly()
        raise
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        _close_quietly()
        raise


async def db(fn: Callable[..., T], *args, lane: str = "admit", **kwargs) -> T:
    """Run a synchronous ORM function on a database thread of the given lane."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(lane), partial(_call, fn, *args, **kwargs))


def _on_every_thread(fn: Callable[[], None], *, timeout: float = 30.0) -> None:
    for lane in ("admit", "settle", "live", "probe"):
        _on_every_thread_of(executor(lane), fn, timeout=timeout)


def _on_every_thread_of(ex: ThreadPoolExecutor, fn: Callable[[], None], *, timeout: float) -> None:
    """Run fn once on each of the pool's threads (creating them all): each task waits on a
    barrier sized to the pool, so no thread can take two."""
    import threading as _threading

    count = ex._max_workers
    barrier = _threading.Barrier(count)

    def task() -> None:
        try:
            fn()
        finally:
            try:
                barrier.wait(timeout=timeout)
            except _threading.BrokenBarrierError:
                pass

    for future in [ex.submit(task) for _ in range(count)]:
        future.result(timeout=timeout + 5)


def warm_thread_connections() -> None:
    """Open every database thread's connection up front: a burst arriving at a cold process
    would otherwise wait on dozens of simultaneous connects (and time out of the pool)."""

    def connect() -> None:
        try:
            connection.ensure_connection()
        except DatabaseError:
            log.warning("could not open a database connection while warming up")

    _on_every_thread(connect)


def close_thread_connections() -> None:
    """Close the database connection held by every database thread (shutdown, tests)."""
    for ex in list(_executors.values()):
        # A lambda: `connection` must be looked up in each thread (it is per thread).
        _on_every_thread_of(ex, lambda: connection.close(), timeout=10)
