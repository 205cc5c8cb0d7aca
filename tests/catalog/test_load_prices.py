import copy
import datetime
import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from catalog.models import Model, Provider
from catalog.prices import DEFAULT_CATALOG_PATH, CatalogError, load_catalog, read_catalog
from catalog.pricing import TokenBound, rates_for, worst_case_nano

pytestmark = pytest.mark.django_db


@pytest.fixture
def shipped() -> dict:
    return read_catalog(DEFAULT_CATALOG_PATH)


def small_catalog() -> dict:
    return {
        "prices_as_of": "2026-01-02",
        "source": "test",
        "providers": [{"slug": "acme", "name": "Acme AI"}],
        "models": [
            {
                "provider": "acme",
                "name": "big",
                "input": "3",
                "output": "15",
                "cache_read": "0.30",
                "cache_write": "3.75",
                "max_output_tokens": 64000,
                "context_window": 200000,
                "max_image_tokens": 3279,
            },
            {
                "provider": "acme",
                "name": "small",
                "input": "0.10",
                "output": "0.40",
                "cache_read": None,
                "cache_write": None,
                "max_output_tokens": 8192,
                "context_window": 32000,
                "max_image_tokens": None,
            },
        ],
    }


def snapshot() -> list[tuple]:
    return list(
        Model.objects.order_by("provider__slug", "name").values_list(
            "provider__slug",
            "name",
            "input_usd_per_mtok",
            "output_usd_per_mtok",
            "cache_read_usd_per_mtok",
            "cache_write_usd_per_mtok",
            "per_request_usd",
            "max_output_tokens",
            "context_window",
            "max_image_tokens",
            "tokenizer",
            "prices_as_of",
        )
    )


def run(*args: str) -> str:
    out = StringIO()
    call_command("load_prices", *args, stdout=out)
    return out.getvalue()


# --- the shipped catalog ----------------------------------------------------------------------


def test_shipped_catalog_loads_with_every_model_priced_and_dated(shipped):
    result = load_catalog(data=shipped, overwrite=False)

    as_of = datetime.date.fromisoformat(shipped["prices_as_of"])
    assert result.prices_as_of == as_of
    assert len(result.created) == len(shipped["models"]) == Model.objects.count()
    assert not result.updated and not result.kept and not result.unchanged
    assert set(Provider.objects.values_list("slug", flat=True)) == {"openai", "anthropic", "echo"}
    for model in Model.objects.select_related("provider"):
        assert model.is_priced, model
        assert model.prices_as_of == as_of, model
        assert model.input_usd_per_mtok >= 0 and model.output_usd_per_mtok >= 0
        assert model.context_window or model.video_usd_per_second, model  # video models read prompts only
    # Decimal-exact: the stored value is exactly the string in the file.
    gpt4o_mini = Model.objects.get(provider__slug="openai", name="gpt-4o-mini")
    assert gpt4o_mini.cache_read_usd_per_mtok == Decimal("0.075")
    assert gpt4o_mini.cache_write_usd_per_mtok is None  # OpenAI bills cache writes as input


def test_shipped_catalog_has_the_echo_test_model_priced_like_a_premium_model(shipped):
    load_catalog(data=shipped, overwrite=False)
    echo = Model.objects.get(provider__slug="echo", name="echo-1")
    assert (echo.input_usd_per_mtok, echo.output_usd_per_mtok) == (Decimal(15), Decimal(75))
    assert (echo.cache_read_usd_per_mtok, echo.cache_write_usd_per_mtok) == (Decimal("1.5"), Decimal("18.75"))
    assert echo.max_output_tokens == 32000
    # Same rates as the hand-built "opus" in test_pricing: 1 input at the cache-write rate + 1 output.
    assert worst_case_nano(bound=TokenBound(input_tokens=1, output_tokens=1), rates=rates_for(model=echo)) == 93_750


def test_shipped_catalog_covers_both_real_providers(shipped):
    names = {(m["provider"], m["name"]) for m in shipped["models"]}
    for expected in [
        ("openai", "gpt-4o"),
        ("openai", "gpt-4.1"),
        ("openai", "gpt-5"),
        ("openai", "text-embedding-3-small"),
        ("anthropic", "claude-sonnet-4-5"),
        ("anthropic", "claude-haiku-4-5"),
        ("anthropic", "claude-opus-4-5"),
    ]:
        assert expected in names
    assert shipped["source"], "the catalog says where its prices come from"


# --- idempotence and operator edits -----------------------------------------------------------


def test_second_load_changes_nothing(shipped):
    load_catalog(data=shipped, overwrite=False)
    before = snapshot()

    for overwrite in (False, True):
        result = load_catalog(data=shipped, overwrite=overwrite)
        assert not result.created and not result.updated and not result.kept
        assert len(result.unchanged) == len(shipped["models"])
        assert snapshot() == before


def test_operator_edits_survive_a_reload_without_overwrite():
    load_catalog(data=small_catalog(), overwrite=False)
    Model.objects.filter(name="big").update(input_usd_per_mtok=Decimal("2.5"), max_output_tokens=1000)
    Provider.objects.filter(slug="acme").update(name="Acme (negotiated)")
    data = small_catalog()
    data["models"].append({"provider": "acme", "name": "new", "input": "1", "output": "2"})

    result = load_catalog(data=data, overwrite=False)

    assert [c.label for c in result.created] == ["acme/new"]
    assert [c.label for c in result.kept] == ["acme/big"]
    assert result.kept[0].changes == {
        "input": (Decimal("2.5"), Decimal("3")),
        "max_output_tokens": (1000, 64000),
    }
    assert [c.label for c in result.unchanged] == ["acme/small"]
    assert not result.updated
    big = Model.objects.get(name="big")
    assert big.input_usd_per_mtok == Decimal("2.5") and big.max_output_tokens == 1000
    assert Provider.objects.get(slug="acme").name == "Acme (negotiated)"


def test_overwrite_replaces_prices_limits_and_date():
    load_catalog(data=small_catalog(), overwrite=False)
    Model.objects.filter(name="big").update(input_usd_per_mtok=Decimal("2.5"), cache_write_usd_per_mtok=None)
    data = small_catalog()
    data["prices_as_of"] = "2026-02-01"
    data["models"][1]["output"] = "0.50"

    result = load_catalog(data=data, overwrite=True)

    assert sorted(c.label for c in result.updated) == ["acme/big", "acme/small"]
    assert not result.created and not result.kept and not result.unchanged
    big = Model.objects.get(name="big")
    assert big.input_usd_per_mtok == Decimal("3") and big.cache_write_usd_per_mtok == Decimal("3.75")
    small = Model.objects.get(name="small")
    assert small.output_usd_per_mtok == Decimal("0.50")
    assert {m.prices_as_of for m in Model.objects.all()} == {datetime.date(2026, 2, 1)}


def test_models_missing_from_the_file_are_left_alone():
    load_catalog(data=small_catalog(), overwrite=False)
    data = small_catalog()
    del data["models"][1]
    load_catalog(data=data, overwrite=True)
    assert Model.objects.filter(name="small").exists()


def test_dry_run_reports_without_saving():
    result = load_catalog(data=small_catalog(), overwrite=False, dry_run=True)
    assert len(result.created) == 2 and result.dry_run
    assert not Model.objects.exists() and not Provider.objects.exists()


# --- bad input --------------------------------------------------------------------------------


def _with(mutate) -> dict:
    data = copy.deepcopy(small_catalog())
    mutate(data)
    return data


@pytest.mark.parametrize(
    "mutate, model, field, fragment",
    [
        (lambda d: d["models"][0].update(input="-1"), "acme/big", "input", "greater than or equal to 0"),
        (lambda d: d["models"][0].update(output="ten"), "acme/big", "output", "Enter a number"),
        (lambda d: d["models"][0].update(output=1.5), "acme/big", "output", "decimal string"),
        (lambda d: d["models"][0].update(cache_read="NaN"), "acme/big", "cache_read", "Enter a number"),
        (lambda d: d["models"][0].update(cache_write="0.0000001"), "acme/big", "cache_write", "decimal places"),
        (lambda d: d["models"][0].update(input=None), "acme/big", "input", "not null"),
        (lambda d: d["models"][0].pop("output"), "acme/big", "output", "required"),
        (lambda d: d["models"][0].update(inptu="3"), "acme/big", "inptu", "unknown key"),
        (lambda d: d["models"][0].pop("name"), "models[0]", "name", "required"),
        (lambda d: d["models"][0].update(provider="nope"), "nope/big", "provider", "providers"),
        (
            lambda d: d["models"][0].update(max_output_tokens=-5),
            "acme/big",
            "max_output_tokens",
            "greater than or equal to 1",
        ),
        # A wrong encoding would under-count prompts: only the ones the gateway ships, or null.
        (lambda d: d["models"][0].update(tokenizer="gpt2"), "acme/big", "tokenizer", "o200k_base"),
        (lambda d: d["models"][0].update(tokenizer=""), "acme/big", "tokenizer", "or null"),
        (lambda d: d["models"][0].update(tokenizer=["o200k_base"]), "acme/big", "tokenizer", "or null"),
        (lambda d: d["models"][1].update(name="big"), "acme/big", "name", "twice"),
        (
            lambda d: d["models"][0].update(tiers=[{"above_input_tokens": 9, "input": "1"}, {"above_input_tokens": 9}]),
            "acme/big",
            "tiers",
            "each above the one before",
        ),
        (
            lambda d: d["models"][0].update(tiers=[{"above_input_tokens": 9, "inptu": "1"}]),
            "acme/big",
            "tiers",
            "inptu",
        ),
        (
            lambda d: d["models"][0].update(tiers=[{"above_input_tokens": 9, "input": 1.5}]),
            "acme/big",
            "tiers",
            "decimal",
        ),
        (
            lambda d: d["models"][0].update(tiers=[{"above_input_tokens": 9, "input": "-1"}]),
            "acme/big",
            "tiers",
            "input",
        ),
        (lambda d: d["models"][0].update(tiers={"above": 9}), "acme/big", "tiers", "list of tiers"),
        (lambda d: d.update(prices_as_of="Jan 2"), None, "prices_as_of", "YYYY-MM-DD"),
        (lambda d: d.update(extra=1), None, "extra", "unknown top-level key"),
    ],
)
def test_bad_input_names_the_model_and_field_and_changes_nothing(mutate, model, field, fragment):
    load_catalog(data=small_catalog(), overwrite=False)
    Model.objects.filter(name="big").update(input_usd_per_mtok=Decimal("2.5"))
    before = snapshot()
    data = _with(mutate)
    data["models"].append({"provider": "acme", "name": "would-be-new", "input": "1", "output": "2"})

    with pytest.raises(CatalogError) as caught:
        load_catalog(data=data, overwrite=True)

    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.model, error.field) == (model, field)
    assert fragment in str(error)
    assert snapshot() == before


def test_every_problem_is_reported_at_once():
    data = small_catalog()
    data["models"][0]["input"] = "-1"
    data["models"][1]["output"] = "x"
    with pytest.raises(CatalogError) as caught:
        load_catalog(data=data, overwrite=False)
    assert [(p.model, p.field) for p in caught.value.problems] == [("acme/big", "input"), ("acme/small", "output")]
    assert "2 problems" in str(caught.value)


# --- the command ------------------------------------------------------------------------------


def test_command_loads_the_shipped_catalog_and_prints_totals(shipped):
    out = run("--file", str(DEFAULT_CATALOG_PATH))
    count = len(shipped["models"])
    assert "created openai/gpt-4o: input 2.5, output 10, cache_read 1.25, cache_write -" in out
    assert "provider echo created" in out
    assert out.strip().splitlines()[-1] == (
        f"prices as of {shipped['prices_as_of']}: {count} created, 0 updated, 0 unchanged, 0 kept"
    )
    assert Model.objects.count() == count

    out = run("--file", str(DEFAULT_CATALOG_PATH))
    assert out.strip() == f"prices as of {shipped['prices_as_of']}: 0 created, 0 updated, {count} unchanged, 0 kept"


def test_command_file_overwrite_and_dry_run(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(small_catalog()))
    run("--file", str(path))
    Model.objects.filter(name="big").update(input_usd_per_mtok=Decimal("2.5"))

    out = run("--file", str(path))
    assert "kept acme/big (edited by an operator; --overwrite replaces it): input 2.5 (catalog 3)" in out
    assert out.strip().endswith("0 created, 0 updated, 1 unchanged, 1 kept")

    out = run("--file", str(path), "--overwrite", "--dry-run")
    assert "would be updated acme/big: input 2.5 -> 3" in out
    assert out.strip().endswith("0 created, 1 updated, 1 unchanged, 0 kept (dry run: nothing saved)")
    assert Model.objects.get(name="big").input_usd_per_mtok == Decimal("2.5")

    out = run("--file", str(path), "--overwrite")
    assert "updated acme/big: input 2.5 -> 3" in out
    assert Model.objects.get(name="big").input_usd_per_mtok == Decimal("3")


def test_command_rejects_a_bad_file_and_changes_nothing(tmp_path):
    run("--file", str(DEFAULT_CATALOG_PATH))
    before = snapshot()
    bad = _with(lambda d: d["models"][0].update(input="-3"))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))

    with pytest.raises(
        CommandError,
        match=r"(?s)acme/big field 'input': Ensure this value is greater than or equal to 0\..*Nothing was changed",
    ):
        run("--file", str(path), "--overwrite")
    assert snapshot() == before

    path.write_text("{not json")
    with pytest.raises(CommandError, match="not valid JSON"):
        run("--file", str(path))
    with pytest.raises(CommandError, match="cannot read"):
        run("--file", str(tmp_path / "missing.json"))
    assert snapshot() == before


def test_command_exits_non_zero_on_bad_input(tmp_path):
    import subprocess
    import sys

    from django.conf import settings

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with(lambda d: d["models"][0].pop("name"))))
    # Validation fails before the database is touched, so the real settings' DB is never written.
    proc = subprocess.run(
        [sys.executable, "manage.py", "load_prices", "--file", str(path)],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "models[0] field 'name': is required" in proc.stderr
