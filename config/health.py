"""Liveness and readiness (GET /healthz, GET /readyz), for load balancers and orchestrators.

/healthz says the process answers and nothing else: it must not fail because the database
does, or an orchestrator would restart every gateway during a database outage (when they are
the ones refusing safely with 503 budget_unavailable and spooling usage).
/readyz says this process can do its job: the database answers, every migration is applied
(a process started against an old schema would fail on its first insert), and the spool
directory is writable (where usage goes when the database is down). The body names each
check and, for a failing one, the kind of failure — never a host, a path or a credential.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from ledger.spool import spool_dir

log = logging.getLogger("capgate.health")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


# Migrations do not un-apply under a running process: once seen applied, not read again.
_migrations_ok = False


def check_database() -> Check:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
        return Check("database", True)
    except DatabaseError as exc:
        log.warning("readyz: database check failed: %s", exc)
        return Check("database", False, "unreachable")


def check_migrations() -> Check:
    global _migrations_ok
    if _migrations_ok:
        return Check("migrations", True)
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError:
        return Check("migrations", False, "unknown: database unreachable")
    if plan:
        return Check("migrations", False, f"{len(plan)} unapplied")
    _migrations_ok = True
    return Check("migrations", True)


def check_spool() -> Check:
    try:
        probe = spool_dir() / f".readyz-{uuid.uuid4().hex}"
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
        return Check("spool", True)
    except OSError as exc:
        log.warning("readyz: spool not writable: %s", exc)
        return Check("spool", False, "not writable")


def readiness() -> tuple[int, dict]:
    """(200 or 503, the body). Every check runs, so a 503 names all that fail."""
    database = check_database()
    return _verdict(
        [
            database,
            check_migrations() if database.ok else Check("migrations", False, "unknown: database unreachable"),
            check_spool(),
        ]
    )


def unanswered(*, seconds: float) -> tuple[int, dict]:
    """The verdict when the database did not answer within `seconds` (it is away: a connect
    that hangs, or a pool waiting to reconnect): 503 naming it, without waiting any longer."""
    return _verdict(
        [
            Check("database", False, f"no answer within {seconds:g} s"),
            Check("migrations", False, "unknown: database unreachable"),
            check_spool(),
        ]
    )


def _verdict(checks: list[Check]) -> tuple[int, dict]:
    ok = all(c.ok for c in checks)
    body: dict[str, object] = {
        "status": "ready" if ok else "unavailable",
        "checks": {c.name: "ok" if c.ok else f"failing: {c.detail}" for c in checks},
    }
    if not ok:
        body["failing"] = [c.name for c in checks if not c.ok]
    return (200 if ok else 503), body
