"""What-if admission engines for the admission benchmark (--whatif); not production code.

Same semantics as admit() for the benchmark's subjects (organization / project / key budgets,
all blocking, windows already created), written leaner ways to put numbers on the engine
suggestions in docs/performance.md. They pass the same counter checks as admit() after every
cell. The cache is per process, lives CACHE_TTL seconds and never past the period's end.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ledger.admission import Subject
from ledger.periods import period_bounds

_CACHE: dict[Subject, tuple[float, dt.datetime | None, list[int]]] = {}  # expires (monotonic), period end, window ids
CACHE_TTL = 5.0


def _raw_windows(cur, subject, now) -> tuple[list[int], dt.datetime | None, list[tuple]]:
    """matching_budgets() + current_windows() as two hand-written statements: window ids in id
    order, the earliest period end, and (window, budget, scope, amount, spent, reserved) rows."""
    cond, params = ["scope = 'organization'"], []
    for scope, value in (("project", subject.project_id), ("api_key", subject.api_key_id)):
        if value is not None:
            cond.append(f"({scope}_id = %s AND scope = %s)")
            params += [value, "key" if scope == "api_key" else scope]
    cur.execute(
        f"SELECT id, scope, period, timezone, amount_nano FROM budgets_budget WHERE ({' OR '.join(cond)}) "
        "AND organization_id = %s AND mode = 'block' ORDER BY id",
        [*params, subject.organization_id],
    )
    budgets = {bid: (scope, period, tz, amount) for bid, scope, period, tz, amount in cur.fetchall()}
    bounds = {bid: period_bounds(period=period, tz=tz, now=now) for bid, (_s, period, tz, _a) in budgets.items()}
    cur.execute(
        "SELECT w.id, w.budget_id, w.spent_nano, w.reserved_nano FROM budgets_window w "
        "JOIN unnest(%s::bigint[], %s::timestamptz[]) AS k(b, s) ON w.budget_id = k.b AND w.period_start = k.s "
        "ORDER BY w.id",
        [list(bounds), [start for start, _end in bounds.values()]],
    )
    rows = [(w, b, budgets[b][0], budgets[b][3], spent, reserved) for w, b, spent, reserved in cur.fetchall()]
    assert len(rows) == len(budgets), "what-if engines expect existing windows"
    ends = [end for _start, end in bounds.values() if end is not None]
    return [r[0] for r in rows], (min(ends) if ends else None), rows


def _cached_windows(cur, subject, now) -> list[int]:
    hit = _CACHE.get(subject)
    if hit and time.monotonic() < hit[0] and (hit[1] is None or now < hit[1]):
        return hit[2]
    ids, period_end, _rows = _raw_windows(cur, subject, now)
    _CACHE[subject] = (time.monotonic() + CACHE_TTL, period_end, ids)
    return ids


def _reservation_params(subject: Subject, request_id: str, worst: int, now: dt.datetime) -> list:
    return [
        uuid.uuid4(),
        request_id,
        subject.organization_id,
        subject.project_id,
        subject.api_key_id,
        worst,
        now,
        now + settings.CAPGATE["LEASE"],
        now + settings.CAPGATE["MAX_REQUEST_LIFETIME"],
    ]


class NoRoom(RuntimeError):
    """A what-if engine found a ceiling without room for the worst case. The bench's budgets are
    $1M and never refuse, so this is reported as an error of the cell; the engines do not copy
    admit()'s rule for which ceiling a refusal names."""


def _check_room(rows: list[tuple], worst: int) -> None:
    for window_id, _budget_id, scope, amount, spent, reserved in rows:
        if spent + reserved + worst > amount:
            raise NoRoom(
                f"what-if engine: no room on window {window_id} ({scope}): spent {spent} + reserved "
                f"{reserved} + worst {worst} > {amount}"
            )


# One statement, run in autocommit: lock the windows in id order, check room, add the worst case,
# insert the reservation and its holds, all or nothing; COMMIT happens inside the same round trip,
# so the row lock is never held across a client round trip (or a GIL wait).
ONE_STATEMENT = (
    "WITH l AS (SELECT w.id, w.budget_id, b.scope, b.amount_nano, w.spent_nano, w.reserved_nano, "
    "  w.spent_nano + w.reserved_nano + %(worst)s <= b.amount_nano AS fits "
    "  FROM budgets_window w JOIN budgets_budget b ON b.id = w.budget_id "
    "  WHERE w.id = ANY(%(ids)s) ORDER BY w.id FOR NO KEY UPDATE OF w), "
    "ok AS (SELECT count(*) = cardinality(%(ids)s::bigint[]) AND bool_and(fits) AS ok FROM l), "
    "u AS (UPDATE budgets_window w SET reserved_nano = w.reserved_nano + %(worst)s FROM ok "
    "  WHERE ok.ok AND w.id = ANY(%(ids)s) RETURNING w.id), "
    "r AS (INSERT INTO budgets_reservation (id, request_id, organization_id, project_id, member_id, api_key_id, "
    "  end_customer_id, run_id, model, amount_nano, owner_id, created_at, expires_at, deadline_at, job_id) "
    "  SELECT %(rid)s, %(request_id)s, %(org)s, %(project)s, NULL, %(key)s, NULL, NULL, '', %(worst)s, NULL, "
    "  %(now)s, %(expires)s, %(deadline)s, NULL FROM ok WHERE ok.ok RETURNING id), "
    "h AS (INSERT INTO budgets_hold (reservation_id, window_id, amount_nano) "
    "  SELECT r.id, x.w, %(worst)s FROM r, unnest(%(ids)s::bigint[]) AS x(w) RETURNING 1) "
    "SELECT l.id, l.budget_id, l.scope, l.amount_nano, l.spent_nano, l.reserved_nano, "
    "  (SELECT count(*) FROM u), (SELECT count(*) FROM h) FROM l ORDER BY l.id"
)


def _one_statement(cur, ids, subject, request_id: str, worst: int, now) -> None:
    rid, request_id, org, project, key, worst, now, expires, deadline = _reservation_params(
        subject, request_id, worst, now
    )
    cur.execute(
        ONE_STATEMENT,
        {
            "worst": worst,
            "ids": ids,
            "rid": rid,
            "request_id": request_id,
            "org": org,
            "project": project,
            "key": key,
            "now": now,
            "expires": expires,
            "deadline": deadline,
        },
    )
    rows = cur.fetchall()
    if not rows or len(rows) != len(ids) or rows[0][6] != len(ids):
        _check_room([r[:6] for r in rows], worst)
        raise RuntimeError(f"one-statement admission did not apply: {rows}")


def admit_raw_3rt(subject: Subject, request_id: str, worst: int) -> None:
    """admit()'s one-statement shape with hand-written SQL: two reads (+ the unlocked pre-check)
    and the admission statement — 3 round trips, no ORM."""
    now = timezone.now()
    with connection.cursor() as cur:
        ids, _end, rows = _raw_windows(cur, subject, now)
        _check_room(rows, worst)
        _one_statement(cur, ids, subject, request_id, worst, now)


def admit_cached_1rt(subject: Subject, request_id: str, worst: int) -> None:
    """Hand-written SQL, budgets/windows cached per process: the admission statement only."""
    now = timezone.now()
    with connection.cursor() as cur:
        _one_statement(cur, _cached_windows(cur, subject, now), subject, request_id, worst, now)


def admit_cached_6rt(subject: Subject, request_id: str, worst: int) -> None:
    """The classic transaction (BEGIN; reservation; holds; SELECT .. FOR NO KEY UPDATE; UPDATE;
    COMMIT) with hand-written SQL and the same cache: the lock is held across three client round
    trips. Against cached-1rt it isolates what holding the lock across round trips costs."""
    now = timezone.now()
    with connection.cursor() as cur:
        ids = _cached_windows(cur, subject, now)
        params = _reservation_params(subject, request_id, worst, now)
        with transaction.atomic():
            cur.execute(
                "INSERT INTO budgets_reservation (id, request_id, organization_id, project_id, member_id, api_key_id, "
                "end_customer_id, run_id, model, amount_nano, owner_id, created_at, expires_at, deadline_at, job_id) "
                "VALUES (%s, %s, %s, %s, NULL, %s, NULL, NULL, '', %s, NULL, %s, %s, %s, NULL)",
                params,
            )
            cur.execute(
                "INSERT INTO budgets_hold (reservation_id, window_id, amount_nano) "
                "SELECT %s, w, %s FROM unnest(%s::bigint[]) AS w",
                [params[0], worst, ids],
            )
            cur.execute(
                "SELECT w.id, w.budget_id, b.scope, b.amount_nano, w.spent_nano, w.reserved_nano FROM budgets_window w "
                "JOIN budgets_budget b ON b.id = w.budget_id WHERE w.id = ANY(%s) ORDER BY w.id FOR NO KEY UPDATE OF w",
                [ids],
            )
            _check_room(cur.fetchall(), worst)
            cur.execute(
                "UPDATE budgets_window SET reserved_nano = reserved_nano + %s WHERE id = ANY(%s)",
                [worst, ids],
            )


WHATIF: dict[str, Callable[[Subject, str, int], None]] = {
    "raw-3rt": admit_raw_3rt,
    "cached-1rt": admit_cached_1rt,
    "cached-6rt": admit_cached_6rt,
}
