"""Writes on budgets: create, edit, delete — validated and audited.

An edit takes effect for every request that arrives after it returns: gateway processes cache
budget definitions (ledger/budget_cache.py), and each write waits out their lease after it
commits (`_wait_out_caches`) before returning. Scope and subject are fixed once created: a
window's counters belong to the subject they were counted for, so moving a budget to another
subject would carry the wrong spend.
"""

from __future__ import annotations

import time
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import OperationalError, transaction
from django.utils import timezone

from core.errors import InvalidChange
from core.guards import Guards
from core.invalidation import lease
from core.money import MAX_AMOUNT_NANO, MAX_AMOUNT_USD
from ledger import windows as ledger_windows
from ledger.carving import notify_budgets_changed
from ledger.instances import alive_ids
from ledger.locks import budget_for_update
from ledger.models import Budget
from ledger.scopes import SCOPES, SUBJECT_COLUMNS
from tenants.audit import Actor, audit, save_changes, snapshot
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project

# The subject field each scope names (run budgets name a run id, not a row): ledger/scopes.py.
SUBJECT_FIELD = {Budget.Scope(s.name): s.column for s in SCOPES}
SUBJECT_FIELDS = SUBJECT_COLUMNS
# Changing one of these starts a new version of the budget (see update_budget).
VERSIONED_FIELDS = ("period", "timezone", "mode")
EDITABLE_FIELDS = ("name", "period", "timezone", "mode", "amount_nano", "thresholds", "recipients")
AUDITED_FIELDS = ("name", "scope", *SUBJECT_FIELDS, *EDITABLE_FIELDS)

# Removal test: tests/gateway/test_cache_notices.py.
GUARDS = Guards(
    wait_out_cache_lease="a budget write returns only once the gateway processes' cache lease has "
    "passed since it committed",
)


def _wait_out_caches() -> None:
    """Run once a budget write committed: return only after CACHE_LEASE_SECONDS, while any gateway
    process is alive and the deployment caches budgets (CAPGATE_CACHE_NOTIFY, the same in every
    process). By then each process has handled the write's notice or stopped trusting its cached
    budgets (ledger/budget_cache.py), so no request that arrives after this returns is admitted
    against the budgets from before the write."""
    if not GUARDS.wait_out_cache_lease or not settings.CAPGATE["CACHE_NOTIFY"]:
        return
    if not alive_ids(grace=settings.CAPGATE["HEARTBEAT_GRACE"]):
        return
    time.sleep(lease())


def _announce(budget: Budget, *, wait: bool = True) -> None:
    """Inside the writing transaction: tell the slice owners at commit, and wait out the caches
    after it (once per transaction, however many budgets it writes)."""
    notify_budgets_changed(budget=budget)  # sent at commit
    if not wait:
        return
    pending = transaction.get_connection().run_on_commit
    if not any(callback is _wait_out_caches for _sids, callback, _robust in pending):
        transaction.on_commit(_wait_out_caches)


def _check_subject(organization: Organization, scope: str, subject: dict[str, Any]) -> None:
    if scope not in Budget.Scope.values:
        raise InvalidChange(f"Scope must be one of {', '.join(Budget.Scope.values)}.", param="scope")
    wanted = SUBJECT_FIELD[Budget.Scope(scope)]
    for field in SUBJECT_FIELDS:
        value: Any = subject.get(field)
        if field == wanted and value in (None, ""):
            raise InvalidChange(f"A {scope} budget names its {field.replace('_', ' ')}.", param=field)
        if field != wanted and value not in (None, ""):
            raise InvalidChange(f"A {scope} budget does not name a {field.replace('_', ' ')}.", param=field)
    value = subject.get(wanted) if wanted else None
    owner_org_id = {
        Project: lambda v: v.organization_id,
        Member: lambda v: v.organization_id,
        ApiKey: lambda v: v.organization_id,
        EndCustomer: lambda v: v.project.organization_id,
    }.get(type(value))
    if owner_org_id is not None and owner_org_id(value) != organization.id:
        assert wanted is not None  # value is an object only when the scope names one
        raise InvalidChange(f"No such {wanted.replace('_', ' ')}.", param=wanted)


def _check_fields(fields: dict[str, Any]) -> None:
    if "period" in fields and fields["period"] not in Budget.Period.values:
        raise InvalidChange(f"Period must be one of {', '.join(Budget.Period.values)}.", param="period")
    if "mode" in fields and fields["mode"] not in Budget.Mode.values:
        raise InvalidChange("Mode must be alert or block.", param="mode")
    if "timezone" in fields:
        try:
            ZoneInfo(str(fields["timezone"]))
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidChange(f"Unknown timezone {fields['timezone']!r}.", param="timezone") from exc
    if "amount_nano" in fields:
        amount = fields["amount_nano"]
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 <= amount <= MAX_AMOUNT_NANO:
            raise InvalidChange(f"Amount must be between 0 and {MAX_AMOUNT_USD:,} USD.", param="amount_usd")
    if "thresholds" in fields:
        t = fields["thresholds"]
        if (
            not isinstance(t, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1000 for x in t)
            or len(set(t)) != len(t)
        ):
            raise InvalidChange("Distinct whole percentages from 1 to 1000.", param="thresholds")
        fields["thresholds"] = sorted(t)
    if "recipients" in fields:
        r = fields["recipients"]
        if not isinstance(r, list):
            raise InvalidChange("A list of email addresses.", param="recipients")
        for email in r:
            try:
                validate_email(email)
            except DjangoValidationError as exc:
                raise InvalidChange(f"{email!r} is not an email address.", param="recipients") from exc
    if "name" in fields and len(fields["name"] or "") > 200:
        raise InvalidChange("At most 200 characters.", param="name")


def create_budget(
    *, organization: Organization, actor: Actor, scope: str, amount_nano: int, first_sight: bool = False, **fields: Any
) -> Budget:
    """Validate scope/subject and fields, create the budget, audit it.

    Its first window is created by the next admission, starting with the period's recorded spend.
    `first_sight`: created by the gateway for a run or end customer on its first call, inside that
    call's admission; it does not wait out the caches (the subject is new to every process, and a
    request must not wait a lease; the write's notice still reaches them).
    """
    subject = {f: fields.pop(f, None) for f in SUBJECT_FIELDS}
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
    _check_subject(organization, scope, subject)
    fields["amount_nano"] = amount_nano
    _check_fields(fields)
    with transaction.atomic():
        budget = Budget.objects.create(
            organization=organization,
            scope=scope,
            **{k: v for k, v in subject.items() if v not in (None, "")},
            **fields,
        )
        _announce(budget, wait=not first_sight)
    audit(
        organization=organization,
        actor=actor,
        action="create",
        obj=budget,
        changes={k: [None, v] for k, v in snapshot(budget, AUDITED_FIELDS).items() if v not in (None, "")},
    )
    return budget


def update_budget(*, budget: Budget, actor: Actor, **fields: Any) -> dict[str, list[Any]]:
    """Change editable fields; scope and subject cannot change (see the module docstring).

    A new period, timezone or mode is a new version of the budget (decisions.md, 2026-12-01):
    1. Lock the budget row, then its current windows in id order (admissions in progress on
       them finish first; later ones wait).
    2. Retire those windows: an admission that read the old version and reaches them after this
       commits is refused by its own statement and reads the budget again.
    3. Bump the version. The next admission creates the new version's window with the period's
       whole truth: applied spend in the new range plus the holds of requests in flight.
    Amount, thresholds and the rest apply to the current window on the next request.
    """
    fixed = set(fields) & {"scope", *SUBJECT_FIELDS}
    for name in fixed:
        current = budget.scope if name == "scope" else getattr(budget, name)
        if fields[name] != current:
            raise InvalidChange("Scope and subject are fixed once created; create a new budget instead.", param=name)
        del fields[name]
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
    _check_fields(fields)
    with transaction.atomic():
        locked = Budget.objects.select_for_update().get(pk=budget.pk)
        if any(f in fields and fields[f] != getattr(locked, f) for f in VERSIONED_FIELDS):
            ledger_windows.retire(locked)
            budget.version = locked.version + 1
            budget.version_at = timezone.now()
            Budget.objects.filter(pk=budget.pk).update(version=budget.version, version_at=budget.version_at)
        _announce(budget)
        return save_changes(obj=budget, organization=budget.organization, actor=actor, fields=fields)


def delete_budget(*, budget: Budget, actor: Actor) -> None:
    """Delete the budget with its windows and holds; live reservations keep their other holds and
    settle as usual. A budget recreated for the same scope starts mid-life: its first window
    carries the period's applied spend and the holds of requests in flight (ledger/windows.py).

    1. Lock the budget row: a window being created for it finishes first, or is not created.
    2. Delete its holds, then lock its windows (FOR UPDATE, in id order) — holds before windows,
       the drain's order, so the two cannot deadlock. Admissions holding on a window finish
       first; later ones wait, then find it gone and read the budgets again.
    3. Delete the holds added meanwhile (steps 2-3: ledger.windows.release_budget), then the
       budget with its windows.
    A deadlock with some other writer is retried (twice).
    """
    for attempt in range(3):
        try:
            with transaction.atomic():
                budget_for_update(budget.pk)
                ledger_windows.release_budget(budget.pk)
                _announce(budget)
                audit(
                    organization=budget.organization,
                    actor=actor,
                    action="delete",
                    obj=budget,
                    changes={"amount_nano": [budget.amount_nano, None]},
                )
                budget.delete()
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "40P01" or attempt == 2:
                raise
