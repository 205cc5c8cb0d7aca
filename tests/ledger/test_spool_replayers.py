"""Two replayers on one spool at once (the gateway's replay loop and the worker's, or two
gateways on a host): one replayer per file, every record counted once, no line written back
twice, and neither replayer fails — whether the database answers or not."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from ledger import spool
from ledger.drain import drain_all
from ledger.models import Reservation, UsageRecord, Window
from ledger.recording import Outcome
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db(transaction=True)
WORST, COST, N = 37_000_000, 12_000_000, 20


@pytest.fixture
def spooled(acme: Tenant, settings, tmp_path) -> list[str]:
    """N admitted requests whose records went to the spool (the database was down then)."""
    settings.CAPGATE = {**settings.CAPGATE, "DATA_DIR": tmp_path}
    acme.budget(amount="10", period="lifetime")
    ids = []
    for i in range(N):
        reservation = acme.admit(request_id=f"req-spooled-{i}", worst_nano=WORST).reservation
        spool.append(reservation=reservation, outcome=Outcome(status="served", cost_nano=COST))
        ids.append(reservation.request_id)
    return ids


@pytest.fixture
def widened(monkeypatch):
    # Each replayer waits 0.3 s between claiming a file and reading it: long enough that the
    # other, released at the same moment, always looks at the same files meanwhile.
    monkeypatch.setattr(spool, "RACE_DELAY_SECONDS", 0.3)


def _replayer() -> object:
    """One replay on this thread's own connection: what it returned or raised."""
    try:
        return spool.replay()
    except Exception as exc:  # reported to the test, which asserts on it
        return exc
    finally:
        connection.close()


@contextlib.contextmanager
def _database(*, down: bool) -> Iterator[None]:
    """New connections refused while `down` (a closed port, as when the database is down)."""
    settings = connections.settings["default"]
    saved = settings["PORT"]
    if down:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            settings["PORT"] = s.getsockname()[1]
    try:
        yield
    finally:
        settings["PORT"] = saved


def _replay_together(*, database_down: bool) -> list[object]:
    """Two replayers released together by a barrier, each on its own connection; returns what
    each returned or raised."""
    barrier = threading.Barrier(2)

    def replayer(_: int) -> object:
        barrier.wait()
        return _replayer()

    with _database(down=database_down), ThreadPoolExecutor(2) as pool:
        return list(pool.map(replayer, range(2)))


def _spooled_lines() -> Counter[str]:
    import json

    lines: Counter[str] = Counter()
    for path in spool.pending():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                lines[json.loads(line)["reservation"]["request_id"]] += 1
    return lines


def test_two_replayers_with_the_database_down_keep_each_record_once_on_disk(spooled, widened):
    # when: both replay the one spool file while the database refuses connections
    results = _replay_together(database_down=True)
    # then: neither failed, and every record is on disk exactly once, for the next replay
    assert results == [0, 0]
    assert _spooled_lines() == Counter({rid: 1 for rid in spooled})
    # and once the database is back, one replay lands them all once
    assert spool.replay() == N
    drain_all()
    assert UsageRecord.objects.count() == N and not spool.pending()
    assert not Reservation.objects.exists()
    assert Window.objects.get().spent_nano == N * COST


def test_two_replayers_with_the_database_up_land_each_record_once(spooled, widened):
    results = _replay_together(database_down=False)
    assert sorted(results) == [0, N]  # one replayer took the file, the other skipped it
    assert not spool.pending()
    drain_all()
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == sorted(spooled)
    assert Window.objects.get().spent_nano == N * COST


def _replay_while_one_holds_a_claim() -> list[object]:
    """One replayer claims the file (and waits, widened); a second starts once the claimed
    `replaying-*` file is there, as a replayer arriving mid-file does. The database is down, so
    each leaves what it read on disk. Returns what each returned or raised."""
    with _database(down=True), ThreadPoolExecutor(2) as pool:
        first = pool.submit(_replayer)
        deadline = time.monotonic() + 5
        while not list(spool.spool_dir().glob("replaying-*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert list(spool.spool_dir().glob("replaying-*.jsonl")), "the first replayer never claimed the file"
        second = pool.submit(_replayer)
        return [first.result(timeout=30), second.result(timeout=30)]


def test_a_replayer_arriving_mid_file_leaves_the_claimed_file_alone(spooled, widened):
    # when: a second replayer starts while the first holds its claimed file
    results = _replay_while_one_holds_a_claim()
    # then: it skipped the file; every record is on disk once
    assert results == [0, 0]
    assert _spooled_lines() == Counter({rid: 1 for rid in spooled})


def test_removal_without_the_claim_lock_two_replayers_share_a_file(spooled, widened, monkeypatch):
    # given: replayers that claim by rename alone, without holding a lock on the file
    monkeypatch.setattr(spool.GUARDS, "lock_claims", False)
    # when: the second starts while the first holds its claimed file
    results = _replay_while_one_holds_a_claim()
    # then: the second took the first's claimed file over (as one a dead replayer left): one
    # failed, or records were doubled
    failed = [r for r in results if isinstance(r, Exception)]
    doubled = [rid for rid, n in _spooled_lines().items() if n > 1]
    assert failed or doubled, (results, _spooled_lines())
