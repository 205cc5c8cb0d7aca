"""Writes to the request log: the batched refusal insert and the retention sweep."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.retention import delete_expired
from ledger.models import Budget
from requestlog.buffer import DROPPED
from requestlog.models import Refusal
from tenants.models import ApiKey, EndCustomer

if TYPE_CHECKING:
    from requestlog.buffer import Pending

log = logging.getLogger("capgate.requestlog")


def write_refusals(*, items: Sequence[Pending]) -> int:
    """Insert noted refusals in one statement.

    1. Resolve who each was from its key (one query for the batch): organization, project,
       member. A key that matches nothing (an invalid key's 401) has no organization to file
       it under; those are counted, not written.
    2. Resolve customers by (project, external id), and drop references to budgets deleted
       since the refusal (one query each).
    3. INSERT ... ON CONFLICT (request_id) DO NOTHING, so a batch written twice (a retry after
       a timeout that did commit) is written once.
    4. If a subject was deleted between steps 1-2 and 3 (a foreign key refuses the batch),
       write the rows again with their optional references cleared.
    """

    keys = {
        k.key_hash: k
        for k in ApiKey.objects.filter(key_hash__in={i.key_hash for i in items}).only(
            "id", "key_hash", "organization_id", "project_id", "member_id"
        )
    }
    unknown = sum(1 for i in items if i.key_hash not in keys)
    if unknown:
        DROPPED.labels("no_organization").inc(unknown)
    known = [i for i in items if i.key_hash in keys]
    wanted = {(keys[i.key_hash].project_id, i.customer) for i in known if i.customer}
    customers = {
        (c.project_id, c.external_id): c.id
        for c in EndCustomer.objects.filter(
            project_id__in={p for p, _ in wanted}, external_id__in={e for _, e in wanted}
        ).only("id", "project_id", "external_id")
    }
    budgets = set(
        Budget.objects.filter(id__in={i.budget_id for i in known if i.budget_id}).values_list("id", flat=True)
    )
    rows = []
    for i in known:
        key = keys[i.key_hash]
        rows.append(
            Refusal(
                request_id=i.request_id,
                organization_id=key.organization_id,
                project_id=key.project_id,
                member_id=key.member_id,
                api_key_id=key.id,
                end_customer_id=customers.get((key.project_id, i.customer)),
                run_id=i.run_id,
                model=i.model,
                endpoint=i.endpoint,
                status=i.status,
                code=i.code,
                http_status=i.http_status,
                budget_id=i.budget_id if i.budget_id in budgets else None,
                reserved_nano=i.reserved_nano,
                latency_ms=i.latency_ms,
                message=i.message,
                created_at=i.at,
            )
        )
    if not rows:
        return 0
    try:
        with transaction.atomic():
            Refusal.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    except IntegrityError:
        for r in rows:
            r.project_id = r.member_id = r.api_key_id = r.end_customer_id = r.budget_id = None
        with transaction.atomic():  # an organization deleted meanwhile still refuses: its rows go with it
            Refusal.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    return len(rows)


def purge_expired(*, batch: int = 5000, max_batches: int = 200) -> int:
    """Delete refusal rows older than REQUEST_LOG_RETENTION_DAYS, `batch` rows per statement
    (short transactions, little WAL at a time, no long lock on the table), at most
    `max_batches` per run: a backlog is worked off over several runs instead of one long one.
    Two runs at once take disjoint rows (SKIP LOCKED). Returns how many rows were deleted.

    Usage records are not deleted here: they are the book of record (the audit sums them for
    lifetime windows, mid-period budgets are seeded from them)."""
    cutoff = timezone.now() - timedelta(days=settings.CAPGATE["REQUEST_LOG_RETENTION_DAYS"])
    return delete_expired(
        table="requestlog_refusal", age_column="created_at", cutoff=cutoff, batch=batch, max_batches=max_batches
    )
