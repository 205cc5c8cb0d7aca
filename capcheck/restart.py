"""capcheck's db-restart scenario: PostgreSQL restarted mid-burst, then traffic after it.

Run only where the operator names the cluster it may restart (`--restart-db-cluster DIR`, a
cluster of scripts/pg-cluster.sh serving the gateway's database): never by default.

The first half of the requests goes at once with echo's delay; once they are admitted (each
one's reservation row, or with headroom slices a slice's row: the rest admit from it in memory)
the cluster is stopped (fast: connections cut), left down for `restart_seconds` and started. The
other half then goes one every 0.2 s. Beyond the four properties (the requests in flight
answered and recorded once, from the spool or memory), the books check that admission came back
within a second of the database (no 503 after that) and that no live process's headroom slice
was charged at worst case for the outage.

A request that reached admission only after the stop is refused 503 `budget_unavailable`
before the provider call, with no row: that is failing closed, so the scenario declares the
outage (`database_outage`) and the check allows it. The wait makes it rare without slices (every
burst request holds its row first); with slices, one still reading its budgets when the slice
row commits can meet the stop.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from capcheck.scenario import Scenario
from core.env import BASE_DIR
from ledger.models import Reservation

if TYPE_CHECKING:
    from capcheck.plan import Plan, Sent, Setup
    from ledger.models import UsageRecord

AFTER_INTERVAL_SECONDS = 0.2  # between the requests sent after the restart
BACK_WITHIN_SECONDS = 1.0  # admission must be back this long after the database


@dataclass
class _Restart:
    recovered_at: float = 0.0
    late: list[str] = field(default_factory=list)  # requests refused 503 after admission was due back


_runs: dict[int, _Restart] = {}  # organization id -> what its run measured


def cluster(command: str, plan: Plan) -> None:
    """scripts/pg-cluster.sh `command` on the plan's cluster (on the database's own port)."""
    port = str(settings.DATABASES["default"].get("PORT") or 5432)
    args = [plan.restart_db_cluster, port] if command == "start" else [plan.restart_db_cluster]
    subprocess.run(["bash", str(BASE_DIR / "scripts" / "pg-cluster.sh"), command, *args], check=True, timeout=120)


def _admitted(organization_id: int, burst: int, timeout: float) -> bool:
    """Whether, within `timeout`, every request of the burst held its reservation row, or a
    headroom slice's row was carved for them (the rest of the burst admits from it in memory)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        origins = Counter(Reservation.objects.filter(organization_id=organization_id).values_list("origin", flat=True))
        if origins[Reservation.Origin.SLICE] or origins[Reservation.Origin.GATEWAY] >= burst:
            return True
        time.sleep(0.01)
    return False


def _send(setup: Setup, plan: Plan, sent: list[Sent]) -> None:
    from capcheck.load import fire  # load imports the plan, which imports the scenarios

    measured = _runs[setup.organization.id] = _Restart()
    first, after = sent[: len(sent) // 2], sent[len(sent) // 2 :]
    burst = threading.Thread(target=fire, args=(setup, plan, first), name="capcheck-burst", daemon=True)
    burst.start()
    _admitted(setup.organization.id, len(first), timeout=10)  # restarted either way; the report says what was held
    connection.close()
    cluster("stop", plan)
    time.sleep(plan.restart_seconds)
    cluster("start", plan)
    measured.recovered_at = time.monotonic()
    for s in after:
        since = time.monotonic() - measured.recovered_at
        fire(setup, plan, [s])
        if s.status == 503 and since > BACK_WITHIN_SECONDS:
            measured.late.append(f"P2: request {s.index} got 503 '{s.code}' {since:.1f} s after the database was back")
        time.sleep(AFTER_INTERVAL_SECONDS)
    burst.join(timeout=plan.request_timeout)


def _books(setup: Setup, records: list[UsageRecord]) -> list[str]:
    measured = _runs.pop(setup.organization.id, None)
    if measured is None:
        return ["P2: the restart did not run"]
    slices = [
        f"P1: slice {r.request_id} of a live gateway process was charged {r.cost_nano} nano-USD at worst case"
        for r in records
        if r.request_id.startswith("slice-") and r.status == "estimated"
    ]
    return slices + measured.late


DB_RESTART = Scenario(name="db-restart", send=_send, books=_books, database_outage=True)
