"""The disk spool: usage records that could not reach the database, kept until they can.

Each record is one JSON line, appended and fsync'd before the gateway answers, so a record
is either in the outbox or on disk — never nowhere. `replay()` moves spooled records into the
outbox; inserting is idempotent by request id, so a replay interrupted half-way and run
again counts each record once, and a reservation that expired first (charged at worst case as
`estimated`) is corrected by its late record.

Only an unreachable database (OperationalError, InterfaceError) stops a replay to retry later.
A record the database refuses for any other reason would be refused forever: it goes to the
dead letter (`dead-*.jsonl`, each line the entry plus the error), is logged once, and is counted
on the dashboard and by `manage.py spool_status`. Nothing is retried forever.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import IO

from django.conf import settings
from django.db import InterfaceError, OperationalError

from catalog.pricing import Usage
from core.guards import Guards
from ledger.models import Reservation
from ledger.recording import Outcome, record
from ledger.scopes import CHARGED_COLUMNS

log = logging.getLogger(__name__)


def spool_dir() -> Path:
    path = Path(settings.CAPGATE["DATA_DIR"]) / "spool"
    path.mkdir(parents=True, exist_ok=True)
    return path


def append(*, reservation: Reservation, outcome: Outcome) -> Path:
    """Write one record durably (fsync) to this process's spool file."""
    line = (
        json.dumps(
            {
                "reservation": {
                    "id": str(reservation.id),
                    "request_id": reservation.request_id,
                    **{c: getattr(reservation, c) for c in CHARGED_COLUMNS},
                    "model": reservation.model,
                    "amount_nano": reservation.amount_nano,
                    "created_at": reservation.created_at.isoformat(),
                    # Admitted from a headroom slice: the replay carves it (ledger/slices.py).
                    "slice_id": str(reservation.slice_id) if reservation.slice_id is not None else None,
                },
                "outcome": {
                    "status": outcome.status,
                    "cost_nano": outcome.cost_nano,
                    "connection_id": outcome.connection_id,
                    "provider_model": outcome.provider_model,
                    "error": outcome.error,
                    "latency_ms": outcome.latency_ms,
                    "usage": vars(outcome.usage),
                },
            }
        )
        + "\n"
    )
    path = spool_dir() / f"spool-{os.getpid()}.jsonl"
    while True:
        with open(path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if not _still_at(fh, path):
                continue  # a replayer claimed the file between our open and our lock: a new one
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        return path


def _still_at(fh: IO[str], path: Path) -> bool:
    """Whether the open file is still the one at `path` (not renamed or deleted since)."""
    try:
        return os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def pending() -> list[Path]:
    return sorted(spool_dir().glob("spool-*.jsonl")) + sorted(spool_dir().glob("replaying-*.jsonl"))


# Test hook: seconds a replayer waits after claiming a file, before reading it (the replayer
# race tests widen the window in which a second replayer could take the same file).
RACE_DELAY_SECONDS = 0.0
# Removal test: tests/ledger/test_spool_replayers.py.
GUARDS = Guards(
    lock_claims="a replayer holds an exclusive lock on its spool file from claim to unlink, and takes "
    "a file only if it gets the lock at once: two replayers never share a file",
)


def replay() -> int:
    """Move every spooled record into the outbox; return how many were inserted or matched.

    One replayer per file: a replayer locks a file (flock, without waiting) before it claims it
    by renaming it, and keeps the lock until the file is gone, so a concurrent replayer skips it
    and a writer appending to it waits, then sees it was claimed and starts a new file. A
    `replaying-*` file left by a replayer that died has no lock, and is taken over. If the
    database fails mid-file, the unreplayed rest is written back for the next attempt.
    """
    moved = 0
    for path in sorted(spool_dir().glob("spool-*.jsonl")) + sorted(spool_dir().glob("replaying-*.jsonl")):
        claimed = _claim(path)
        if claimed is None:
            continue
        with claimed:
            if RACE_DELAY_SECONDS:
                time.sleep(RACE_DELAY_SECONDS)
            moved += _replay_file(claimed)
    return moved


def _claim(path: Path) -> _Claimed | None:
    """The file at `path`, locked and renamed to a `replaying-*` name of this replayer's own;
    None if it is gone or another replayer holds it."""
    try:
        fh = open(path, encoding="utf-8")
    except FileNotFoundError:
        return None  # another replayer finished it
    try:
        if GUARDS.lock_claims:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _still_at(fh, path):
                raise BlockingIOError("claimed and finished meanwhile")
        claimed = path.with_name(f"replaying-{uuid.uuid4().hex}.jsonl")
        path.rename(claimed)
    except (BlockingIOError, FileNotFoundError):
        fh.close()
        return None
    except BaseException:
        fh.close()
        raise
    return _Claimed(fh, claimed)  # the lock lasts as long as fh is open: until the file is gone


class _Claimed:
    """A claimed spool file, now at `path`, read through `fh` (which holds the lock)."""

    def __init__(self, fh: IO[str], path: Path) -> None:
        self.fh, self.path = fh, path

    def read(self) -> str:
        self.fh.seek(0)
        return self.fh.read()

    def __enter__(self) -> _Claimed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def _replay_file(claimed: _Claimed) -> int:
    path = claimed.path
    lines = [line for line in claimed.read().splitlines() if line.strip()]
    done = 0
    for i, line in enumerate(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            log.error("spool %s: unreadable line %d kept aside", path, i + 1)
            _write_rest(path.with_suffix(".bad"), [line])
            continue
        try:
            record(reservation=_reservation(entry["reservation"]), outcome=_outcome(entry["outcome"]))
        except (OperationalError, InterfaceError):
            log.warning("spool replay stopped at %s line %d: database unavailable", path, i + 1)
            # Written whole under a name no replayer looks for, then renamed into view.
            rest = path.with_name(f".rest-{uuid.uuid4().hex}.tmp")
            _write_rest(rest, lines[i:])
            rest.rename(path.with_name(f"spool-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"))
            path.unlink()
            return done
        except Exception as exc:  # refused for good (RecordRejected, bad data): dead letter
            log.error("spool %s line %d moved to the dead letter: %s", path, i + 1, exc)
            _write_rest(spool_dir() / f"dead-{os.getpid()}.jsonl", [json.dumps({**entry, "error": str(exc)})])
            continue
        done += 1
    path.unlink()
    return done


def dead_letter_count(*, organization_id: int | None = None) -> int:
    """Spooled records the database refused for good (see the module docstring), on this host;
    only one organization's when `organization_id` is given."""
    total = 0
    for path in sorted(spool_dir().glob("dead-*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                if organization_id is None:
                    total += 1
                    continue
                try:
                    org = json.loads(line)["reservation"]["organization_id"]
                except (ValueError, KeyError, TypeError):
                    continue
                total += org == organization_id
    return total


def _write_rest(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _reservation(data: dict) -> Reservation:
    reservation = Reservation(
        id=uuid.UUID(data["id"]),
        request_id=data["request_id"],
        # .get: a line spooled before a scope was added lacks its column (ledger/scopes.py).
        **{c: data.get(c) for c in CHARGED_COLUMNS},
        model=data["model"],
        amount_nano=data["amount_nano"],
        created_at=datetime.fromisoformat(data["created_at"]),
    )
    if data.get("slice_id"):
        reservation.slice_id = uuid.UUID(data["slice_id"])
    return reservation


def _outcome(data: dict) -> Outcome:
    return Outcome(
        status=data["status"],
        cost_nano=data["cost_nano"],
        usage=Usage(**data["usage"]),
        connection_id=data["connection_id"],
        provider_model=data["provider_model"],
        error=data["error"],
        latency_ms=data["latency_ms"],
    )
