"""Process-wide gateway machinery: upstream connection health, and the background loops started
with the ASGI app (heartbeat, micro-batch drain, spool replay, request log flush). The database
threads (`db`, `executor`, `run_soon`) are gateway/upstream/dbthreads.py's, re-exported here for the callers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError

from core import invalidation
from gateway.admission import tokens
from gateway.upstream import transport
from gateway.upstream.dbthreads import (  # noqa: F401  (re-exported)
    close_thread_connections,
    db,
    executor,
    run_soon,
    warm_thread_connections,
)
from gateway.upstream.recorder import recorder
from ledger import slices
from ledger.drain import drain, drain_all
from ledger.instances import alive_ids, heartbeat, register, stop
from ledger.spool import pending, replay
from ratelimits.services import drop_idle_redis
from requestlog import buffer as request_log

log = logging.getLogger("capgate.gateway")


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


_stop_hooks: list[Callable[[], None]] = []


def on_stop(hook: Callable[[], None]) -> None:
    """Run `hook` (blocking, on a thread) when the ASGI app stops: for what an app above the
    gateway started in this process (jobs' sizing processes)."""
    if hook not in _stop_hooks:
        _stop_hooks.append(hook)


class Background:
    """Loops that live as long as the ASGI app: heartbeat, micro-batch drain, spool replay."""

    def __init__(self) -> None:
        self.instance_id: int | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.tokenizers: asyncio.Future[None] | None = None  # encodings loading (gateway/admission/tokens.py)
        self.drain_interval = settings.CAPGATE["DRAIN_INTERVAL"]

    def kick_drain(self) -> None:
        self._wake.set()

    async def start(self) -> None:
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
            for c in (
                self._heartbeat,
                self._drain,
                self._replay,
                self._request_log,
                self._slices,
                self._listen,
                self._redis_idle,
            )
        ]

    async def stop(self) -> None:
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
        finally:
            await recorder().close()  # the loop's own connection (gateway/upstream/loopdb.py)
            for hook in _stop_hooks:
                await asyncio.get_running_loop().run_in_executor(None, hook)

    async def _heartbeat(self) -> None:
        # On the `live` lane (its own thread and connection, never queued behind requests), and
        # retried every HEARTBEAT_RETRY seconds after a failure rather than a whole interval: a
        # process says it is alive as soon as the database answers again (ledger/instances.py
        # measures a silence from the database's own start, so the outage itself is not counted).

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
        # One connection LISTENs on two channels. capgate_slices: another process refused a
        # request, or an organization's budgets changed: give back this process's slices on those
        # windows, or of that organization, at once (a lost notification costs utilization, not
        # the cap). capgate_cache: a write to something this process caches (core/invalidation.py);
        # between notices it sends itself a fence every fence_interval(), and the caches trust
        # themselves only while one came back within the lease. A dropped connection empties them.
        import psycopg

        freshness = invalidation.freshness
        fenced = False  # this listener vouches for the caches (and so empties them when it drops)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {slices.NOTIFY_CHANNEL}")
                    await conn.execute(f"LISTEN {invalidation.CHANNEL}")
                    while True:
                        # Only once this process is registered alive: budget edits wait out the
                        # lease only when some gateway process is (budgets/services.py).
                        fenced = bool(settings.CAPGATE["CACHE_NOTIFY"]) and self.instance_id is not None
                        if fenced:
                            freshness.enabled = True
                            await conn.execute("SELECT pg_notify(%s, %s)", [invalidation.CHANNEL, freshness.fence()])
                        async for note in conn.notifies(timeout=invalidation.fence_interval()):
                            if note.channel == invalidation.CHANNEL:
                                if settings.CAPGATE["CACHE_NOTIFY"]:  # off: lookups only expire
                                    freshness.on_notification(note.payload)
                            elif slices.book.on_notification(note.payload):
                                await db(slices.book.give_back_pending, lane="settle")
            except (psycopg.Error, DatabaseError, OSError):
                if fenced:
                    freshness.lost()
                log.warning("notifications: database unavailable; listening again in 2 s")
                await asyncio.sleep(2.0)
            except BaseException:
                if fenced:
                    freshness.lost()
                    freshness.enabled = False
                raise

    async def _drain(self) -> None:
        # Woken by each recorded response; waits one interval so that a burst settles in one
        # batch (one lock per hot ceiling per batch), then drains until the outbox is empty.

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

    async def _redis_idle(self) -> None:
        # Idle pooled Redis sockets are closed every REDIS_IDLE_DROP_SECONDS (the next call
        # reconnects): after a Redis restart, the ones no call happens to reuse would otherwise sit
        # half-closed (CLOSE-WAIT) for as long as the process lives.

        while True:
            await asyncio.sleep(settings.CAPGATE["REDIS_IDLE_DROP_SECONDS"])
            try:
                await asyncio.get_running_loop().run_in_executor(None, drop_idle_redis)
                await transport.drop_idle_in_process()  # in-process providers' own stores
            except Exception:  # hygiene only: never ends the loop
                log.exception("could not close idle Redis connections")

    async def _request_log(self) -> None:
        # Refusals noted in memory (requestlog/buffer.py) go to the database here, one INSERT per
        # interval, off the admitting threads; if the database is down they wait (bounded).

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
        # Records parked in memory (gateway/upstream/recorder.py) and spooled to disk (ledger/spool.py)
        # go to the outbox once the database answers. Nothing ends this loop but cancellation:
        # any other failure is logged and the next round tries again.

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
    """The libpq connection string of the LISTEN connection: CAPGATE["LISTEN_DATABASE"] when set
    (a direct connection; a transaction pooler carries no session to LISTEN in, and
    config/settings/pooling.py requires it there), else the default database's."""
    from psycopg.conninfo import make_conninfo

    db_settings = settings.CAPGATE.get("LISTEN_DATABASE") or settings.DATABASES["default"]
    return make_conninfo(
        dbname=db_settings["NAME"],
        user=db_settings.get("USER") or None,
        password=db_settings.get("PASSWORD") or None,
        host=db_settings.get("HOST") or None,
        port=str(db_settings.get("PORT") or "") or None,
    )
