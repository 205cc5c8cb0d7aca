"""Deleting a subject (project, member, key, end customer) while the gateway may be admitting a
request that names it: lock first, retry on a deadlock, keep its name on its usage records."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.db import IntegrityError, OperationalError, models, transaction

from core.guards import Guards
from tenants.signals import subject_deleting

# A deletion races the gateway: an admission inserting a reservation that names the subject takes
# a KEY SHARE lock on its row, and Django's delete collects the rows to SET NULL before deleting.
# Locking the subject rows first (FOR UPDATE) makes new admissions wait and then find it gone (503,
# nothing reserved); one that was already inserting finishes first and is collected. A deadlock
# with an admission holding the subject's budget windows aborts one side; the deletion retries.
DELETE_ATTEMPTS = 5
# Removal test: tests/tenants/test_delete_races.py.
GUARDS = Guards(
    lock_subjects_for_delete="a deletion locks the subject rows first, so an admission naming them "
    "waits and then finds them gone",
)


def deleting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a subject deletion in its own transaction, retried when a concurrent admission
    deadlocks it or slips a reference in."""

    @functools.wraps(fn)
    def run(**kwargs: Any) -> Any:
        for attempt in range(DELETE_ATTEMPTS):
            try:
                with transaction.atomic():
                    return fn(**kwargs)
            except (IntegrityError, OperationalError):
                if attempt == DELETE_ATTEMPTS - 1:
                    raise
        return None

    return run


def lock_for_delete(model: type[models.Model], pks: Iterable[int]) -> None:
    if GUARDS.lock_subjects_for_delete:
        list(
            model._default_manager.select_for_update()
            .filter(pk__in=list(pks))
            .order_by("pk")
            .values_list("pk", flat=True)
        )


def freeze_subject_name(*, organization_id: int, name: str, pk: int, label: str) -> None:
    """Have the subject's name written into the `subject` of its usage records before it is
    deleted (their foreign key then goes NULL; the id and name stay). The write is the ledger's
    (ledger.recording.freeze_subject_name, connected to `subject_deleting` in ledger/apps.py):
    tenants sits below it. It runs here, synchronously, inside the deletion's transaction.
    Records of requests still in flight get the name from the deletion's audit entry when they
    are written (ledger.recording)."""
    subject_deleting.send(sender=None, organization_id=organization_id, name=name, pk=pk, label=label)
