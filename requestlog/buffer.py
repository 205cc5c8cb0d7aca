"""Refusals on their way to the request log: noted in memory by the gateway, written in batches.

Why not an insert per refusal: admission is one statement under the ceiling's row lock
(ledger/admission.py), and a refusal is the answer a hot, exhausted cap gives most often. An
insert there — or even right after it, on the database threads that admit — would make every
refusal burst cost the admissions behind it. So `note()` only appends to a list (no I/O, on the
event loop), and the gateway's background loop (gateway/upstream/runtime.py) hands the list to
`flush()` every REQUEST_LOG_FLUSH_SECONDS: one multi-row INSERT per batch.

Accepted inexactness: the buffer is memory. A process killed hard loses at most one interval of
refusals, and a database outage longer than the buffer drops the excess (counted in
`dropped` and in the `capgate_request_log_dropped` metric). Refusals move no money, so this is
a gap in the log, never in a cap; admitted requests are logged by their usage record, which is
durable (outbox and spool).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter

from core.errors import CapgateError
from core.guards import Guards
from ledger.errors import BudgetExceeded
from tenants.models import hash_key

log = logging.getLogger("capgate.requestlog")

DROPPED = Counter(
    "capgate_request_log_dropped",
    "Refusals not written to the request log (buffer full or no organization to file them under).",
    ["reason"],
)

# Removal tests: tests/requestlog/test_gateway_log.py.
GUARDS = Guards(
    skip_admitted="an admitted request is not noted: its usage record is its row, so it is logged once",
)


class _Request(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...

    def api_key(self) -> str | None: ...


class _Call(Protocol):
    """What the gateway's ProxyCall exposes (gateway/upstream/proxy.py)."""

    @property
    def req(self) -> _Request: ...
    @property
    def kind(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def started(self) -> float: ...  # time.monotonic() when the request arrived
    @property
    def admission(self) -> object | None: ...  # set once admitted
    @property
    def model_name(self) -> str: ...


@dataclass
class Pending:
    request_id: str
    key_hash: str
    customer: str
    run_id: str
    model: str
    endpoint: str
    status: str
    code: str
    http_status: int
    budget_id: int | None
    reserved_nano: int
    latency_ms: int
    message: str
    at: datetime = field(default_factory=timezone.now)


def status_of(exc: CapgateError) -> str:
    if exc.status == 402:
        return "refused"
    if exc.status == 429:
        return "rate_limited"
    return "rejected"


class Buffer:
    """A bounded list shared by the event loop (append) and a database thread (take)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Pending] = []
        self.dropped = 0

    @property
    def capacity(self) -> int:
        return int(settings.CAPGATE["REQUEST_LOG_BUFFER"])

    def add(self, item: Pending) -> None:
        with self._lock:
            if len(self._items) >= self.capacity:
                self.dropped += 1
                DROPPED.labels("buffer_full").inc()
                return
            self._items.append(item)

    def take(self) -> list[Pending]:
        with self._lock:
            items, self._items = self._items, []
            return items

    def put_back(self, items: list[Pending]) -> None:
        """After a failed write: keep the oldest that fit (newer notes already queued stay)."""
        with self._lock:
            room = max(self.capacity - len(self._items), 0)
            kept, lost = items[:room], len(items) - room
            self._items = kept + self._items
            if lost > 0:
                self.dropped += lost
                DROPPED.labels("buffer_full").inc(lost)

    def __len__(self) -> int:
        return len(self._items)


refusals = Buffer()


def note(call: _Call, exc: CapgateError) -> None:
    """The gateway answered `call` with `exc`. Never raises, never does I/O."""
    try:
        if GUARDS.skip_admitted and call.admission is not None:
            return
        raw_key = call.req.api_key()
        if not raw_key:
            return  # 401 without a key: no organization to file it under
        h = call.req.headers
        refused_by = exc if isinstance(exc, BudgetExceeded) else None
        refusals.add(
            Pending(
                request_id=call.request_id,
                key_hash=hash_key(raw_key),
                customer=h.get("x-capgate-customer", "")[:200],
                run_id=h.get("x-capgate-run", "")[:200],
                model=call.model_name[:200],
                endpoint=call.kind,
                status=status_of(exc),
                code=exc.code[:100],
                http_status=exc.status,
                budget_id=refused_by.budget_id if refused_by else None,
                reserved_nano=max(refused_by.worst_nano, 0) if refused_by else 0,
                latency_ms=int((time.monotonic() - call.started) * 1000),
                message=exc.message[:2000],
            )
        )
    except Exception:  # the log must never break an answer
        log.exception("could not note a refusal for the request log")


def flush() -> int:
    """Write every noted refusal (runs on a database thread). Returns how many were written.
    On a database error the batch goes back into the buffer, and the error propagates."""
    from django.db import DatabaseError

    from requestlog.services import write_refusals  # requestlog.services imports this module

    items = refusals.take()
    if not items:
        return 0
    try:
        return write_refusals(items=items)
    except DatabaseError:
        refusals.put_back(items)
        raise
