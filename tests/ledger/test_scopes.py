"""Who pays is written once (ledger/scopes.py): every place derived from the table agrees with
it. Adding a scope is a row in the table; these tests fail until the columns, the matching, the
seeding, the admission statement, the record builder and the refusal code all know it."""

import dataclasses
import re
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from ledger.admission import _ADMIT_SQL, Subject, admit, matching_budgets
from ledger.errors import BudgetExceeded
from ledger.models import Budget, Charged, Reservation, UsageRecord
from ledger.recording import Outcome, build_record
from ledger.scopes import CHARGED_COLUMNS, SCOPES, SUBJECT_COLUMNS
from ledger.windows import current_windows
from requestlog.models import Refusal, RequestLogEntry
from tenants.models import EndCustomer, Member, Project
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db
NARROWER = [s for s in SCOPES if s.column is not None]


def _ids(scopes):
    return [s.name for s in scopes]


def _value(v):
    return v.pk if isinstance(v, models.Model) else v


@pytest.fixture
def subjects(acme, alice, django_user_model):
    """Two subjects for every narrower scope's column, both in acme."""
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "password")
    second = Project.objects.create(organization=acme.org, name="Second", slug="second")
    return [
        {
            "project": acme.project,
            "member": Member.objects.create(organization=acme.org, user=alice),
            "api_key": acme.key,
            "end_customer": EndCustomer.objects.create(project=acme.project, external_id="c1"),
            "run_id": "run-1",
        },
        {
            "project": second,
            "member": Member.objects.create(organization=acme.org, user=bob),
            "api_key": acme.add_key("second"),
            "end_customer": EndCustomer.objects.create(project=second, external_id="c2"),
            "run_id": "run-2",
        },
    ]


def _subject(acme, values) -> Subject:
    return Subject(organization_id=acme.org.id, **{s.attname: _value(values[s.column]) for s in NARROWER})


def _budget(acme, scope, values, amount_nano=10**9, **kw) -> Budget:
    subject = {scope.column: values[scope.column]} if scope.column else {}
    return Budget.objects.create(organization=acme.org, scope=scope.name, amount_nano=amount_nano, **subject, **kw)


def test_the_table_names_each_scope_once_with_its_own_code():
    assert len({s.name for s in SCOPES}) == len({s.code for s in SCOPES}) == len(SCOPES)
    assert [s.column for s in SCOPES].count(None) == 1  # only the organization covers every request
    assert list(Budget.Scope.values) == [s.name for s in reversed(SCOPES)]
    assert all(Budget(scope=s.name).error_code == s.code for s in SCOPES)


def test_every_charged_row_has_the_tables_columns():
    assert [f.attname for f in Charged._meta.local_fields] == list(CHARGED_COLUMNS)
    assert issubclass(Reservation, Charged) and issubclass(UsageRecord, Charged)
    assert [f.name for f in dataclasses.fields(Subject)] == list(CHARGED_COLUMNS)
    for model in (Budget, Refusal, RequestLogEntry):
        assert set(CHARGED_COLUMNS) <= {f.attname for f in model._meta.concrete_fields}, model
    assert list(SUBJECT_COLUMNS) == [s.column for s in reversed(NARROWER)]


def test_the_admission_statement_inserts_every_reservation_column():
    listed = re.search(r"INSERT INTO budgets_reservation \(([^)]*)\)", _ADMIT_SQL)
    assert listed is not None
    columns = [c.strip() for c in listed.group(1).split(",")]
    assert sorted(columns) == sorted(f.column for f in Reservation._meta.concrete_fields)


@pytest.mark.parametrize("scope", NARROWER, ids=_ids(NARROWER))
def test_a_budget_must_name_its_scopes_subject(acme, scope):
    with pytest.raises(IntegrityError) as err, transaction.atomic():
        Budget.objects.create(organization=acme.org, scope=scope.name, amount_nano=1)
    assert "budget_scope_names_its_subject" in str(err.value)


@pytest.mark.parametrize("scope", SCOPES, ids=_ids(SCOPES))
def test_a_budget_matches_the_requests_of_its_subject_only(acme, subjects, scope):
    budget = _budget(acme, scope, subjects[0])
    mine = _subject(acme, subjects[0])
    assert [b.id for b in matching_budgets(mine)] == [budget.id]
    if scope.attname is None:
        other = Subject(organization_id=make_tenant("globex").org.id)
    else:
        other = dataclasses.replace(mine, **{scope.attname: _value(subjects[1][scope.column])})
    assert matching_budgets(other) == []


@pytest.mark.parametrize("scope", SCOPES, ids=_ids(SCOPES))
def test_a_window_created_mid_life_carries_its_subjects_spend_only(acme, subjects, scope):
    now = timezone.now()
    for i, cost in enumerate((700, 11)):
        UsageRecord.objects.create(
            request_id=f"r{i}",
            organization=acme.org,
            status="served",
            cost_nano=cost,
            admitted_at=now - timedelta(seconds=5),
            **subjects[i],
        )
    budget = _budget(acme, scope, subjects[0], period="lifetime")
    window = current_windows(budgets=[budget], now=now)[budget.id]
    assert window.spent_nano == (711 if scope.column is None else 700)


@pytest.mark.parametrize("scope", SCOPES, ids=_ids(SCOPES))
def test_a_full_ceiling_refuses_with_its_scopes_code(acme, subjects, scope):
    _budget(acme, scope, subjects[0], amount_nano=0)
    with pytest.raises(BudgetExceeded) as refused:
        admit(request=acme.request(worst_nano=1, subject=_subject(acme, subjects[0])))
    assert refused.value.code == scope.code


def test_the_narrowest_full_ceiling_names_the_refusal(acme, subjects):
    for scope in SCOPES:
        _budget(acme, scope, subjects[0], amount_nano=0)
    with pytest.raises(BudgetExceeded) as refused:
        admit(request=acme.request(worst_nano=1, subject=_subject(acme, subjects[0])))
    assert refused.value.code == SCOPES[0].code


def test_a_usage_record_is_charged_to_its_reservations_subject():
    values = {c: (f"{c}-value" if c == "run_id" else i + 1) for i, c in enumerate(CHARGED_COLUMNS)}
    reservation = Reservation(id=uuid.uuid4(), request_id="req", amount_nano=5, created_at=timezone.now(), **values)
    record = build_record(reservation=reservation, outcome=Outcome(status="served", cost_nano=3))
    assert {c: getattr(record, c) for c in CHARGED_COLUMNS} == values
    rows = [f.name for f in Charged._meta.local_fields if f.is_relation and f.name != "organization"]
    assert record.subject == {name: {"id": values[f"{name}_id"]} for name in rows}
