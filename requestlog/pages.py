"""Pages of the request log, newest first, each bounded by what it shows.

The log is the `requestlog_entry` view, a `UNION ALL` of two tables (requestlog/models.py).
Sorting that view and counting it cost the organization's whole history (PostgreSQL sorts
the union, it does not walk each branch's index under the LIMIT), so a page is read per side:
the newest `limit + 1` matching keys of the usage records and of the refusals, each one
ordered, LIMITed read of its own table along its (organization, time) index (or the index of
a narrower filter), merged here; then the page's rows from the view by request id. There is no
total: the one key more than the page tells whether there is another.

The order is total and deterministic: time descending, then usage before refusal at the same
time, then the row id descending. A `Cursor` is one row's place in it, (time, source, row id)
and the direction to read from there, passed as an opaque token (`encode`/`decode`); a page
read after it holds only rows strictly beyond it, so paging through a log that grows
meanwhile neither repeats nor skips a row that was there when the walk began. (A usage record
is written when its call ends, under its admission time: one written behind a walk's position
is seen by the next walk, not this one.)
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q

from ledger.models import UsageRecord
from requestlog.models import Refusal, RequestLogEntry
from tenants.models import EndCustomer, Organization

USAGE, REFUSAL = "usage", "refusal"
RANK = {REFUSAL: 0, USAGE: 1}  # at the same time, usage rows sort first (newest first)
STATUSES = {USAGE: frozenset(UsageRecord.Status.values), REFUSAL: frozenset(Refusal.Status.values)}
MAX_TOKEN = 200  # characters: a real token is about 90
MAX_ROW_ID = 2**63 - 1


class InvalidCursor(ValueError):
    """A cursor token that this module did not write."""


@dataclass(frozen=True)
class Cursor:
    at: datetime
    source: str
    row_id: int
    newer: bool = False  # read the rows newer than this one (the previous page), not older

    @classmethod
    def of(cls, entry: RequestLogEntry, *, newer: bool = False) -> Cursor:
        return cls(at=entry.at, source=entry.source, row_id=entry.row_id, newer=newer)

    def encode(self) -> str:
        raw = json.dumps([self.at.isoformat(), self.source, self.row_id, int(self.newer)], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        """The cursor `encode` wrote, else InvalidCursor."""
        if not token or len(token) > MAX_TOKEN or not token.isascii():
            raise InvalidCursor("The cursor is not valid.")
        try:
            at, source, row_id, newer = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            when = datetime.fromisoformat(at)
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
            raise InvalidCursor("The cursor is not valid.") from exc
        if (
            when.tzinfo is None
            or source not in RANK
            or type(row_id) is not int
            or not 0 <= row_id <= MAX_ROW_ID
            or newer not in (0, 1)
            or type(newer) is not int
        ):
            raise InvalidCursor("The cursor is not valid.")
        return cls(at=when, source=source, row_id=row_id, newer=bool(newer))


@dataclass(frozen=True)
class Page:
    rows: list[RequestLogEntry]  # newest first
    older: Cursor | None  # the next page's cursor, when there are older rows
    newer: Cursor | None  # the previous page's cursor, when the page was read past a cursor


@dataclass(frozen=True)
class Side:
    """One side of the log: its table and the column that is the view's `at`."""

    name: str
    model: type[models.Model]
    time: str


SIDES = (Side(USAGE, UsageRecord, "admitted_at"), Side(REFUSAL, Refusal, "created_at"))
# The request log's filters (requestlog/filters.py) that are one column of the same name on
# both tables, by the filter's name.
COLUMNS = {
    "request_id": "request_id",
    "run": "run_id",
    "status": "status",
    "model": "model",
    "project": "project",
    "api_key": "api_key",
}
FILTERS = frozenset(COLUMNS) | {"customer", "code", "since", "until"}


def customer_ids(*, organization: Organization, external_id: str) -> list[int]:
    """The ids of the organization's end customers of this external id (one per project)."""
    return list(
        EndCustomer.objects.filter(project__organization=organization, external_id=external_id).values_list(
            "id", flat=True
        )
    )


def _matching(side: Side, *, organization: Organization, filters: Mapping[str, Any]) -> Q | None:
    """The rows of `side` that the log's `filters` (a FilterSet's cleaned data) select, or None
    when none can: a status of the other side, or a refusal code (usage rows have none) —
    a condition no row meets would otherwise scan this side's whole history for nothing."""
    unknown = {name for name, value in filters.items() if value not in (None, "")} - FILTERS
    if unknown:
        raise TypeError(f"request log filters not read by pages: {sorted(unknown)}")
    if filters.get("status") and filters["status"] not in STATUSES[side.name]:
        return None
    q = Q(organization=organization)
    if filters.get("code"):
        if side.name == USAGE:
            return None
        q &= Q(code=filters["code"])
    for name, column in COLUMNS.items():
        if filters.get(name) not in (None, ""):
            q &= Q(**{column: filters[name]})
    if filters.get("customer"):
        q &= Q(end_customer_id__in=customer_ids(organization=organization, external_id=filters["customer"]))
    if filters.get("since"):
        q &= Q(**{f"{side.time}__gte": filters["since"]})
    if filters.get("until"):
        q &= Q(**{f"{side.time}__lt": filters["until"]})
    return q


def _beyond(side: Side, cursor: Cursor) -> Q:
    """The rows of `side` strictly beyond `cursor` in its direction. The bound on time alone
    (<= or >=) is its own condition, so it is an index condition, not a filter."""
    at, rank, theirs = side.time, RANK[side.name], RANK[cursor.source]
    if cursor.newer:
        if rank == theirs:
            return Q(**{f"{at}__gte": cursor.at}) & (
                Q(**{f"{at}__gt": cursor.at}) | Q(**{at: cursor.at, "id__gt": cursor.row_id})
            )
        return Q(**{f"{at}__gte" if rank > theirs else f"{at}__gt": cursor.at})
    if rank == theirs:
        return Q(**{f"{at}__lte": cursor.at}) & (
            Q(**{f"{at}__lt": cursor.at}) | Q(**{at: cursor.at, "id__lt": cursor.row_id})
        )
    return Q(**{f"{at}__lt" if rank > theirs else f"{at}__lte": cursor.at})


def side_keys(side: Side, *, matching: Q, cursor: Cursor | None, limit: int) -> list[tuple[datetime, int, int, str]]:
    """Up to `limit` rows of one side as (time, rank, row id, request id), nearest the cursor
    first (newest first without one): one ordered, LIMITed read of its own table."""
    newer = cursor is not None and cursor.newer
    qs = side.model._default_manager.filter(matching)
    if cursor is not None:
        qs = qs.filter(_beyond(side, cursor))
    order = (side.time, "id") if newer else (f"-{side.time}", "-id")
    rank = RANK[side.name]
    return [
        (at, rank, row_id, rid)
        for at, row_id, rid in qs.order_by(*order).values_list(side.time, "id", "request_id")[:limit]
    ]


def request_log_page(
    *, organization: Organization, filters: Mapping[str, Any], limit: int, cursor: Cursor | None = None
) -> Page:
    """One page of the organization's log: `limit` rows newest first that `filters` (the
    request log FilterSet's cleaned data) select, starting after `cursor` (or at the newest
    row). Two ordered reads of at most `limit + 1` keys, one per side, merged; then one read of
    the page's rows from the view by request id. A read of newer rows that reaches the newest
    answers the first page, so the top of the log is always a full page."""
    newer = cursor is not None and cursor.newer
    lists = []
    for side in SIDES:
        matching = _matching(side, organization=organization, filters=filters)
        if matching is not None:
            lists.append(side_keys(side, matching=matching, cursor=cursor, limit=limit + 1))
    merged = list(heapq.merge(*lists, reverse=not newer))
    keys, more = merged[:limit], len(merged) > limit
    if newer and not more:
        return request_log_page(organization=organization, filters=filters, limit=limit)
    if newer:
        keys.reverse()
    by_id = {
        e.request_id: e
        for e in RequestLogEntry.objects.filter(
            organization=organization, request_id__in=[k[3] for k in keys]
        ).select_related("project", "api_key", "end_customer")
    }
    rows = [by_id[k[3]] for k in keys if k[3] in by_id]  # a row deleted meanwhile is left out
    if newer:
        return Page(
            rows=rows,
            older=Cursor.of(rows[-1]) if rows else None,
            newer=Cursor.of(rows[0], newer=True) if rows else None,
        )
    return Page(
        rows=rows,
        older=Cursor.of(rows[-1]) if more and rows else None,
        newer=Cursor.of(rows[0], newer=True) if cursor is not None and rows else None,
    )
