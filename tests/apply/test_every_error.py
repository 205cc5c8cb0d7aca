"""`manage.py apply` reports every bad item of the file at once, each at its path, with the API's
message, and changes nothing."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from catalog.models import Connection, Route
from dashboard.services.apply import ApplyError
from dashboard.services.apply_document import apply_config
from ledger.models import Budget
from ratelimits.models import RateLimit
from tenants.models import AuditLogEntry, Organization, Project

from .test_apply import counts, run, write


def three_bad_items() -> dict:
    return {
        "organizations": [
            {
                "slug": "x",
                "projects": [{"slug": "p"}],
                "connections": [{"name": "c", "kind": "echo"}],
                "budgets": [
                    {"name": "ok", "scope": "organization", "amount_usd": "5"},
                    {"name": "neg", "scope": "organization", "amount_usd": "-1"},
                    {"name": "fine", "scope": "project", "project": "p", "amount_usd": "2"},
                    {"name": "places", "scope": "organization", "amount_usd": "1.0000000001", "period": "day"},
                ],
                "rate_limits": [{"name": "zero", "scope": "organization", "requests_per_minute": 0}],
            }
        ]
    }


@pytest.mark.django_db
def test_three_bad_items_are_all_reported_and_nothing_changes(tmp_path):
    before = counts()
    with pytest.raises(CommandError) as caught:
        run(write(tmp_path, three_bad_items()))
    message = str(caught.value)
    assert message.splitlines() == [
        "3 errors (nothing was changed):",
        "  organizations[0].budgets[1].amount_usd: Ensure this value is greater than or equal to 0.",
        "  organizations[0].budgets[3].amount_usd: Ensure that there are no more than 9 decimal places.",
        "  organizations[0].rate_limits[0].requests_per_minute: A whole number from 1 to 1,000,000,000,000,000, "
        "or empty.",
    ]
    # the good items before and after the bad ones were undone with them
    assert counts() == before
    assert not Organization.objects.filter(slug="x").exists()
    assert not Budget.objects.exists() and not RateLimit.objects.exists() and not Project.objects.exists()


@pytest.mark.django_db
def test_errors_from_serializers_lookups_and_services_are_reported_together():
    data = {
        "organizations": [
            {
                "slug": "x",
                "projects": [{"slug": "p"}],
                "connections": [{"name": "c", "kind": "echo", "rates": {"input": "-1", "colour": "1"}}],
                "routes": [{"name": "r", "targets": [{"connection": "nope", "model": "echo/missing"}]}],
                "budgets": [
                    {"name": "k", "scope": "key", "amount_usd": "1"},  # the service: a key budget names its key
                    {
                        "name": "g",
                        "scope": "project",
                        "project": "ghost",
                        "amount_usd": "x",
                        "thresholds": [50, 0],
                        "period": "year",
                    },
                ],
            }
        ]
    }
    with pytest.raises(ApplyError) as caught:
        apply_config(data=data)
    assert caught.value.problems == [
        ("organizations[0].connections[0].rates", "unknown field(s) colour"),
        ("organizations[0].connections[0].rates.input", "Ensure this value is greater than or equal to 0."),
        ("organizations[0].routes[0].targets[0].connection", 'No connection "nope" in this organization.'),
        ("organizations[0].routes[0].targets[0].model", "Model 'echo/missing' is not in the catalog."),
        ("organizations[0].budgets[0].api_key", "A key budget names its api key."),
        ("organizations[0].budgets[1].project", "no project 'ghost' in x (declare it under projects)"),
        ("organizations[0].budgets[1].period", "Period must be one of day, week, month, lifetime."),
        ("organizations[0].budgets[1].amount_usd", "Enter a number."),
        ("organizations[0].budgets[1].thresholds[1]", "Whole percentages from 1 to 1000, e.g. 50, 80, 100."),
    ]
    assert not Organization.objects.exists() and not Connection.objects.exists() and not Route.objects.exists()
    assert not AuditLogEntry.objects.exists()


@pytest.mark.django_db
def test_a_good_file_after_a_bad_one_applies_everything(tmp_path):
    data = three_bad_items()
    budgets = data["organizations"][0]["budgets"]
    budgets[1]["amount_usd"] = "1"
    budgets[3]["amount_usd"] = "1.000000001"
    data["organizations"][0]["rate_limits"][0]["requests_per_minute"] = 60
    out = run(write(tmp_path, data))
    assert "+ budget x/places" in out and "+ rate limit x/zero" in out
    assert Budget.objects.get(name="places").amount_nano == 1_000_000_001


@pytest.mark.django_db
def test_savepoint_guard_removed_a_refused_item_leaves_its_partial_writes(tmp_path, monkeypatch):
    # The removal test of the per-item savepoint (what lets apply go on past a bad item): without
    # it, a refusal raised after the item's first write would leave that write for the next items
    # to see. Here the whole run still rolls back, so the proof is in what the next item sees.
    from dashboard.services import apply_document

    seen: list[bool] = []
    real = apply_document._apply_project

    def project_then_refuse(org, item, result):
        real(org, item, result)
        if item.data["slug"] == "p":
            raise ApplyError(item.path, "refused after writing")
        seen.append(org.projects.filter(slug="p").exists())

    monkeypatch.setattr(apply_document, "_LISTS", [("projects", {"slug"}, {"slug"}, project_then_refuse)])
    data = {"organizations": [{"slug": "x", "projects": [{"slug": "p"}, {"slug": "q"}]}]}
    with pytest.raises(ApplyError):
        apply_config(data=data)
    assert seen == [False]  # the refused item's project was undone before the next item ran
    monkeypatch.setattr(apply_document.transaction, "atomic", _outer_only(apply_document.transaction.atomic))
    seen.clear()
    with pytest.raises(ApplyError):
        apply_config(data=data)
    assert seen == [True]


def _outer_only(atomic):
    """transaction.atomic for the run's own transaction only: no savepoint per item."""
    import contextlib

    calls = {"n": 0}

    def patched(*args, **kwargs):
        calls["n"] += 1
        return atomic(*args, **kwargs) if calls["n"] == 1 else contextlib.nullcontext()

    return patched
