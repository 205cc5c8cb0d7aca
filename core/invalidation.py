"""How a gateway process knows its caches are current: notices on one channel, and fences.

Every write to what the request path caches (budgets; keys, routes, connections, prices, rate
limits, classifications) sends `pg_notify('capgate_cache', '<kind>:<organization>')` from a
trigger in the writing transaction (ledger and gateway migrations), so no writer can skip it and
the notice arrives only if the write commits. Each gateway process LISTENs on one connection
(gateway/upstream/runtime.py) and hands each notice to the caches that subscribed to its kind.

A notice can be late (the listener is behind) or lost (its connection dropped). So the listener
also sends a fence, a notice of its own, every `fence_interval()` seconds. Postgres delivers a
channel's notices in commit order, so when a fence comes back every notice committed before it
was sent has been handled. `current()` is true while the newest fence heard back was sent less
than CAPGATE["CACHE_LEASE_SECONDS"] ago; a cache that must never serve a write older than its
lease (budgets: ledger/budget_cache.py) is used only while `current()`, and reads the database
otherwise. A dropped connection is `lost()`: every cache is emptied, and none is current until
a fence is heard on the new connection.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

from django.conf import settings

CHANNEL = "capgate_cache"


class Freshness:
    """This process's view of the invalidation channel (one per process: `freshness`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0  # the token is this process's own, even in a child forked after import
        self._token = ""
        self._seq = 0
        self._sent: dict[int, float] = {}  # fence number -> monotonic time it was sent
        self._heard_sent_at: float | None = None  # when the newest fence heard back was sent
        self._changed: dict[str, list[Callable[[str], None]]] = {}
        self._reset: list[Callable[[], None]] = []
        self.enabled = False  # a listener runs in this process (set by gateway/upstream/runtime.py)

    # The caches ------------------------------------------------------------------------------

    def subscribe(self, kind: str, *, changed: Callable[[str], None], reset: Callable[[], None]) -> None:
        """`changed(rest)` for each notice `kind:rest`; `reset()` when notices may have been lost."""
        self._changed.setdefault(kind, []).append(changed)
        self._reset.append(reset)

    def current(self) -> bool:
        """Every notice committed more than the lease ago has been handled here."""
        heard = self._heard_sent_at
        return self.enabled and heard is not None and time.monotonic() - heard <= lease()

    # The listener ----------------------------------------------------------------------------

    def fence(self) -> str:
        """The payload of the next fence to send, noting when it is sent (now)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._token, self._seq = os.getpid(), f"{os.getpid()}.{uuid.uuid4().hex[:12]}", 0
                self._sent.clear()
                self._heard_sent_at = None
            self._seq += 1
            self._sent[self._seq] = time.monotonic()
            if len(self._sent) > 64:  # fences that never came back (a dropped connection)
                for seq in sorted(self._sent)[:-64]:
                    del self._sent[seq]
            return f"fence:{self._token}:{self._seq}"

    def on_notification(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        if kind == "fence":
            token, _, seq = rest.rpartition(":")
            if not self._token or token != self._token or not seq.isdigit():
                return  # another process's fence
            with self._lock:
                sent = self._sent.pop(int(seq), None)
                if sent is not None and (self._heard_sent_at is None or sent > self._heard_sent_at):
                    self._heard_sent_at = sent
            return
        for changed in self._changed.get(kind, ()):
            changed(rest)

    def lost(self) -> None:
        """The listening connection dropped: notices may have been missed. Nothing is current
        until a fence comes back on a new connection, and every cache starts empty."""
        with self._lock:
            self._heard_sent_at = None
            self._sent.clear()
        for reset in self._reset:
            reset()


def lease() -> float:
    return float(settings.CAPGATE["CACHE_LEASE_SECONDS"])


def fence_interval() -> float:
    """How often the listener sends a fence: a quarter of the lease, so one late fence under
    load does not make the caches stale."""
    return lease() / 4


freshness = Freshness()
