"""An organization's bound on provider jobs live at once (CAPGATE_ORG_LIVE_JOBS), so that one
tenant's jobs cannot fill what beat polls and renews for every tenant.

A job counts before the provider sees it: its submission takes a slot (a JobSubmission row) first
(batches, message batches and videos before their admission; a background response once the
proxy has admitted it), and the slot becomes the Job row in start_job's transaction, or is given
back when the submission ends without a job (refused, failed upstream, finished at once): before
the answer for the first two, just after it for a background response's other endings.
Slots are taken under a per-organization advisory lock and counted with live jobs in one
statement, so submissions at the same moment never pass the bound. A slot a dead process left
stops counting once its reservation is gone (expiry charged it) and it is older than a lease."""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from core.guards import Guards
from gateway.http.errors import GatewayError
from jobs.models import Job, JobSubmission
from jobs.selectors import LIVE_STATES
from ledger.models import Reservation

# Removal test: tests/jobs/test_job_quotas.py.
GUARDS = Guards(
    serialize_slots="an organization's slots are counted and taken under its lock: concurrent submissions "
    "never pass the bound",
)

# pg_advisory_xact_lock(namespace, organization id): the namespace keeps these apart from other
# advisory locks (catalog/prices.py takes a one-key lock). It is taken alone, in a transaction of
# its own that holds no other lock, before admission locks any window: it adds nothing to the
# ledger's lock order (ledger/locks.py).
_LOCK_NAMESPACE = 0x6A6F6273  # "jobs"

_COUNT = f"""
SELECT (SELECT count(*) FROM {Job._meta.db_table} j
         WHERE j.organization_id = %(org)s AND j.state = ANY(%(live)s))
     + (SELECT count(*) FROM {JobSubmission._meta.db_table} s
         WHERE s.organization_id = %(org)s
           AND (s.created_at > %(stale)s
                OR EXISTS (SELECT 1 FROM {Reservation._meta.db_table} r WHERE r.request_id = s.request_id)))
"""


def take_slot(*, organization_id: int, request_id: str) -> None:
    """One of the organization's live-job slots for the submission `request_id`, or 429
    `too_many_live_jobs` with nothing taken.

    1. Lock the organization's slots (an advisory lock held to commit).
    2. Count its live jobs and the slots of submissions in flight, in one statement (one snapshot:
       a slot becoming a job between two counts would be missed by both).
    3. Refuse at the bound, else insert the slot; commit."""
    limit = settings.CAPGATE["ORG_LIVE_JOBS"]
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        if GUARDS.serialize_slots:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, organization_id])
        stale = now - settings.CAPGATE["LEASE"]
        cursor.execute(_COUNT, {"org": organization_id, "live": list(LIVE_STATES), "stale": stale})
        (taken,) = cursor.fetchone()
        if taken >= limit:
            raise GatewayError(
                f"This organization has {taken} provider jobs in progress, its limit ({limit}); submit more "
                "when some have finished.",
                code="too_many_live_jobs",
                status=429,
            )
        JobSubmission.objects.create(organization_id=organization_id, request_id=request_id, created_at=now)
        # Slots dead processes left, which count no more: gone, so the table stays small.
        JobSubmission.objects.filter(organization_id=organization_id, created_at__lte=stale).exclude(
            Exists(Reservation.objects.filter(request_id=OuterRef("request_id")))
        ).delete()


def give_back(*, request_id: str) -> None:
    """The slot is free: the submission ended without a job, or (in start_job's transaction) the
    job's row now counts instead. A no-op the second time."""
    JobSubmission.objects.filter(request_id=request_id).delete()
