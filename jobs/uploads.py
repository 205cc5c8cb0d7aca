"""Bounds on POST /v1/files, so that one tenant's uploads cannot starve the others.

- An organization runs at most ORG_CONCURRENT_UPLOADS uploads at once in one gateway process; one
  more is refused with 429 before its body is read.
- An organization keeps at most ORG_STORED_FILE_BYTES of uploaded files (the bytes capgate sent the
  provider, as its own rows record them); an upload that would pass it is refused with 413.
- A gateway process sizes at most SIZING_CONCURRENCY uploads at once (jobs/sizing.py), each in a
  sizing process of its own at a lower CPU priority, never on the event loop nor on a thread of the
  gateway's process; the others wait their turn.

The first bound is per process, not global: N gateway processes let an organization run N times as
many uploads (each still sized in turn). The byte quota is read before the provider call, not held:
uploads that pass it at the same moment may go over it by at most the ones running at once."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar

from django.conf import settings
from django.db import connections
from django.db.models import Sum

from gateway.http.errors import GatewayError
from jobs import sizing_worker
from jobs.models import JobFile

T = TypeVar("T")


class _Running:
    """Uploads running in this process, per organization. A lock, not the event loop, guards the
    counts: a process may serve on more than one loop (tests do)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[int, int] = {}

    def take(self, organization_id: int, limit: int) -> bool:
        with self._lock:
            n = self._count.get(organization_id, 0)
            if n >= limit:
                return False
            self._count[organization_id] = n + 1
            return True

    def give(self, organization_id: int) -> None:
        with self._lock:
            n = self._count.get(organization_id, 0) - 1
            if n > 0:
                self._count[organization_id] = n
            else:
                self._count.pop(organization_id, None)


running = _Running()


@asynccontextmanager
async def upload_slot(organization_id: int) -> AsyncIterator[None]:
    """One of the organization's upload slots in this process, or 429 `too_many_concurrent_uploads`."""
    limit = settings.CAPGATE["ORG_CONCURRENT_UPLOADS"]
    if not running.take(organization_id, limit):
        raise GatewayError(
            f"This organization already has {limit} uploads in progress; retry when one has finished.",
            code="too_many_concurrent_uploads",
            status=429,
        )
    try:
        yield
    finally:
        running.give(organization_id)


# The sizing processes. Sizing is CPU work in proportion to the file (parse every line, bound it,
# write it back), and a thread doing it in the gateway's process holds the GIL the event loop needs
# for every tenant's requests (measured: another organization's p95 x10 during two 20 MB uploads). A
# separate process runs it at a lower CPU priority instead, with its own database connection.
_pool: tuple[dict, ProcessPoolExecutor] | None = None
_pool_lock = threading.Lock()
_sizing: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _executor() -> ProcessPoolExecutor:
    global _pool
    database = {**connections["default"].settings_dict}
    database["OPTIONS"] = {k: v for k, v in database.get("OPTIONS", {}).items() if k != "pool"}
    with _pool_lock:
        if _pool is not None and _pool[0] != database:  # the database changed (tests): start afresh
            _pool[1].shutdown(wait=False, cancel_futures=True)
            _pool = None
        if _pool is None:
            workers = max(1, settings.CAPGATE["SIZING_CONCURRENCY"])
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),  # never fork a process with threads
                initializer=sizing_worker.start,
                initargs=(database,),
            )
            _pool = (database, pool)
        return _pool[1]


def stop_sizing() -> None:
    """Stop the sizing processes (the ASGI app stops: gateway/upstream/runtime.py `on_stop`)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool[1].shutdown(wait=True, cancel_futures=True)
            _pool = None


async def sizing_turn(fn: Callable[..., T], /, **kwargs: object) -> T:
    """Run `fn(**kwargs)` (an upload's parsing and sizing: a module-level function, its arguments
    picklable) in a sizing process, at most SIZING_CONCURRENCY at once per gateway process; the
    others wait their turn here, their bodies not yet copied."""
    loop = asyncio.get_running_loop()
    turns = _sizing.get(loop)
    if turns is None:
        for stale in [other for other in _sizing if other.is_closed()]:
            del _sizing[stale]
        turns = _sizing[loop] = asyncio.Semaphore(max(1, settings.CAPGATE["SIZING_CONCURRENCY"]))
    async with turns:
        try:
            return await loop.run_in_executor(_executor(), partial(sizing_worker.run, fn, kwargs))
        except BrokenProcessPool:
            stop_sizing()  # a sizing process died (killed, out of memory): the next upload starts afresh
            raise GatewayError("The upload could not be sized; retry it.", code="sizing_failed", status=503) from None


def stored_bytes(*, organization_id: int) -> int:
    return JobFile.objects.filter(organization_id=organization_id).aggregate(n=Sum("size_bytes"))["n"] or 0


def check_room(*, organization_id: int, adding: int, quota: int) -> None:
    """413 `file_storage_quota` when the organization's stored files plus `adding` bytes pass its
    quota (given by the gateway process: its settings, not a sizing process's)."""
    stored = stored_bytes(organization_id=organization_id)
    if stored + adding > quota:
        raise GatewayError(
            f"This organization stores {stored} bytes of files; {adding} more would pass its quota of "
            f"{quota} bytes. Delete files it no longer needs (DELETE /v1/files/{{file_id}}).",
            code="file_storage_quota",
            status=413,
            param="file",
        )
