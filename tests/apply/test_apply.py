"""`manage.py apply`: declares the demo, idempotent, dry-run prints the diff, bad input changes nothing."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection as db_connection

from catalog.models import Connection, Model, Route
from ledger.models import Budget
from tenants.models import ApiKey, AuditLogEntry, Member, Organization, Project, hash_key

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo.yaml"


def run(path: Path | str, *args: str) -> str:
    out = StringIO()
    call_command("apply", str(path), *args, stdout=out)
    return out.getvalue()


def counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count()
        for m in (Organization, Project, Member, ApiKey, Connection, Route, Budget, Model, AuditLogEntry)
    }


def write(tmp_path: Path, data: dict, name: str = "conf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


@pytest.mark.django_db
def test_demo_file_declares_the_demo_organization():
    # when
    out = run(DEMO)
    # then
    org = Organization.objects.get(slug="demo")
    assert "+ organization demo" in out
    owner = Member.objects.get(organization=org, user__email="demo@capgate.localhost")
    assert owner.role == "owner" and owner.user.check_password("demo-password")
    key = ApiKey.objects.get(organization=org, name="demo")
    assert key.key_hash == hash_key("cg_demo_key_do_not_use_in_production")
    assert key.project.slug == "default" and key.member == owner
    echo = Connection.objects.get(organization=org, name="echo")
    assert echo.kind == "echo" and echo.options == {"delay_ms": 20}
    target = Route.objects.get(organization=org, name="echo-1").targets.get()
    assert (target.connection, str(target.model)) == (echo, "echo/echo-1")
    monthly = Budget.objects.get(organization=org, scope="organization")
    assert (monthly.mode, monthly.period, monthly.amount_nano) == ("block", "month", 25_000_000_000)
    daily = Budget.objects.get(organization=org, scope="key")
    assert (daily.mode, daily.period, daily.amount_nano, daily.api_key) == ("alert", "day", 1_000_000_000, key)
    # the fixed secret is not printed (it is in the file); audit names apply
    assert "cg_demo_key" not in out
    assert AuditLogEntry.objects.filter(organization=org, actor="apply", object_type="budget").count() == 2


@pytest.mark.django_db
def test_applying_twice_changes_nothing_the_second_time():
    # given
    run(DEMO)
    before = counts()
    # when
    out = run(DEMO)
    # then
    assert out.strip() == "no changes"
    assert counts() == before


@pytest.mark.django_db
def test_dry_run_prints_the_diff_and_changes_nothing(tmp_path):
    # given: the demo, then a file raising the cap and adding a project
    run(DEMO)
    data = yaml.safe_load(DEMO.read_text())
    data["organizations"][0]["budgets"][0]["amount_usd"] = "7.50"
    data["organizations"][0]["projects"].append({"slug": "research", "name": "Research"})
    before = counts()
    # when
    out = run(write(tmp_path, data), "--dry-run")
    # then
    assert "~ budget demo/Demo monthly cap: amount_usd: 25.00 → 7.50" in out
    assert "+ project demo/research" in out
    assert "nothing changed" in out
    assert counts() == before
    assert Budget.objects.get(name="Demo monthly cap").amount_nano == 25_000_000_000
    # and the real run does what the dry run said
    out = run(write(tmp_path, data))
    assert Budget.objects.get(name="Demo monthly cap").amount_nano == 7_500_000_000
    assert "2 change(s) applied" in out


@pytest.mark.django_db
def test_json_works_and_generated_secret_is_printed_once(tmp_path):
    data = {
        "prices": [{"model": "echo/echo-1", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}],
        "organizations": [
            {"slug": "j", "name": "J", "projects": [{"slug": "p"}], "keys": [{"name": "ci", "project": "p"}]}
        ],
    }
    out = run(write(tmp_path, data, "c.json"))
    line = next(x for x in out.splitlines() if "secret (shown once)" in x)
    raw = line.rsplit(" ", 1)[1]
    assert ApiKey.objects.get(name="ci").key_hash == hash_key(raw)
    assert "secret" not in run(write(tmp_path, data, "c.json"))  # second run: no new secret


@pytest.mark.django_db
def test_unknown_model_fails_naming_the_item_and_changes_nothing(tmp_path):
    # given: a valid org followed by a route to a model the catalog does not have
    data = {
        "organizations": [
            {
                "slug": "x",
                "projects": [{"slug": "p"}],
                "connections": [{"name": "c", "kind": "echo"}],
                "routes": [{"name": "r", "targets": [{"connection": "c", "model": "nope/missing"}]}],
            }
        ]
    }
    before = counts()
    # when / then
    with pytest.raises(
        CommandError,
        match=(
            r"organizations\[0\]\.routes\[0\]\.targets\[0\].*'nope/missing' is not in the catalog.*nothing "
            r"was changed"
        ),
    ):
        run(write(tmp_path, data))
    assert counts() == before


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"name": "b", "scope": "key", "amount_usd": "1"}, r"budgets\[0\]\.api_key: A key budget names its api key"),
        (
            {"name": "b", "scope": "organization", "amount_usd": "-1"},
            r"budgets\[0\]\.amount_usd: Ensure this value is greater than or equal to 0\.",
        ),
        ({"name": "b", "scope": "organization", "amount_usd": "abc"}, r"budgets\[0\]\.amount_usd: Enter a number\."),
        (
            {"name": "b", "scope": "organization", "amount_usd": "1", "period": "year"},
            r"budgets\[0\]\.period: Period must be",
        ),
        ({"name": "b", "scope": "organization", "amount_usd": "1", "timezone": "Mars/Base"}, r"budgets\[0\]\.timezone"),
        (
            {"name": "b", "scope": "project", "project": "ghost", "amount_usd": "1"},
            r"budgets\[0\]\.project: no project 'ghost'",
        ),
        (
            {"name": "b", "scope": "organization", "amount_usd": "1", "colour": "red"},
            r"budgets\[0\]: unknown field\(s\) colour",
        ),
    ],
)
@pytest.mark.django_db
def test_bad_budget_is_named_and_nothing_changes(tmp_path, budget, message):
    data = {"organizations": [{"slug": "x", "projects": [{"slug": "p"}], "budgets": [budget]}]}
    with pytest.raises(CommandError, match=message):
        run(write(tmp_path, data))
    assert not Organization.objects.filter(slug="x").exists()


@pytest.mark.django_db
def test_moving_a_budget_to_another_subject_is_refused(tmp_path):
    data = {
        "organizations": [
            {
                "slug": "x",
                "projects": [{"slug": "p"}, {"slug": "q"}],
                "budgets": [{"name": "b", "scope": "project", "project": "p", "amount_usd": "1"}],
            }
        ]
    }
    run(write(tmp_path, data))
    data["organizations"][0]["budgets"][0]["project"] = "q"
    with pytest.raises(CommandError, match="fixed once created"):
        run(write(tmp_path, data))
    assert Budget.objects.get(name="b").project.slug == "p"


@pytest.mark.django_db
def test_connection_secret_is_encrypted_at_rest_and_updated_idempotently(tmp_path, monkeypatch):
    monkeypatch.setenv("UPSTREAM_KEY", "sk-live-123")
    data = {
        "organizations": [
            {
                "slug": "x",
                "connections": [
                    {
                        "name": "oa",
                        "kind": "openai",
                        "base_url": "https://api.openai.com/v1",
                        "secret_env": "UPSTREAM_KEY",
                        "rates": {"input": "0.5", "output": "1.5"},
                    }
                ],
            }
        ]
    }
    run(write(tmp_path, data))
    conn = Connection.objects.get(name="oa")
    assert conn.plain_secret == "sk-live-123"
    with db_connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM catalog_connection WHERE id = %s", [conn.id])
        stored = cursor.fetchone()[0]
    assert stored.startswith("enc:v1:") and "sk-live-123" not in stored
    assert run(write(tmp_path, data)).strip() == "no changes"  # same secret, same rates ("0.5" == 0.500000)
    monkeypatch.setenv("UPSTREAM_KEY", "sk-live-456")
    out = run(write(tmp_path, data))
    assert "secret: (changed) → (changed)" in out and "sk-live" not in out
    assert Connection.objects.get(name="oa").plain_secret == "sk-live-456"


@pytest.mark.django_db
def test_member_without_password_gets_unusable_password_and_role_changes(tmp_path):
    data = {"organizations": [{"slug": "x", "members": [{"email": "Bob@Example.com", "role": "viewer"}]}]}
    run(write(tmp_path, data))
    bob = get_user_model().objects.get(email="bob@example.com")
    assert not bob.has_usable_password()
    data["organizations"][0]["members"][0]["role"] = "admin"
    out = run(write(tmp_path, data))
    assert "~ member x/bob@example.com: role: viewer → admin" in out


@pytest.mark.django_db
def test_unreadable_and_invalid_files_are_clear_errors(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("organizations: [\n")
    with pytest.raises(CommandError, match="not valid YAML"):
        run(bad)
    bad.write_text("- 1\n")
    with pytest.raises(CommandError, match=r"\$: expected a mapping"):
        run(bad)


@pytest.mark.django_db
def test_dry_run_on_an_empty_database_lists_everything_and_creates_nothing():
    before = counts()
    out = run(DEMO, "--dry-run")
    for line in (
        "+ organization demo",
        "+ project demo/default",
        "+ user demo@capgate.localhost",
        "+ member demo/demo@capgate.localhost (owner)",
        "+ key demo/demo",
        "+ connection demo/echo",
        "+ route demo/echo-1",
        "+ budget demo/Demo monthly cap",
        "+ budget demo/Demo key daily alert",
    ):
        assert line in out
    assert counts() == before
    assert not get_user_model().objects.filter(email="demo@capgate.localhost").exists()


@pytest.mark.django_db
def test_a_price_sets_and_clears_the_tokenizer(tmp_path):
    # given: a new model counted with o200k_base
    data = {
        "prices": [
            {"model": "acme/gpt-x", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2", "tokenizer": "o200k_base"}
        ]
    }
    run(write(tmp_path, data))
    assert Model.objects.get(name="gpt-x").tokenizer == "o200k_base"
    # when: applied again, then with null
    assert run(write(tmp_path, data)).strip() == "no changes"
    data["prices"][0]["tokenizer"] = None
    out = run(write(tmp_path, data))
    # then
    assert "tokenizer: o200k_base → —" in out  # null: prompts bounded by bytes again
    assert Model.objects.get(name="gpt-x").tokenizer is None


@pytest.mark.parametrize("tokenizer", ["gpt2", "", "O200K_BASE", 5, ["o200k_base"]])
@pytest.mark.django_db
def test_a_bad_tokenizer_is_named_and_nothing_changes(tmp_path, tokenizer):
    # given: a model counted with o200k_base, and a file that first changes its price
    run(
        write(
            tmp_path,
            {
                "prices": [
                    {
                        "model": "acme/gpt-x",
                        "input_usd_per_mtok": "1",
                        "output_usd_per_mtok": "2",
                        "tokenizer": "o200k_base",
                    }
                ]
            },
        )
    )
    before = counts()
    data = {
        "prices": [
            {"model": "acme/gpt-x", "input_usd_per_mtok": "9", "output_usd_per_mtok": "9", "tokenizer": None},
            {"model": "acme/gpt-y", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2", "tokenizer": tokenizer},
        ]
    }
    # when / then: a wrong encoding would under-count the model's prompts
    with pytest.raises(
        CommandError, match=r"prices\[1\]\.tokenizer: Tokenizer must be one of o200k_base, cl100k_base or null"
    ):
        run(write(tmp_path, data))
    assert counts() == before
    model = Model.objects.get(name="gpt-x")
    assert (model.tokenizer, str(model.input_usd_per_mtok)) == ("o200k_base", "1.000000")
    assert not Model.objects.filter(name="gpt-y").exists()
