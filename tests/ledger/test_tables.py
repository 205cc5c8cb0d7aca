"""The ledger's models moved from budgets and usage in migration state only: the tables keep
their names, the moving migrations issue no SQL, and the alerts app keeps the label "usage"."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from alerts.models import AlertEvent, AuditRun
from ledger.models import Budget, GatewayInstance, Hold, Reservation, UsageRecord, Window

TABLES = {
    Budget: "budgets_budget",
    Window: "budgets_window",
    Reservation: "budgets_reservation",
    Hold: "budgets_hold",
    GatewayInstance: "budgets_gatewayinstance",
    UsageRecord: "usage_usagerecord",
    AlertEvent: "usage_alertevent",
    AuditRun: "usage_auditrun",
}

# The migrations that moved the models between apps: state only, so an existing database runs
# them without a statement.
STATE_ONLY = [
    ("ledger", "0001_initial"),
    ("usage", "0009_usagerecord_to_ledger"),
    ("requestlog", "0004_refusal_budget_in_ledger"),
    ("budgets", "0009_models_to_ledger"),
]


@pytest.mark.django_db
def test_the_moved_models_keep_their_tables():
    existing = set(connection.introspection.table_names())
    for model, table in TABLES.items():
        assert model._meta.db_table == table, model
        assert table in existing, table


def test_the_alerts_app_keeps_the_label_its_tables_and_migrations_are_named_by():
    config = apps.get_app_config("usage")
    assert config.name == "alerts"
    assert AlertEvent._meta.app_label == "usage"
    assert UsageRecord._meta.app_label == Budget._meta.app_label == "ledger"


def _statements(app: str, name: str) -> list[str]:
    out = io.StringIO()
    call_command("sqlmigrate", app, name, stdout=out)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    return [line for line in lines if line and not line.startswith("--") and line not in ("BEGIN;", "COMMIT;")]


@pytest.mark.django_db
@pytest.mark.parametrize(("app", "name"), STATE_ONLY)
def test_the_moving_migrations_issue_no_sql(app, name):
    assert _statements(app, name) == []


@pytest.mark.django_db
def test_control_a_migration_that_changes_the_schema_shows_its_sql():
    assert any(s.startswith("ALTER TABLE") for s in _statements("budgets", "0008_window_blocking"))
