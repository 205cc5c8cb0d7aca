"""`rate_limits:` in `manage.py apply`: declared limits are created, re-applying is a no-op, and a
bad entry fails naming the item's path and changes nothing. Each guard has its removal test."""

from __future__ import annotations

import contextlib
import copy
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import IntegrityError
from rest_framework import serializers

from dashboard.services import apply_document as apply_service
from ratelimits import api as ratelimit_api
from ratelimits import services
from ratelimits.models import RateLimit
from tenants.models import AuditLogEntry, Organization


def run(path: Path) -> str:
    out = StringIO()
    call_command("apply", str(path), stdout=out)
    return out.getvalue()


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "conf.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


ORG = {
    "slug": "x",
    "projects": [{"slug": "p", "end_customers": ["cust-1"]}, {"slug": "p2"}],
    "keys": [{"name": "ci", "project": "p"}],
    "rate_limits": [
        {"name": "whole-org", "scope": "organization", "requests_per_minute": 6000},
        {"name": "per-project", "scope": "project", "project": "p", "tokens_per_minute": 5_000_000},
        {
            "name": "per-key",
            "scope": "key",
            "key": "ci",
            "requests_per_minute": 600,
            "tokens_per_minute": 2_000_000,
        },
        {
            "name": "per-customer",
            "scope": "end_customer",
            "end_customer": "p/cust-1",
            "requests_per_minute": 10,
        },
    ],
}


def config(**limit_changes) -> dict:
    org = copy.deepcopy(ORG)
    for index, changes in limit_changes.items():
        org["rate_limits"][int(index[1:])].update(changes)
    return {"organizations": [org]}


def state() -> list:
    return [
        sorted(
            RateLimit.objects.values_list(
                "name",
                "scope",
                "project__slug",
                "api_key__name",
                "end_customer__external_id",
                "requests_per_minute",
                "tokens_per_minute",
            )
        ),
        AuditLogEntry.objects.count(),
    ]


@pytest.mark.django_db
def test_declared_rate_limits_are_created(tmp_path):
    out = run(write(tmp_path, config()))
    org = Organization.objects.get(slug="x")
    for name in ("whole-org", "per-project", "per-key", "per-customer"):
        assert f"+ rate limit x/{name}" in out
    assert state()[0] == [
        ("per-customer", "end_customer", None, None, "cust-1", 10, None),
        ("per-key", "key", None, "ci", None, 600, 2_000_000),
        ("per-project", "project", "p", None, None, None, 5_000_000),
        ("whole-org", "organization", None, None, None, 6000, None),
    ]
    assert set(RateLimit.objects.values_list("organization", flat=True)) == {org.id}
    assert AuditLogEntry.objects.filter(object_type="ratelimit", action="create", actor="apply").count() == 4


@pytest.mark.django_db
def test_reapplying_is_a_no_op_and_a_changed_rate_is_an_update(tmp_path):
    run(write(tmp_path, config()))
    before = state()
    # when: the same file again
    assert run(write(tmp_path, config())).strip() == "no changes"
    assert state() == before
    # when: one rate changed, another dropped
    out = run(write(tmp_path, config(_2={"requests_per_minute": 300, "tokens_per_minute": None})))
    assert "~ rate limit x/per-key" in out and "1 change(s) applied" in out
    limit = RateLimit.objects.get(name="per-key")
    assert (limit.requests_per_minute, limit.tokens_per_minute) == (300, None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"requests_per_minute": 0},
            r"rate_limits\[2\]\.requests_per_minute: A whole number from 1",
        ),
        (
            {"requests_per_minute": -1},
            r"rate_limits\[2\]\.requests_per_minute: A whole number from 1",
        ),
        ({"tokens_per_minute": 0}, r"rate_limits\[2\]\.tokens_per_minute: A whole number from 1"),
        (
            {"requests_per_minute": "many"},
            r"rate_limits\[2\]\.requests_per_minute: A whole number from 1",
        ),
        (
            {"requests_per_minute": 1.5},
            r"rate_limits\[2\]\.requests_per_minute: A whole number from 1",
        ),
        (
            {"requests_per_minute": None, "tokens_per_minute": None},
            r"rate_limits\[2\]\.requests_per_minute: Set requests per minute, tokens per minute, or both",
        ),
        ({"scope": "galaxy"}, r"rate_limits\[2\]\.scope: Scope must be one of"),
        ({"key": "ghost"}, r"rate_limits\[2\]\.key: no key 'ghost'"),
        (
            {"scope": "project"},
            r"rate_limits\[2\]\.project: A project rate limit names its project",
        ),
        ({"colour": "red"}, r"rate_limits\[2\]: unknown field\(s\) colour"),
    ],
)
@pytest.mark.django_db
def test_bad_entry_is_named_and_nothing_changes(tmp_path, changes, message):
    # on an empty database: the organization and the good entries before it are not created
    with pytest.raises(CommandError, match=message + r".*nothing was changed"):
        run(write(tmp_path, config(_2=changes)))
    assert not Organization.objects.filter(slug="x").exists()
    assert not RateLimit.objects.exists()
    # over an applied file: nothing it declared is altered (an existing limit's scope or subject
    # may be refused as fixed rather than as bad; either way the item is named)
    run(write(tmp_path, config()))
    before = state()
    with pytest.raises(CommandError, match=r"organizations\[0\]\.rate_limits\[2\]"):
        run(write(tmp_path, config(_0={"requests_per_minute": 7}, _2=changes)))
    assert state() == before


@pytest.mark.django_db
def test_a_subject_is_fixed_once_created(tmp_path):
    run(write(tmp_path, config()))
    before = state()
    with pytest.raises(CommandError, match=r"rate_limits\[1\]\.project: Scope and subject are fixed"):
        run(
            write(
                tmp_path,
                {
                    "organizations": [
                        {
                            **ORG,
                            "rate_limits": [
                                ORG["rate_limits"][0],
                                {
                                    "name": "per-project",
                                    "scope": "project",
                                    "project": "p2",
                                    "tokens_per_minute": 5_000_000,
                                },
                            ],
                        }
                    ]
                },
            )
        )
    assert state() == before


@pytest.mark.django_db
def test_nothing_changed_guard_removed_keeps_the_entries_before_the_bad_one(tmp_path, monkeypatch):
    # The removal test of "nothing changes": apply's one transaction is the guard. Apply goes
    # on past a bad item (to report every error), so without it every good entry is written.
    monkeypatch.setattr(apply_service.transaction, "atomic", contextlib.nullcontext)
    with pytest.raises(CommandError, match=r"rate_limits\[2\]"):
        run(write(tmp_path, config(_2={"requests_per_minute": 0})))
    assert set(RateLimit.objects.values_list("name", flat=True)) == {"whole-org", "per-project", "per-customer"}


@pytest.mark.django_db
def test_named_path_guard_removed_is_a_bare_database_error(tmp_path, monkeypatch):
    # The removal test of the service's check: without it the constraint still refuses the row,
    # but as a bare IntegrityError that names no item.
    # The serializer's bound (the API's rule, which apply now meets first) goes too.
    monkeypatch.setitem(
        ratelimit_api.RateLimitSerializer._declared_fields,
        "requests_per_minute",
        serializers.IntegerField(required=False, allow_null=True),
    )
    monkeypatch.setattr(services, "_check_fields", lambda fields, current=None: None)
    with pytest.raises(IntegrityError, match="rate_limit_positive"):
        run(write(tmp_path, config(_2={"requests_per_minute": 0})))
    assert not RateLimit.objects.exists()
