"""Deleting history past its retention: short batches, each its own statement.

Every table that grows with traffic and is not the book of record (usage records are: the audit
sums them, mid-period budgets are seeded from them) has a retention setting and a beat task that
calls `delete_expired` for it. A batch is a few thousand rows picked through an index on the age
column, so each statement is short (little WAL at a time, no long lock), a backlog is worked off
over several runs instead of one long one, and two runs at once take disjoint rows (SKIP LOCKED).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import connection

log = logging.getLogger(__name__)


def delete_expired(
    *,
    table: str,
    age_column: str,
    cutoff: datetime,
    keep: str = "",
    params: Sequence[datetime | int | str] = (),
    dependents: Sequence[tuple[str, str]] = (),
    batch: int = 5000,
    max_batches: int = 200,
) -> int:
    """Delete the rows of `table` whose `age_column` is before `cutoff`, except those `keep` (an SQL
    condition over the row, alias `t`, with `params`) names, `batch` rows per statement and at most
    `max_batches` statements. `dependents` are (table, foreign key column) pairs whose rows go with
    a deleted row, in the same statement (the ORM's cascade, which raw SQL does not do; Django's
    foreign keys are checked at commit). Returns how many rows of `table` were deleted.

    `table`, `age_column`, `keep` and `dependents` are the caller's constants, never input."""
    spare = f"AND NOT ({keep})" if keep else ""
    cascade = "".join(
        f", gone_{n} AS (DELETE FROM {dep} WHERE {column} IN (SELECT id FROM doomed))"
        for n, (dep, column) in enumerate(dependents)
    )
    sql = f"""
        WITH doomed AS (
            SELECT t.id FROM {table} t WHERE t.{age_column} < %s {spare}
            ORDER BY t.{age_column} LIMIT %s FOR UPDATE OF t SKIP LOCKED){cascade}
        DELETE FROM {table} WHERE id IN (SELECT id FROM doomed)
    """  # noqa: S608 (the names are constants of the calling module)
    total = 0
    for _ in range(max_batches):
        with connection.cursor() as cursor:
            cursor.execute(sql, [cutoff, *params, batch])
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
    if total:
        log.info("retention: deleted %d rows of %s older than %s", total, table, cutoff.isoformat())
    return total
