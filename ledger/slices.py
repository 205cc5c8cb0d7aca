"""Headroom slices: a gateway process admits most requests of a hot ceiling in memory.

A slice is one durable reservation (origin `slice`, owned by the process, renewed by its
heartbeat like any of its reservations) taken by the ordinary admission statement: its amount is
already inside every blocking window's `reserved`. The process then admits requests against it in
memory, never more than it holds, so no window's `spent + reserved` grows by those admissions and
the ceiling's invariant is the admission statement's own.

The life of a request admitted from a slice:

1. `Book.admit` takes the request's worst case from the slice's `available` (in memory, under a
   lock). The request gets an unsaved Reservation (`slice_id` set) and is proxied as usual.
2. Its usage record is written by the group commit (ledger/recording.py), and the same statement
   *carves* the request out of the slice (ledger/carving.py): it inserts the request's own reservation
   and holds (its worst case on the slice's blocking windows, 0 on its alert windows) and takes
   the same amount off the slice's reservation and holds. Windows are not touched: the sum of
   holds on each window is unchanged. From here the drain settles the record like any other.
3. `Book.settled` is told once the record is committed.

A slice stops admitting after CAPGATE_SLICE_SECONDS, at its windows' period end, when it cannot
hold the next request, or when another process refused a request on one of its windows (a
NOTIFY on `capgate_slices`, gateway/upstream/runtime.py); its unused part then goes back to the windows
(`give_back`), and its row is deleted once nothing of it is in flight (or by the carve that takes
its last nano-dollar).

A request from a slice of a blocking ceiling also writes a claim before its provider call (its
worst case, one insert on no shared row: ledger/slice_claims.py). A crash leaves the slice's row
and those claims: once its owner is taken for dead, expiry carves out the claims not yet
recorded (each then charged at its worst case, `estimated`, under its own request id, and
corrected by a late true report) and gives the rest of the slice back to the windows.

A subject with no blocking budget gets a slice of zero at once: there is no ceiling to exhaust,
so its requests need no admission statement. Each still gets its own reservation row (0 holds on
the alert windows) when it is admitted, before the provider call (carving.ADMIT_UNBLOCKED_SQL):
a blocking budget created, or switched on, while it is in flight then carries its worst case into
the new window like any request's, and a request that read the budgets before that budget
committed is refused its row and admitted afresh against it.

Budget changes: the key of a slice is the subject and the exact (id, version) of every budget it
was admitted under, and the gateway reads the matching budgets for every request, so a created,
edited or deleted budget makes the next request use (or take) another slice. A window created for
such an edit carries the live slice's hold (ledger/windows.py) like any request in flight.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from core.guards import Guards
from ledger.admission import AdmissionRequest, Admitted, Ceiling, admit
from ledger.carving import (
    NOTIFY_CHANNEL,
    SLICE,
    Changed,
    admit_unblocked,
    give_back,
    notify_refused,
    parse_notification,
    recallable_room,
    slices_hold,
)
from ledger.errors import BudgetExceeded
from ledger.models import Budget, Reservation, unsaved
from ledger.periods import period_bounds
from ledger.scopes import CHARGED_COLUMNS
from ledger.slice_claims import claim, unclaim

log = logging.getLogger(__name__)

# Removal tests: tests/ledger/test_slices.py, tests/ledger/test_slice_recall.py,
# tests/gateway/test_slices_http.py.
GUARDS = Guards(
    check_available="a request is admitted from a slice only if the slice still holds its worst case",
    locked="a slice's check and its decrement happen under the book's lock",
    write_unblocked="a request from a slice of no blocking ceiling gets its own row at admission, so "
    "a cap created while it is in flight carries it",
    wait_for_recall="a refusal that live slices' holds on its window would cover waits for them to be "
    "given back, and is admitted",
    read_room_with_holds="whether a refusal is worth waiting for reads the window's room and its "
    "slices' holds in one snapshot (a give-back between two reads would refuse room that is free)",
)
# RACE_DELAY_SECONDS > 0 sleeps between a slice's check and its decrement (race tests only), so
# concurrent admissions overlap the way a missing lock would need every time.
RACE_DELAY_SECONDS = 0.0
# A refusal waits for recalled parts at most RECALL_WAIT_SECONDS, polling every
# RECALL_POLL_SECONDS (a give-back takes one statement per slice; each process's listener does it
# within milliseconds of the NOTIFY).
RECALL_WAIT_SECONDS = 1.0
RECALL_POLL_SECONDS = 0.02
# A request finding its key's slice being taken waits for it, at most this long a round.
TAKE_ROUNDS = 3
TAKE_WAIT_SECONDS = 1.0
NOTIFY_INTERVAL_SECONDS = 0.1
# The per-key room hints and per-window notification times kept at most (a hint lost costs one
# admission alone for that key, a notification time one extra NOTIFY).
MAX_KEYS = 10_000


@dataclass
class Slice:
    id: uuid.UUID
    key: tuple
    window_ids: frozenset[int]
    blocking: bool  # False: no blocking ceiling, so it admits any number of requests
    available: int  # nano-USD not yet given to a request
    until: float  # time.monotonic() after which it admits nothing
    created_at: datetime
    period_end: datetime | None
    outstanding: int = 0  # given to requests whose records are not written yet
    in_flight: int = 0  # requests admitted and not settled
    retired: bool = False
    ceilings: list[Ceiling] = field(default_factory=list)

    def live(self, now: datetime) -> bool:
        return not self.retired and time.monotonic() < self.until and (self.period_end is None or now < self.period_end)


@dataclass
class _Return:
    slice_id: uuid.UUID
    amount_nano: int
    close: bool


def _key(request: AdmissionRequest, budgets: Sequence[Budget]) -> tuple:
    """Who owns the slice, who it charges, and every budget (version, mode and amount) it was taken under: an edit
    of any of them makes the next request take another slice."""
    subject = tuple(getattr(request.subject, c) for c in CHARGED_COLUMNS)
    return (request.owner_id, subject, tuple(sorted((b.id, b.version, b.mode, b.amount_nano) for b in budgets)))


class Book:
    """One gateway process's slices. Admission threads take from it; the event loop settles
    records and gives unused parts back (gateway/upstream/runtime.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[tuple, Slice] = {}  # the one slice of each key that admits
        self._all: dict[uuid.UUID, Slice] = {}  # every slice not yet closed
        self._returns: list[_Return] = []
        self._room: dict[tuple, int] = {}  # each key's tightest room after its last admission
        self._taking: dict[tuple, threading.Event] = {}  # keys whose next slice is being taken
        self._notified: dict[int, float] = {}  # window id -> when this process last notified
        self._giving = threading.Lock()  # one thread writes returns at a time, in their order
        self.processes = 1  # live gateway processes (the heartbeat updates it)
        self.admitted_from_slices = 0
        self.slices_taken = 0

    # Admission (admission threads) ------------------------------------------------------

    def admit(self, request: AdmissionRequest) -> Admitted:
        """Admit from this subject's slice in memory, or take a new slice, or admit the request
        alone (first request of a key, near the cap, inside a transaction, or slices off)."""
        budgets = list(request.budgets or [])
        if request.budgets is None or not settings.CAPGATE["SLICES"] or request.owner_id is None:
            return admit(request=request)
        if connection.in_atomic_block:  # a run's first call: its budget may still roll back
            return admit(request=request)
        key = _key(request, budgets)
        now = request.now or timezone.now()
        taken: Admitted | None = None
        mine: threading.Event | None = None  # set: this thread takes the key's next slice
        lock = self._lock if GUARDS.locked else nullcontext()
        # One thread per key takes the next slice; the others wait for it (a burst on a cold
        # key would otherwise take one slice per thread, or fall back to one admission each).
        for _round in range(TAKE_ROUNDS):
            with lock:
                found = self._slices.get(key)
                if found is not None and found.live(now) and self._fits(found, request.worst_nano):
                    taken = self._take(found, request, now)
                    break
                if found is not None:
                    self._retire(found)
                taking = self._taking.get(key)
                if taking is None:
                    mine = self._taking[key] = threading.Event()
                    break
            taking.wait(timeout=TAKE_WAIT_SECONDS)
        else:
            return self._alone(key, request)
        if mine is not None:
            try:
                size = self._size(key, request, budgets)
                if size is None:
                    return self._alone(key, request)
                taken = self._new_slice(key, request, budgets, size, now)
            finally:
                with self._lock:
                    self._taking.pop(key, None)
                mine.set()
        assert taken is not None
        return self._written(taken, request)

    def _written(self, admitted: Admitted, request: AdmissionRequest) -> Admitted:
        """A request from a slice of no blocking ceiling gets its row now, before the provider
        call (ledger/carving.py ADMIT_UNBLOCKED_SQL): the slice reserved nothing that a cap
        created meanwhile could carry, so each request in flight must be visible on its own. If
        the row is refused (a blocking budget appeared, or the slice was charged by expiry), the
        slice admits no more and the request is admitted afresh."""
        reservation = admitted.reservation
        if reservation.slice_id is None or reservation.amount_nano == 0:
            return admitted
        with self._lock:
            s = self._all.get(reservation.slice_id)
            blocking = s is None or s.blocking
        if blocking:  # carved from its slice with its record; its claim says it is in flight
            return self._claimed(admitted, request)
        if not GUARDS.write_unblocked:
            return admitted
        if admit_unblocked(reservation=reservation):
            reservation.carved = True
            return admitted
        with self._lock:
            s = self._all.get(reservation.slice_id)
            if s is not None:
                self._retire(s)
        self.settled(reservation)
        fresh = replace(request, budgets=None)  # read the budgets again: one of them is new
        try:
            return admit(request=fresh)
        except BudgetExceeded as exc:
            self._refused(exc)
            raise

    def _claimed(self, admitted: Admitted, request: AdmissionRequest) -> Admitted:
        """A request from a slice of a blocking ceiling writes its claim before the provider call
        (ledger/slice_claims.py), so a crash charges the slice only what is in flight. If the
        slice was fenced for this process's death meanwhile, it admits no more; the request
        goes on if expiry carved its claim (it has its own reservation), else is admitted afresh."""
        reservation = admitted.reservation
        if claim(reservation=reservation):
            return admitted
        log.warning("slice %s was taken from this process by expiry: no longer admitting from it", reservation.slice_id)
        with self._lock:
            s = self._all.get(reservation.slice_id) if reservation.slice_id is not None else None
            if s is not None:
                self._retire(s)
        if unclaim(reservation=reservation):
            reservation.carved = True
            return admitted
        self.settled(reservation)
        try:
            return admit(request=replace(request, budgets=None))
        except BudgetExceeded as exc:
            self._refused(exc)
            raise

    def _alone(self, key: tuple, request: AdmissionRequest) -> Admitted:
        """One admission statement for this request alone; a refusal recalls slices.

        A refusal on a window where live slices hold enough to cover the request (their unused
        parts, say, carried into a window created mid-life) is not final: the slices are
        recalled, and the request is admitted again once their parts are back, for at most
        RECALL_WAIT_SECONDS. So a request is refused only for room that requests really hold.
        """
        deadline: float | None = None
        while True:
            try:
                admitted = admit(request=request)
            except BudgetExceeded as exc:
                self._refused(exc)
                deadline = deadline if deadline is not None else time.monotonic() + RECALL_WAIT_SECONDS
                if not self._worth_waiting(exc, request.worst_nano, deadline):
                    raise
                time.sleep(RECALL_POLL_SECONDS)
                continue
            self._note_room(key, admitted.ceilings, request.worst_nano)
            return admitted

    def _worth_waiting(self, exc: BudgetExceeded, worst: int, deadline: float) -> bool:
        if not GUARDS.wait_for_recall or exc.window_id is None or time.monotonic() >= deadline:
            return False
        try:
            self.give_back_pending()  # this process's own recalled parts, now
            if not GUARDS.read_room_with_holds:
                return exc.remaining_nano + slices_hold(window_id=exc.window_id) >= worst
            return recallable_room(window_id=exc.window_id) >= worst
        except DatabaseError:
            log.warning("could not read what slices hold on window %s; refusing", exc.window_id)
            return False

    def _fits(self, s: Slice, worst: int) -> bool:
        if not s.blocking or not GUARDS.check_available:
            return True
        return s.available >= worst

    def _take(self, s: Slice, request: AdmissionRequest, now: datetime) -> Admitted:
        if RACE_DELAY_SECONDS:
            time.sleep(RACE_DELAY_SECONDS)
        worst = request.worst_nano
        if s.blocking:
            s.available -= worst
        s.outstanding += worst
        s.in_flight += 1
        self.admitted_from_slices += 1
        # Every field given (ledger.models.unsaved builds it without Model.__init__);
        # tests/ledger/test_slices.py checks it against the ORM's own instance.
        reservation = unsaved(
            Reservation,
            {
                **{c: getattr(request.subject, c) for c in CHARGED_COLUMNS},
                "id": uuid.uuid4(),
                "request_id": request.request_id,
                "model": request.model,
                "amount_nano": worst,
                "owner_id": request.owner_id,
                "created_at": now,
                "expires_at": now + (request.lease or settings.CAPGATE["LEASE"]),
                "deadline_at": now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
                "job_id": None,
                "origin": request.origin,
                "slice_id": s.id,
            },
        )
        reservation._state.adding = False
        reservation._state.db = "default"
        ceilings = list(s.ceilings)  # as the slice was taken (the caller only reads them)
        return Admitted(reservation=reservation, ceilings=ceilings)

    def _size(self, key: tuple, request: AdmissionRequest, budgets: Sequence[Budget]) -> int | None:
        """The slice to take for this key now, or None to admit the request alone."""
        if not any(b.mode == Budget.Mode.BLOCK for b in budgets):
            return 0  # no ceiling to exhaust: a slice of zero admits any number of requests
        room = self._room.get(key)
        worst = max(request.worst_nano, 1)
        if room is None:
            return None  # the key's first request: its admission tells how much room there is
        share = int(room * settings.CAPGATE["SLICE_SHARE"]) // max(self.processes, 1)
        size = min(share, settings.CAPGATE["SLICE_MAX_REQUESTS"] * worst)
        if size < settings.CAPGATE["SLICE_MIN_REQUESTS"] * worst:
            return None
        return size

    def _new_slice(
        self, key: tuple, request: AdmissionRequest, budgets: Sequence[Budget], size: int, now: datetime
    ) -> Admitted:
        blocking = any(b.mode == Budget.Mode.BLOCK for b in budgets)
        try:
            admitted = admit(
                request=replace(
                    request,
                    request_id=f"slice-{uuid.uuid4().hex}",
                    worst_nano=size,
                    origin=SLICE,
                    now=now,
                    lease=request.lease,
                )
            )
        except BudgetExceeded as exc:
            # The slice does not fit (others took room since): remember the room, admit alone.
            self._room[key] = max(exc.remaining_nano, 0)
            return self._alone(key, request)
        ends = [period_bounds(period=b.period, tz=b.timezone, now=now)[1] for b in budgets]
        ends_known = [e for e in ends if e is not None]
        s = Slice(
            id=admitted.reservation.id,
            key=key,
            window_ids=frozenset(c.window_id for c in admitted.ceilings),
            blocking=blocking,
            available=size,
            until=time.monotonic() + settings.CAPGATE["SLICE_SECONDS"],
            created_at=now,
            period_end=min(ends_known) if ends_known else None,
            ceilings=admitted.ceilings,
        )
        self._note_room(key, admitted.ceilings, size)
        with self._lock:
            old = self._slices.get(key)
            if old is not None:
                self._retire(old)
            self._slices[key] = s
            self._all[s.id] = s
            self.slices_taken += 1
            return self._take(s, request, now)  # the caller writes its row if `s` is not blocking

    def _note_room(self, key: tuple, ceilings: Sequence[Ceiling], reserved: int) -> None:
        if ceilings:
            if len(self._room) >= MAX_KEYS:  # many end customers: forget, never grow without bound
                self._room.clear()
            self._room[key] = max(min(c.remaining_nano for c in ceilings) - reserved, 0)

    def _refused(self, exc: BudgetExceeded) -> None:
        """A request was refused: give back this process's slices on that window, and ask the
        other processes to do the same (their unused parts are room the next requests need)."""
        self.recall([exc.window_id])
        now = time.monotonic()
        with self._lock:  # one notification per window per interval: a refusal storm sends few
            if now - self._notified.get(exc.window_id, -NOTIFY_INTERVAL_SECONDS) < NOTIFY_INTERVAL_SECONDS:
                return
            if len(self._notified) >= MAX_KEYS:
                self._notified.clear()
            self._notified[exc.window_id] = now
        try:
            notify_refused([exc.window_id])
        except Exception:  # a lost notification costs utilization, never the cap
            log.exception("could not notify other gateway processes of a refusal")

    # Settlement and returns (event loop / settle threads) -----------------------------------

    def settled(self, reservation: Reservation) -> None:
        """The request's record (and carve) is committed, or will never be."""
        if reservation.slice_id is None:
            return
        with self._lock:
            s = self._all.get(reservation.slice_id)
            if s is None:
                return
            s.outstanding -= reservation.amount_nano
            s.in_flight -= 1
            if s.retired and s.in_flight == 0:
                self._close(s)

    def on_notification(self, payload: str) -> int:
        """Act on a NOTIFY_CHANNEL payload (another process refused on a window, or a budget
        changed); returns how many slices it retired."""
        window_ids, changed = parse_notification(payload)
        return self.recall(window_ids) + sum(self.recall_subject(c) for c in changed)

    def recall_subject(self, changed: Changed) -> int:
        """Retire every slice charging the subject of a budget that changed."""
        org = CHARGED_COLUMNS.index("organization_id")
        col = None if changed.column is None else CHARGED_COLUMNS.index(changed.column)
        with self._lock:
            hit = [
                s
                for s in self._slices.values()
                if s.key[1][org] == changed.organization_id and (col is None or s.key[1][col] == changed.value)
            ]
            for s in hit:
                self._retire(s)
            return len(hit)

    def charged(self, slice_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """These slices' rows are gone without this process closing them: expiry settled them
        (their owner was taken for dead: ledger/slice_claims.py) or charged them whole (their
        hard deadline passed). Admit nothing more from them, at once, and give
        nothing back (there is nothing left to give). Returns, for each one this process had,
        the part it never gave to a request (ledger/charged_slices.py takes it off the charge)."""
        with self._lock:
            hit = [s for s in (self._all.pop(i, None) for i in slice_ids) if s is not None]
            unused = {s.id: max(s.available, 0) if s.blocking else 0 for s in hit}
            for s in hit:
                s.retired = True
                s.available = 0
                if self._slices.get(s.key) is s:
                    del self._slices[s.key]
            self._returns = [r for r in self._returns if r.slice_id not in unused]
        for s in hit:
            log.warning("slice %s was charged by expiry while this process used it: no longer admitting from it", s.id)
        return unused

    def recall(self, window_ids: Sequence[int]) -> int:
        """Retire every slice on any of these windows (a refusal there); returns how many."""
        wanted = set(window_ids)
        with self._lock:
            hit = [s for s in self._slices.values() if s.window_ids & wanted]
            for s in hit:
                self._retire(s)
            return len(hit)

    def retire_expired(self, now: datetime | None = None) -> None:
        now = now or timezone.now()
        with self._lock:
            for s in [s for s in self._slices.values() if not s.live(now)]:
                self._retire(s)

    def retire_all(self) -> None:
        with self._lock:
            for s in list(self._slices.values()):
                self._retire(s)

    def _retire(self, s: Slice) -> None:
        """Stop admitting from `s` (lock held); its unused part goes back."""
        if s.retired:
            return
        s.retired = True
        if self._slices.get(s.key) is s:
            del self._slices[s.key]
        if s.in_flight == 0:
            self._close(s)
        elif s.blocking and s.available > 0:
            self._returns.append(_Return(s.id, s.available, close=False))
            s.available = 0

    def _close(self, s: Slice) -> None:
        """Nothing of `s` is in flight any more (lock held): give back what it has left and
        delete it. A return of its unused part still queued is folded into this one, so the
        close can never run before it (and find the row not yet at its last amount)."""
        self._all.pop(s.id, None)
        amount = max(s.available, 0) if s.blocking else 0
        queued = [r for r in self._returns if r.slice_id == s.id]
        self._returns = [r for r in self._returns if r.slice_id != s.id]
        self._returns.append(_Return(s.id, amount + sum(r.amount_nano for r in queued), close=True))
        s.available = 0

    def has_returns(self) -> bool:
        return bool(self._returns)

    def pending_returns(self) -> list[_Return]:
        with self._lock:
            out, self._returns = self._returns, []
            return out

    def give_back_pending(self) -> int:
        """Write the pending returns, in order, one writer at a time (the gateway calls this from
        more than one settle thread). If one fails, it and every return after it go back to the
        front of the queue, in order, to be tried again; the error is raised."""
        with self._giving:
            todo = self.pending_returns()
            for i, item in enumerate(todo):
                try:
                    give_back(slice_id=item.slice_id, amount_nano=item.amount_nano, close=item.close)
                except Exception:
                    with self._lock:
                        self._returns = todo[i:] + self._returns
                    raise
            return len(todo)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "slices": len(self._all),
                "admitting": len(self._slices),
                "available_nano": sum(s.available for s in self._slices.values() if s.blocking),
                "admitted_from_slices": self.admitted_from_slices,
                "slices_taken": self.slices_taken,
            }


book = Book()


__all__ = ["NOTIFY_CHANNEL", "SLICE", "Book", "Slice", "book", "give_back", "notify_refused"]
