"""Group commit for usage records: the records of requests that finish while one
write is in flight go to the database together, in one INSERT (ledger/recording.py
`record_many`), instead of one transaction per request. The INSERT is sent from the event loop
on its own connection (gateway/upstream/loopdb.py), or on a settle thread when that fails.

Nothing waits for a batch to fill: a record finding no write in flight starts one at once (so a
lone request pays no delay), and the records arriving meanwhile form the next batch. Every
caller still waits until its own record is committed (or gets the error that made it spool
it), so a response is never finished before its usage row exists (property 3), and the drain
only ever sees committed records.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from gateway.upstream import runtime
from gateway.upstream.loopdb import LoopConnection, Unavailable
from ledger import slices
from ledger.models import Reservation, UsageRecord
from ledger.recording import Outcome, complete_batch, complete_needs_database, prepare_batch, record_many

log = logging.getLogger("capgate.gateway")

MAX_BATCH = 200  # records per INSERT (each row is ~27 parameters)
CLOSE_WAIT_SECONDS = 10.0  # at shutdown, for the write in flight


class Recorder:
    """One per event loop (the gateway process's)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Reservation, Outcome, asyncio.Future[UsageRecord]]] = []
        self._writing = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
        self.batches = 0  # INSERTs made (the tests read it)
        self.records = 0
        # Records the database could not take (it was unreachable): written again by `retry_parked`
        # until it does. Also spooled to disk where the disk allows, but memory is what keeps a
        # record when the spool cannot, and what tells this process's slices it settled.
        self.parked: list[tuple[Reservation, Outcome]] = []
        self.loop_db = LoopConnection()

    async def record(self, *, reservation: Reservation, outcome: Outcome) -> UsageRecord:
        """The record once committed; raises what `record` would (RecordRejected, ValueError,
        or a DatabaseError for the whole batch: the caller spools its own record)."""
        done: asyncio.Future[UsageRecord] = asyncio.get_running_loop().create_future()
        self._pending.append((reservation, outcome, done))
        if not self._writing:
            self._writing = True
            self._task = asyncio.get_running_loop().create_task(self._write())
        return await asyncio.shield(done)  # a cancelled caller must not cancel the batch's write

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    results = await self._write_batch([(r, o) for r, o, _ in batch])
                except BaseException as exc:  # every waiter gets it (a DatabaseError: each spools)
                    for _, _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                            done.exception()  # retrieved: a waiter that left must not log it
                    if not isinstance(exc, Exception):
                        raise
                    continue
                self.batches += 1
                self.records += len(batch)
                for (reservation, _, done), result in zip(batch, results, strict=True):
                    # Carved from its slice with the record, or refused for good (then the slice
                    # keeps its part until it lapses): either way no longer in flight here. A
                    # batch that failed as a whole is spooled and carved on replay instead.
                    slices.book.settled(reservation)
                    if done.done():
                        continue
                    if isinstance(result, Exception):
                        done.set_exception(result)
                        done.exception()
                    else:
                        done.set_result(result)
        finally:
            self._writing = False

    async def _write_batch(self, items: list[tuple[Reservation, Outcome]]) -> list[UsageRecord | Exception]:
        """`record_many(items)`: its statement sent from this loop when the loop's connection is
        up (gateway/upstream/loopdb.py), else the whole of it on a settle thread."""
        # Built here only when the loop will send it: record_many builds it again on its thread.
        batch = prepare_batch(items) if self.loop_db.enabled else None
        if batch is not None and batch.todo:
            try:
                result = await self.loop_db.fetchone(batch.sql, batch.params)
            except Unavailable:
                pass
            except psycopg.IntegrityError:
                pass  # a record refused: the thread path writes the others one by one, and logs it
            except (psycopg.Error, OSError) as exc:
                log.warning("usage records: the loop's database connection failed (%s); writing on a thread", exc)
            else:
                if complete_needs_database(batch, result):
                    return await runtime.db(complete_batch, batch, result, lane="settle")
                return complete_batch(batch, result)
        return await runtime.db(record_many, items=items, lane="settle")

    async def close(self) -> None:
        """At shutdown: the write in flight finishes first (its records committed, or handed to
        a thread), for at most CLOSE_WAIT_SECONDS, then the loop's connection is closed. Closing
        it under a statement would leave that batch's records to the loop's end, which cancels
        them unwritten."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=CLOSE_WAIT_SECONDS)
            if not task.done():
                log.error("usage records: a write was still in flight after %.0f s at shutdown", CLOSE_WAIT_SECONDS)
        await self.loop_db.close()

    def park(self, *, reservation: Reservation, outcome: Outcome) -> None:
        self.parked.append((reservation, outcome))

    async def retry_parked(self) -> int:
        """Write the parked records (one INSERT per MAX_BATCH); returns how many the database
        took. A DatabaseError leaves them parked, in order, and is raised. A record refused for
        good is dropped here as it is on the request path (logged where it was refused)."""
        written = 0
        while self.parked:
            batch, self.parked = self.parked[:MAX_BATCH], self.parked[MAX_BATCH:]
            try:
                results = await runtime.db(record_many, items=batch, lane="settle")
            except BaseException:
                self.parked = batch + self.parked
                raise
            for (reservation, _), result in zip(batch, results, strict=True):
                slices.book.settled(reservation)
                written += not isinstance(result, Exception)
        return written


_recorders: dict[asyncio.AbstractEventLoop, Recorder] = {}


def recorder() -> Recorder:
    """This event loop's recorder (tests run several gateways, each on its own loop)."""
    loop = asyncio.get_running_loop()
    found = _recorders.get(loop)
    if found is None:
        for stale in [other for other in _recorders if other.is_closed()]:
            del _recorders[stale]
        found = _recorders[loop] = Recorder()
    return found
