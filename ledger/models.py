"""The ledger's rows: budgets, their per-period counter rows (windows), the reservations held
against them, the gateway processes that own reservations, and the book of record.

A blocking budget's current window is a *ceiling*. Admission reserves a request's worst case
on every ceiling it falls under (ledger/admission.py); the drain (ledger/drain.py) moves each
hold into `spent` once the request's actual cost is known. Each request outcome is one
UsageRecord; unapplied rows are the outbox the drain applies to the windows.

The tables keep the names of the apps that first created them (`budgets_*`, `usage_usagerecord`):
the models moved here in state only, so no row was copied.
"""

import operator
import uuid
from functools import reduce
from typing import Any, TypeVar

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.utils.timezone import now

from catalog.models import Connection
from ledger.scopes import SCOPES, refusal_code
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project


def default_thresholds() -> list[int]:
    return [50, 80, 100]


def _names_its_subject() -> Q:
    """A budget's scope names its subject: the broadest matches every request of the
    organization, each narrower one needs its subject column set."""
    return reduce(
        operator.or_,
        [
            Q(scope=s.name) if s.column is None else Q(scope=s.name, **{f"{s.column}__isnull": False})
            for s in reversed(SCOPES)
        ],
    )


class Budget(models.Model):
    # One choice per row of ledger/scopes.py, broadest first (tests/ledger/test_scopes.py).
    class Scope(models.TextChoices):
        ORGANIZATION = "organization"
        PROJECT = "project"
        MEMBER = "member"
        KEY = "key"
        END_CUSTOMER = "end_customer"
        RUN = "run"

    class Period(models.TextChoices):
        DAY = "day"
        WEEK = "week"
        MONTH = "month"
        LIFETIME = "lifetime"

    class Mode(models.TextChoices):
        ALERT = "alert"  # notifies, never refuses
        BLOCK = "block"  # refuses before the provider call

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="budgets")
    name = models.CharField(max_length=200, blank=True)
    scope = models.CharField(max_length=20, choices=Scope.choices)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets"
    )
    run_id = models.CharField(max_length=200, null=True, blank=True)
    period = models.CharField(max_length=10, choices=Period.choices, default=Period.MONTH)
    timezone = models.CharField(max_length=64, default="UTC")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.BLOCK)
    amount_nano = models.BigIntegerField()
    thresholds = models.JSONField(default=default_thresholds, blank=True)  # percent of amount
    recipients = models.JSONField(default=list, blank=True)  # empty: the organization's owners
    # Bumped when period, timezone or mode changes: windows belong to one version, so a new
    # configuration starts a fresh window that carries the period's whole truth (applied spend
    # plus live holds), and switching back never reuses a window that missed the spend between.
    version = models.PositiveIntegerField(default=1, db_default=1)
    # When the current version took effect (creation or the last such edit). A window whose
    # period started before it is created mid-life and carries in-flight holds.
    version_at = models.DateTimeField(default=now, db_default=Now())
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "budgets_budget"
        constraints = [
            models.CheckConstraint(condition=Q(amount_nano__gte=0), name="budget_amount_nonnegative"),
            # Each scope names exactly its own subject (ledger/scopes.py).
            models.CheckConstraint(condition=_names_its_subject(), name="budget_scope_names_its_subject"),
            # A run's budget is created by its first call; a second one would be a second cap.
            models.UniqueConstraint(
                fields=["organization", "run_id"], condition=Q(scope="run"), name="budget_one_per_run"
            ),
        ]
        indexes = [models.Index(fields=["organization", "scope"])]

    def __str__(self) -> str:
        return self.name or f"{self.scope} {self.period} {self.mode}"

    @property
    def error_code(self) -> str:
        """The refusal code a user reads when this ceiling refuses."""
        return refusal_code(self.scope)


class Window(models.Model):
    """One budget's counters for one period. `spent_nano` is settled cost, `reserved_nano` the
    sum of live holds (worst cases of requests admitted and not yet settled)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="windows")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField(null=True, blank=True)  # null: lifetime
    spent_nano = models.BigIntegerField(default=0)
    reserved_nano = models.BigIntegerField(default=0)
    # Spend recorded in this period before the window existed (a budget created mid-period):
    # counted in spent_nano from the start, and kept apart so the audit can reconcile.
    seed_spent_nano = models.BigIntegerField(default=0)
    # The worst cases of the requests in flight it carried when it was created mid-period. With
    # seed_spent_nano, where a window starts: above its amount when requests were admitted while
    # no cap (or a looser one) stood, and then it admits nothing until it is back under.
    seed_reserved_nano = models.BigIntegerField(default=0, db_default=0)
    # Whether the budget blocked at this window's version (a mode change is a new version): an
    # alert window's counters answer to no amount, whatever the budget's mode is later.
    blocking = models.BooleanField(default=True, db_default=True)
    budget_version = models.PositiveIntegerField(default=1, db_default=1)  # Budget.version it counts for
    # Set when the budget's version moves on: an admission that still names this window (it read
    # the budget before the edit) is refused by the admission statement and retries.
    retired_at = models.DateTimeField(null=True, blank=True)
    # Last time the drain charged it: a lifetime window idle past CAPGATE["AUDIT_IDLE_LIFETIME"]
    # with no holds leaves the live audit set (it stays in history).
    touched_at = models.DateTimeField(default=now, db_default=Now())

    class Meta:
        db_table = "budgets_window"
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "budget_version", "period_start"], name="window_unique_per_period"
            ),
            models.CheckConstraint(condition=Q(spent_nano__gte=0), name="window_spent_nonnegative"),
            models.CheckConstraint(condition=Q(reserved_nano__gte=0), name="window_reserved_nonnegative"),
            # Deliberately no `spent <= amount`: a provider may bill above the worst case and that
            # excess must be recorded, not rejected.
        ]


class GatewayInstance(models.Model):
    """A running gateway process. It heartbeats; beat renews the leases of the reservations it
    owns while it does, and expires them (charged at worst case) once it stops."""

    name = models.CharField(max_length=200)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "budgets_gatewayinstance"

    def __str__(self) -> str:
        return self.name


class PeriodicRun(models.Model):
    """One of beat's periodic tasks: how often it is meant to run and when it last succeeded
    (ledger/periodic.py), so /metrics can say when it has stopped running (beat or every worker
    down, or the task failing every time)."""

    task = models.CharField(max_length=200, primary_key=True)
    interval_seconds = models.FloatField()
    scheduled_since = models.DateTimeField()
    last_success_at = models.DateTimeField(null=True, blank=True)


class Charged(models.Model):
    """Who a row is charged to: its organization and the subject of every narrower scope
    (ledger/scopes.py), one column each. Reservations and usage records carry them. A subject
    deleted later clears its reference and leaves the row (a usage record keeps the subject's
    name in `subject`); deleting the organization deletes the row."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    member = models.ForeignKey(Member, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    end_customer = models.ForeignKey(EndCustomer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    run_id = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        abstract = True


class Reservation(Charged):
    """A request's worst case, held on its windows until its usage record is applied."""

    class Origin(models.TextChoices):
        GATEWAY = "gateway"  # a proxied call
        API = "api"  # POST /v1/reservations
        SLICE = "slice"  # a gateway process's headroom slice (ledger/slices.py), carved per request

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request_id = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=200, blank=True)
    amount_nano = models.BigIntegerField()
    owner = models.ForeignKey(
        GatewayInstance, on_delete=models.SET_NULL, null=True, blank=True, related_name="reservations"
    )
    created_at = models.DateTimeField()  # the admission time: usage belongs to this period
    expires_at = models.DateTimeField()  # lease: renewed while the owner heartbeats
    deadline_at = models.DateTimeField()  # hard maximum lifetime: never renewed past it
    # Room for provider-side jobs: a job's reservation is metered by its job id.
    job_id = models.CharField(max_length=200, null=True, blank=True)
    # Who may settle it: a proxied call's reservation is settled only by that call; one made
    # through the reservation API by the key that made it (or a write-scope organization token).
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.GATEWAY, db_default=Origin.GATEWAY)
    # Not a column: set on a request's reservation that a gateway process admitted in memory from
    # one of its headroom slices. It has no row until its usage record is written, which carves
    # it from that slice in the same statement (ledger/slices.py).
    slice_id: uuid.UUID | None = None
    # Not a column: the request's own row was written at admission (a slice of no blocking
    # ceiling writes each request's row before the provider call, so a cap created meanwhile
    # carries it), so recording has nothing to carve.
    carved: bool = False

    class Meta:
        db_table = "budgets_reservation"
        constraints = [
            models.CheckConstraint(condition=Q(amount_nano__gte=0), name="reservation_amount_nonnegative"),
        ]
        indexes = [models.Index(fields=["expires_at"]), models.Index(fields=["owner"])]


class Hold(models.Model):
    """A reservation's share of one window. Blocking windows hold the worst case; alert windows
    hold 0 — they are linked only so the drain charges the same admitting-period window."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="holds")
    # No database foreign key (db_constraint=False): checking one takes FOR KEY SHARE on the window
    # row, and records carved from headroom slices insert holds on the hottest windows from
    # transactions that do not hold them, which turned the row's lock into a multixact and gave
    # Postgres deadlocks among the statements queued on it (docs/decisions.md, 2026-12-01). A
    # window is deleted only with its budget, after ledger.windows.release_budget deleted its holds.
    window = models.ForeignKey(Window, on_delete=models.CASCADE, related_name="holds", db_constraint=False)
    amount_nano = models.BigIntegerField()

    class Meta:
        db_table = "budgets_hold"
        constraints = [
            models.UniqueConstraint(fields=["reservation", "window"], name="hold_unique_per_window"),
            models.CheckConstraint(condition=Q(amount_nano__gte=0), name="hold_amount_nonnegative"),
        ]


class SliceClaim(models.Model):
    """A request admitted in memory from a headroom slice of a blocking ceiling, written before its
    provider call (ledger/slice_claims.py). If the slice's process dies, expiry charges the slice
    only these requests' worst cases (those not recorded yet) and gives the rest back.

    Deliberately no foreign key to the slice's row: checking one takes FOR KEY SHARE on the
    hottest reservation row from every admission (the multixact trouble ledger.models.Hold tells).
    A claim outlives its request's record; it goes with its slice (closed, or settled by expiry),
    and beat deletes those whose slice is gone another way."""

    id = models.UUIDField(primary_key=True)  # the request's reservation id (a carve keeps it)
    slice_id = models.UUIDField(db_index=True)
    request_id = models.CharField(max_length=100)
    model = models.CharField(max_length=200, blank=True)
    amount_nano = models.BigIntegerField()  # the request's worst case
    created_at = models.DateTimeField()  # its admission time: usage belongs to this period

    class Meta:
        db_table = "ledger_sliceclaim"
        constraints = [
            models.CheckConstraint(condition=Q(amount_nano__gte=0), name="slice_claim_amount_nonnegative"),
        ]


class UsageRecord(Charged):
    # Every index is written by each record's insert and by its drain (which flips `applied`, a
    # column of the outbox index's predicate, so the update is never HOT). These three subject
    # columns lead a composite index below, which serves every query and every cascade by them:
    # their own single-column indexes would only add writes.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    end_customer = models.ForeignKey(
        EndCustomer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )

    class Status(models.TextChoices):
        SERVED = "served"
        FAILED_UPSTREAM = "failed_upstream"  # known not billed: zero cost, hold released
        ESTIMATED = "estimated"  # outcome unknown: charged at the reserved worst case
        RELEASED = "released"  # the caller released its reservation unused

    request_id = models.CharField(max_length=100, unique=True)
    # Who was charged: the subject columns of ledger.models.Charged, and frozen here as
    # {"project": {"id", "name"}, "member": ..., "api_key": ..., "end_customer": ...}. Those
    # foreign keys go NULL when a subject is deleted; this stays, so spend history remains
    # attributed (names are filled in when the subject is deleted).
    subject = models.JSONField(default=dict, blank=True)
    reservation_id = models.UUIDField(null=True, blank=True)
    connection = models.ForeignKey(Connection, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    model = models.CharField(max_length=200, blank=True)  # the name the caller asked for
    provider_model = models.CharField(max_length=200, blank=True)  # what the upstream served
    status = models.CharField(max_length=20, choices=Status.choices)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    cost_nano = models.BigIntegerField(default=0)
    reserved_nano = models.BigIntegerField(default=0)  # the worst case admitted for it
    # What the provider billed above the reserved worst case: the only way past a cap, measured.
    excess_nano = models.BigIntegerField(default=0)
    # What the provider reported this request cost, when a report came from the call itself
    # (the gateway) or its caller (the reservation API's settle). Usually equal to cost_nano; a
    # report that reached an already-final record is kept here instead of being lost, and the
    # per-request audit (alerts/audit.py) flags every record where the two differ.
    reported_cost_nano = models.BigIntegerField(null=True, blank=True)
    # The reservation API's settle is final: a later settle of the same reservation at another
    # cost is a conflict, answered 409 to that caller and kept here once (the first such report).
    # It is never applied and it is not drift: the record's cost is the first settle's.
    conflicting_cost_nano = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    # How the reserved worst case bounded the prompt: "exact" (the model's tokenizer), "bytes"
    # (the byte bound), or "" when not known (reservation API, expiry).
    input_bound = models.CharField(max_length=5, blank=True, default="")
    # A provider job's id (jobs/): this record settles the job the request submitted.
    job_id = models.CharField(max_length=200, null=True, blank=True)
    admitted_at = models.DateTimeField()  # usage belongs to the windows of this moment
    created_at = models.DateTimeField(auto_now_add=True)
    applied = models.BooleanField(default=False)
    applied_at = models.DateTimeField(null=True, blank=True)
    # The windows this record was charged to (kept so a late correction hits the same ones).
    window_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)

    class Meta:
        db_table = "usage_usagerecord"
        constraints = [
            models.CheckConstraint(condition=Q(cost_nano__gte=0), name="usage_cost_nonnegative"),
            models.CheckConstraint(condition=Q(reserved_nano__gte=0), name="usage_reserved_nonnegative"),
            models.CheckConstraint(condition=Q(excess_nano__gte=0), name="usage_excess_nonnegative"),
        ]
        indexes = [
            # The outbox: the drain scans only unapplied rows.
            models.Index(fields=["id"], condition=Q(applied=False), name="usage_outbox_idx"),
            models.Index(fields=["organization", "admitted_at"]),
            models.Index(fields=["end_customer", "admitted_at"]),
            models.Index(fields=["api_key", "admitted_at"]),
            # A run budget's first window is seeded with the run's recorded spend: found by run,
            # not by scanning the organization's whole history (ledger.windows._create).
            models.Index(fields=["organization", "run_id"], condition=Q(run_id__isnull=False), name="usage_run_idx"),
            # The request log's status filter (requestlog/pages.py): a page of a rare status
            # (failed upstream, estimated, released) is read along this, not by filtering the
            # organization's whole history. Served records, nearly all of them, are not in it:
            # the (organization, time) index finds those at once.
            models.Index(
                fields=["organization", "status", "admitted_at"],
                condition=~Q(status="served"),
                name="usage_status_time_idx",
            ),
            # The per-request audit: records whose cost differs from what was reported for them.
            models.Index(
                fields=["id"],
                condition=Q(reported_cost_nano__isnull=False) & ~Q(reported_cost_nano=F("cost_nano")),
                name="usage_report_mismatch_idx",
            ),
        ]


M = TypeVar("M", bound=models.Model)


def unsaved(model: type[M], values: dict[str, Any]) -> M:
    """An unsaved instance of `model` with `values` ({attname: value} of every concrete field),
    built without Model.__init__'s per-field work (a third of a usage record's cost on the group
    commit's path). Nothing is checked or defaulted: the callers give every field, and
    tests/ledger/test_record_batch.py checks the usage record's and the reservation's against
    the ORM's own instances."""
    obj = model.__new__(model)
    obj.__dict__.update(values)
    obj._state = ModelState()
    return obj
