"""Process-wide gateway machinery: the database thread pool, connection health, and the
background loops started with the ASGI app (heartbeat, micro-batch drain, spool replay,
request log flush)."""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

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
    reservations at worst case); `probe` is /readyz's one thread (gateway/ops.py)."""
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


# Guard points (tests/faults/test_db_threads.py removes each and shows a request failing on a
# connection the restart killed): a held connection that looks dead is dropped before use, and
# one that turns out dead in use costs one failed attempt, retried at once on a fresh one.
DROP_DEAD_HELD = True
RETRY_LOST = True


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
    if not DROP_DEAD_HELD:
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
        retry = RETRY_LOST and reused and _connection_lost()
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


class Health:
    """Connection ejection: after `threshold` consecutive failures a connection sits out a
    cooldown; one success resets it."""

    def __init__(self, threshold: int = 3, cooldown: float = 30.0):
        self.threshold = threshold
        self.cooldown = cooldown
        self._failures: dict[int, int] = {}
        self._ejected_until: dict[int, float] = {}

    def ok(self, connection_id: int) -> bool:
        return self._ejected_until.get(connection_id, 0.0) <= time.monotonic()

    def failed(self, connection_id: int) -> None:
        n = self._failures.get(connection_id, 0) + 1
        self._failures[connection_id] = n
        if n >= self.threshold:
            self._ejected_until[connection_id] = time.monotonic() + self.cooldown
            self._failures[connection_id] = 0
            log.warning("connection %s ejected for %.0fs after %d failures", connection_id, self.cooldown, n)

    def succeeded(self, connection_id: int) -> None:
        self._failures.pop(connection_id, None)
        self._ejected_until.pop(connection_id, None)

    def reset(self) -> None:
        self._failures.clear()
        self._ejected_until.clear()


health = Health()


class Background:
    """Loops that live as long as the ASGI app: heartbeat, micro-batch drain, spool replay."""

    def __init__(self) -> None:
        self.instance_id: int | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.tokenizers: asyncio.Future[None] | None = None  # encodings loading (gateway/tokens.py)
        self.drain_interval = settings.CAPGATE["DRAIN_INTERVAL"]

    def kick_drain(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        from budgets.instances import register
        from gateway import tokens

        # Off the event loop and not awaited: requests are served meanwhile, and one needing an
        # exact count before the load ends waits on the encoding's lock only for the rest of it.
        self.tokenizers = asyncio.get_running_loop().run_in_executor(None, tokens.warm)
        try:
            self.instance_id = (await db(register)).id
        except DatabaseError:
            log.exception("could not register this gateway process; will retry in the heartbeat loop")
        await asyncio.get_running_loop().run_in_executor(None, warm_thread_connections)
        self._tasks = [
            asyncio.create_task(c())
            for c in (self._heartbeat, self._drain, self._replay, self._request_log, self._slices, self._listen)
        ]

    async def stop(self) -> None:
        from budgets.instances import stop
        from ledger import slices
        from ledger.drain import drain_all
        from requestlog import buffer as request_log

        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            slices.book.retire_all()  # unused parts of this process's slices go back to their windows
            await db(slices.book.give_back_pending, lane="settle")
            await db(drain_all, lane="settle")
            await db(request_log.flush, lane="settle")
            if self.instance_id is not None:
                await db(stop, instance_id=self.instance_id)
        except DatabaseError:
            log.warning("database unavailable at shutdown: beat will settle this process's records")

    async def _heartbeat(self) -> None:
        # On the `live` lane (its own thread and connection, never queued behind requests), and
        # retried every HEARTBEAT_RETRY seconds after a failure rather than a whole interval: a
        # process says it is alive as soon as the database answers again (budgets/instances.py
        # measures a silence from the database's own start, so the outage itself is not counted).
        from budgets.instances import alive_ids, heartbeat, register
        from ledger import slices

        interval = settings.CAPGATE["HEARTBEAT_INTERVAL"].total_seconds()
        while True:
            wait = interval
            try:
                if self.instance_id is None or not await db(heartbeat, instance_id=self.instance_id, lane="live"):
                    self.instance_id = (await db(register, lane="live")).id
                # Slices are sized by how many processes share a ceiling's room (ledger/slices.py).
                live = await db(alive_ids, grace=settings.CAPGATE["HEARTBEAT_GRACE"], lane="live")
                slices.book.processes = max(1, len(live))
            except DatabaseError:
                log.warning("heartbeat failed: database unavailable; retrying in %.1f s", HEARTBEAT_RETRY)
                wait = min(interval, HEARTBEAT_RETRY)
            await asyncio.sleep(wait)

    async def _slices(self) -> None:
        # Headroom slices (ledger/slices.py): retire the ones past their time or period, and give
        # their unused parts back to the windows, off the request path. A return the database
        # refuses now is tried again next round; until then the room stays held (never lost).
        from ledger import slices

        while True:
            await asyncio.sleep(SLICE_TICK_SECONDS)
            slices.book.retire_expired()
            if not slices.book.has_returns():
                continue
            try:
                await db(slices.book.give_back_pending, lane="settle")
            except DatabaseError:
                log.warning("could not give back slices: database unavailable; retrying")

    async def _listen(self) -> None:
        # Another process refused a request, or an organization's budgets changed: give back this
        # process's slices on those windows, or of that organization, at once (LISTEN on its own
        # connection; a lost notification costs utilization, not the cap).
        import psycopg

        from ledger import slices

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {slices.NOTIFY_CHANNEL}")
                    async for note in conn.notifies():
                        if slices.book.on_notification(note.payload):
                            await db(slices.book.give_back_pending, lane="settle")
            except (psycopg.Error, DatabaseError, OSError):
                log.warning("slice notifications: database unavailable; listening again in 2 s")
                await asyncio.sleep(2.0)

    async def _drain(self) -> None:
        # Woken by each recorded response; waits one interval so that a burst settles in one
        # batch (one lock per hot ceiling per batch), then drains until the outbox is empty.
        from ledger.drain import drain

        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=5.0)
            except TimeoutError:
                pass
            self._wake.clear()
            await asyncio.sleep(self.drain_interval)
            try:
                while await db(drain, limit=500, lane="settle") == 500:
                    pass
            except DatabaseError:
                log.warning("drain failed: database unavailable; records stay in the outbox")

    async def _request_log(self) -> None:
        # Refusals noted in memory (requestlog/buffer.py) go to the database here, one INSERT per
        # interval, off the admitting threads; if the database is down they wait (bounded).
        from requestlog import buffer as request_log

        interval = settings.CAPGATE["REQUEST_LOG_FLUSH_SECONDS"]
        while True:
            await asyncio.sleep(interval)
            if not len(request_log.refusals):
                continue
            try:
                await db(request_log.flush, lane="settle")
            except DatabaseError:
                log.warning(
                    "request log flush failed: database unavailable; %d refusals wait", len(request_log.refusals)
                )

    async def _replay(self) -> None:
        # Records parked in memory (gateway/recorder.py) and spooled to disk (ledger/spool.py)
        # go to the outbox once the database answers. Nothing ends this loop but cancellation:
        # any other failure is logged and the next round tries again.
        from gateway.recorder import recorder
        from ledger.spool import pending, replay

        while True:
            await asyncio.sleep(REPLAY_INTERVAL)
            try:
                parked = recorder()
                if parked.parked and await parked.retry_parked():
                    self.kick_drain()
                if not await asyncio.get_running_loop().run_in_executor(None, pending):
                    continue
                n = await db(replay, lane="settle")
                if n:
                    log.info("replayed %d spooled usage records", n)
                    self.kick_drain()
            except DatabaseError:
                pass  # still down: try again next round
            except Exception:
                log.exception("spool replay failed; retrying in %.1f s", REPLAY_INTERVAL)


background: Background | None = None
SLICE_TICK_SECONDS = 0.1
HEARTBEAT_RETRY = 0.5  # seconds between heartbeats while the database does not answer
REPLAY_INTERVAL = 1.0  # seconds between attempts to move parked and spooled records to the outbox


def conninfo() -> str:
    """The default database's libpq connection string (for a LISTEN connection of its own)."""
    from psycopg.conninfo import make_conninfo

    db_settings = settings.DATABASES["default"]
    return make_conninfo(
        dbname=db_settings["NAME"],
        user=db_settings.get("USER") or None,
        password=db_settings.get("PASSWORD") or None,
        host=db_settings.get("HOST") or None,
        port=str(db_settings.get("PORT") or "") or None,
    )


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
