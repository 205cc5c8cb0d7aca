"""Who pays for a request: its key, the end customer and run its headers name, and the rows
a first call creates for them (the end customer, its project's default customer cap, a run's
lifetime cap).

Refused means nothing written: those rows are created by `founding`, inside the transaction that
admits the request, so a request refused (402, 429, 400 from sizing) rolls them back with it.
Concurrent first calls of one new customer or run queue on the row's unique index: the first
commits it with its admission (or rolls it back with its refusal), and the others then find it,
or create it themselves.

Budgets are created through budgets.services.create_budget — validated and audited like any
other, the key as the actor. That work happens once, when the row is first needed; a request
whose customer or run already has its budget pays one indexed read for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from budgets.services import create_budget
from core.guards import Guards
from core.money import MoneyError, format_usd, usd_to_nano
from gateway.http.errors import GatewayError, bad_request
from ledger.admission import Subject, in_callers_transaction
from ledger.budget_cache import budgets_for
from ledger.errors import SubjectGone
from ledger.models import Budget
from ledger.windows import current_windows
from ratelimits.services import enforce_new_subjects
from tenants.audit import Actor
from tenants.models import ApiKey, EndCustomer

_EXTERNAL_ID = re.compile(r"^[\w.@:+\-]{1,200}$")
MAX_RUN_BUDGET_USD = Decimal("1000000")

# Removal tests: tests/gateway/test_first_sight.py, tests/jobs/test_other_jobs.py.
GUARDS = Guards(
    found_in_admission="a first call's new end customer, default cap and run budget are created in "
    "the transaction that admits it, so a refused call rolls them back",
)


def key_actor(key: ApiKey) -> Actor:
    """The audit log's name for a change an API key's request made."""
    return Actor(label=f"key {key.name} ({key.prefix}…)")


@dataclass(frozen=True)
class Payer:
    """Who a request is charged to, resolved from its key and headers."""

    key: ApiKey
    customer: EndCustomer | None = None
    run_id: str | None = None
    new_run_nano: int | None = None  # the run's budget, to create with its first admission
    run_amount_explicit: bool = False  # the amount came from X-Capgate-Run-Budget-Usd
    new_customer: str | None = None  # an end customer's external id, to create with its first admission
    customer_default: bool = False  # the customer's project default cap, to create with this admission

    @property
    def founds(self) -> bool:
        """Its admission creates rows (a customer, a default cap, a run budget): see `founding`."""
        return self.new_run_nano is not None or self.new_customer is not None or self.customer_default

    @property
    def subject(self) -> Subject:
        key = self.key
        return Subject(
            organization_id=key.organization_id,
            project_id=key.project_id,
            member_id=key.member_id,
            api_key_id=key.id,
            end_customer_id=self.customer.id if self.customer else None,
            run_id=self.run_id,
        )


def payer(*, key: ApiKey, customer_id: str | None, run_id: str | None, run_budget_usd: str | None) -> Payer:
    """Validate the customer and run headers and resolve who pays. Nothing is written here: a new
    end customer, its project's default cap and a run's budget are created by `founding`, with
    the request's admission."""
    customer, new_customer, customer_default = end_customer(key=key, external_id=customer_id)
    new_run_nano = run_budget(key=key, run_id=run_id, amount_usd=run_budget_usd, customer=customer)
    return Payer(
        key=key,
        customer=customer,
        run_id=run_id,
        new_run_nano=new_run_nano,
        run_amount_explicit=run_budget_usd is not None,
        new_customer=new_customer,
        customer_default=customer_default,
    )


def end_customer(*, key: ApiKey, external_id: str | None) -> tuple[EndCustomer | None, str | None, bool]:
    """The end customer named by X-Capgate-Customer, read: (the customer or None, the external
    id to create it under when it is new, whether its project's default cap is still to create)."""
    if external_id is None:
        return None, None, False
    if not _EXTERNAL_ID.match(external_id):
        raise bad_request(
            "X-Capgate-Customer must be 1-200 letters, digits or . _ @ : + -",
            code="invalid_customer",
        )
    customer = EndCustomer.objects.filter(project_id=key.project_id, external_id=external_id).first()
    has_default = key.project.default_customer_budget_nano is not None
    if customer is None:
        return None, external_id, has_default
    return customer, None, has_default and not Budget.objects.filter(end_customer=customer).exists()


def _default_customer_budget(*, key: ApiKey, customer: EndCustomer) -> None:
    """A project's default customer cap, materialised as the customer's own budget the first
    time it is needed; inside the admitting transaction."""
    project = key.project
    with transaction.atomic(savepoint=False):
        # Serialise racing first requests of one customer on its row: one default budget.
        EndCustomer.objects.select_for_update().get(pk=customer.pk)
        if project.default_customer_budget_nano is None or Budget.objects.filter(end_customer=customer).exists():
            return
        create_budget(
            organization=key.organization,
            actor=key_actor(key),
            scope=Budget.Scope.END_CUSTOMER,
            end_customer=customer,
            name="project default customer cap",
            period=project.default_customer_budget_period,
            mode=project.default_customer_budget_mode,
            amount_nano=project.default_customer_budget_nano,
            first_sight=True,
        )


def run_budget(
    *, key: ApiKey, run_id: str | None, amount_usd: str | None, customer: EndCustomer | None = None
) -> int | None:
    """Validate a run's headers. Returns the amount of the lifetime budget the run still needs
    (created by `create_run_budget` in the same transaction as its first admission, so a refused
    first call leaves no budget behind), or None when it has one or needs none. A later call
    with a different amount is a 409."""
    if run_id is None:
        if amount_usd is not None:
            raise bad_request("X-Capgate-Run-Budget-Usd needs X-Capgate-Run.", code="invalid_run")
        return None
    if not _EXTERNAL_ID.match(run_id):
        raise bad_request("X-Capgate-Run must be 1-200 letters, digits or . _ @ : + -", code="invalid_run")
    if amount_usd is None:
        amount_nano = key.organization.default_run_budget_nano
        if amount_nano is None:
            return None  # a run label without a cap
    else:
        try:
            amount_nano = usd_to_nano(amount_usd, maximum=MAX_RUN_BUDGET_USD)
        except MoneyError as exc:
            raise bad_request(f"X-Capgate-Run-Budget-Usd {exc.message}.", code="invalid_run_budget") from None
        if amount_nano == 0:
            raise bad_request("X-Capgate-Run-Budget-Usd must be more than 0.", code="invalid_run_budget")
    # Read with the request's other budgets, through the process's budget cache (the admission
    # reads the same list next): a run's later calls cost no statement of their own.
    subject = Payer(key=key, customer=customer, run_id=run_id).subject
    existing = next(
        (b for b in budgets_for(subject) if b.scope == Budget.Scope.RUN and b.run_id == run_id),
        None,
    )
    if existing is None:
        return amount_nano
    _check_run_amount(existing, run_id=run_id, amount_nano=amount_nano if amount_usd is not None else None)
    return None


def _check_run_amount(existing: Budget, *, run_id: str, amount_nano: int | None) -> None:
    if amount_nano is not None and existing.amount_nano != amount_nano:
        raise GatewayError(
            f"Run '{run_id}' already has a budget of {format_usd(existing.amount_nano)}; "
            f"a different amount ({format_usd(amount_nano)}) cannot be set by a later call.",
            code="run_budget_conflict",
            status=409,
        )


def create_run_budget(*, key: ApiKey, run_id: str, amount_nano: int, explicit: bool) -> None:
    """Create a run's lifetime budget; call inside the transaction that admits its first call.
    A concurrent first call waits on the unique index, then finds this one and compares."""
    try:
        with transaction.atomic():
            create_budget(
                organization=key.organization,
                actor=key_actor(key),
                scope=Budget.Scope.RUN,
                run_id=run_id,
                period=Budget.Period.LIFETIME,
                mode=Budget.Mode.BLOCK,
                amount_nano=amount_nano,
                name=f"run {run_id}",
                first_sight=True,
            )
    except IntegrityError:  # a concurrent first call created it: compare with that one
        existing = Budget.objects.get(organization_id=key.organization_id, scope=Budget.Scope.RUN, run_id=run_id)
        _check_run_amount(existing, run_id=run_id, amount_nano=amount_nano if explicit else None)


@contextmanager
def founding(who: Payer) -> Iterator[Payer]:
    """Admit inside this, as the payer it gives. For a first call (a new end customer, its
    project's default cap, or a run's budget still to create) it is one transaction that creates
    them and then admits, so a refused first call leaves no row behind; any other call gets no
    transaction of its own. Before it, the key's limits on new runs and new end customers a
    minute (ratelimits.services.enforce_new_subjects): over them, 429 and nothing written.

    1. The end customer (get_or_create: a concurrent first call of the same customer waits on the
       unique index, then finds the committed row, or creates it if that call was refused).
    2. Its project's default cap, under the customer's row lock (one budget however many race).
    3. The run's budget (a concurrent first call waits on its unique index, then compares).
    """
    if not who.founds:
        yield who
        return
    key = who.key
    # Rows a key may make a minute: a flood of new ids is 429 before anything is written.
    enforce_new_subjects(key=key, runs=int(who.new_run_nano is not None), customers=int(who.new_customer is not None))
    # The windows of the budgets that already apply are created before the transaction: they are
    # no first call's to undo, a refusal's alert names one of them (alerts.note_refusal), and an
    # admission inside a transaction creates none (ledger.errors.AdmitAgain says why).
    standing = budgets_for(who.subject)
    current_windows(budgets=standing, now=timezone.now())
    atomic = transaction.atomic() if GUARDS.found_in_admission else nullcontext()
    try:
        with atomic, in_callers_transaction():
            customer, created = who.customer, False
            if who.new_customer is not None:
                customer, created = EndCustomer.objects.get_or_create(
                    project_id=key.project_id, external_id=who.new_customer
                )
            if customer is not None and who.customer_default:
                _default_customer_budget(key=key, customer=customer)
            who = replace(who, customer=customer, new_customer=None, customer_default=False)
            if who.new_run_nano is not None:
                assert who.run_id is not None
                create_run_budget(
                    key=key, run_id=who.run_id, amount_nano=who.new_run_nano, explicit=who.run_amount_explicit
                )
            # The windows of the budgets this transaction created (no other can see them yet); a
            # customer it created has no request in flight, so its cap's window locks nothing.
            known = {b.id for b in standing}
            founded = [b for b in budgets_for(who.subject) if b.id not in known]
            current_windows(budgets=founded, now=timezone.now(), new_subjects=created)
            yield who
    except IntegrityError as exc:
        # Its foreign keys are checked at commit: a customer found (created by a concurrent first
        # call) and deleted before this commit leaves the admission charged to no one.
        if getattr(exc.__cause__, "sqlstate", None) != "23503":
            raise
        raise SubjectGone("Who the request is charged to was deleted while it was admitted.") from exc
