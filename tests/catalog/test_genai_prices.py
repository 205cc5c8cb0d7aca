"""The default catalog: today's prices from genai-prices, each model loaded with every price a
bound needs or skipped with the reason; reloads follow the catalog and keep operator edits."""

import copy
import datetime
import json
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from genai_prices.data import providers as genai_providers
from genai_prices.types import (
    ClauseEquals,
    ConditionalPrice,
    ModelInfo,
    ModelPrice,
    PriceVariant,
    StartDateConstraint,
    Tier,
    TieredPrices,
)

from catalog import genai
from catalog.genai import Skip, genai_catalog, model_entry
from catalog.models import Connection, Model, Provider
from catalog.prices import DEFAULT_CATALOG_PATH, load_catalog, read_catalog
from catalog.pricing import TokenBound, Usage, cost_nano, rates_for, worst_case_nano
from catalog.services import set_model_price
from tenants.models import AuditLogEntry

pytestmark = pytest.mark.django_db

AT = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
PUBLISHED = Path(__file__).parent / "data" / "published_prices.json"


def run(*args: str) -> str:
    out = StringIO()
    call_command("load_prices", *args, stdout=out)
    return out.getvalue()


def catalog(at: datetime.datetime = AT):
    return genai_catalog(at=at, overlay=read_catalog(DEFAULT_CATALOG_PATH))


def info(prices, **kwargs) -> ModelInfo:
    return ModelInfo(id="m", match=ClauseEquals(equals="m"), prices=prices, **kwargs)


# --- the default load -------------------------------------------------------------------------


def test_load_prices_on_a_fresh_database_prices_500_models_of_10_providers_and_says_why_it_skips():
    # when
    out = run()

    # then: at least 500 models of at least 10 providers, every one priced
    loaded = Model.objects.select_related("provider")
    assert loaded.count() >= 500
    assert Provider.objects.filter(models__isnull=False).distinct().count() >= 10
    assert all(m.is_priced for m in loaded)
    # every genai-prices model is either loaded or listed as skipped, with a reason
    skipped = {}
    for line in out.splitlines():
        if line.startswith("skipped "):
            label, _, reason = line.removeprefix("skipped ").partition(": ")
            assert reason.strip(), line
            skipped[label] = reason
    names = {str(m) for m in loaded}
    for provider in genai_providers:
        for model in provider.models:
            label = f"{provider.id}/{model.id}"
            assert (label in names) != (label in skipped), label
    assert skipped, "genai-prices has models capgate cannot bound"
    # the overlay's own models (the echo test model, video) are there too, with its limits
    echo = Model.objects.get(provider__slug="echo", name="echo-1")
    assert (echo.input_usd_per_mtok, echo.max_output_tokens) == (Decimal(15), 32000)
    gpt4o = Model.objects.get(provider__slug="openai", name="gpt-4o")
    assert (gpt4o.max_output_tokens, gpt4o.tokenizer, gpt4o.max_image_tokens) == (16384, "o200k_base", 1445)
    totals = out.strip().splitlines()[-1]
    assert f"{len(skipped)} skipped (genai-prices 0.2.3: {loaded.count()} models of " in totals

    # a second load changes nothing
    before = list(Model.objects.order_by("id").values())
    assert " 0 created, 0 updated, " in run().strip().splitlines()[-1]
    assert list(Model.objects.order_by("id").values()) == before


def test_published_prices_match_what_is_loaded():
    """A sample of the providers' own published prices (tests/catalog/data/published_prices.json,
    with its date and sources) against the loaded catalog, tiers included."""
    data, _ = catalog()
    load_catalog(data=data, overwrite=False)
    published = json.loads(PUBLISHED.read_text())
    assert published["recorded_on"] and set(published["sources"]) == {"anthropic", "openai", "google"}
    for row in published["prices"]:
        provider, _, name = row["model"].partition("/")
        model = Model.objects.get(provider__slug=provider, name=name)
        rates = rates_for(model=model)
        above = row.get("above_input_tokens")
        tier = next((t for t in rates.tiers if t.above == above), None) if above else rates
        assert tier is not None, f"{row['model']} has no tier above {above}"
        for key in ("input", "output", "cache_read", "cache_write", "cache_write_1h"):
            if key in row:
                assert getattr(tier, key) == Decimal(row[key]), (row["model"], above, key)


def test_vertex_claude_is_priced_at_googles_published_rate_for_the_connections_location():
    """Google's regional premium on Claude (published_prices.json, `vertex_regional`): a Vertex
    connection's region decides the rates, every token rate 10% above the global price off the
    global endpoint for Claude Sonnet 4.5 and later, one price everywhere for older Claude."""
    data, _ = catalog()
    load_catalog(data=data, overwrite=False)
    published = json.loads(PUBLISHED.read_text())["vertex_regional"]
    assert published["recorded_on"] and published["source"] and published["premium_percent"] == "10"
    for row in published["prices"]:
        provider, _, name = row["model"].partition("/")
        model = Model.objects.get(provider__slug=provider, name=name)
        connection = Connection(kind="vertex", options={"project": "p", "region": row["region"]})
        rates = rates_for(model=model, connection=connection)
        for key in ("input", "output", "cache_read", "cache_write", "cache_write_1h"):
            if key in row:
                assert getattr(rates, key) == Decimal(row[key]), (row["model"], row["region"], key)


def test_bedrock_claude_is_priced_at_the_published_rate_for_the_id_it_is_sent_as():
    """AWS's regional premium on Claude (published_prices.json, `bedrock_regional`): a route to
    the global price called by a geographic profile (us., eu.) or in-region id is billed 10%
    above it; a catalog price that is already the regional one is not raised again."""
    data, _ = catalog()
    load_catalog(data=data, overwrite=False)
    published = json.loads(PUBLISHED.read_text())["bedrock_regional"]
    assert published["recorded_on"] and published["source"] and published["premium_percent"] == "10"
    for row in published["prices"]:
        provider, _, name = row["model"].partition("/")
        model = Model.objects.get(provider__slug=provider, name=name)
        connection = Connection(kind="bedrock", options={"region": "us-east-1", "model_ids": {name: row["sent_as"]}})
        rates = rates_for(model=model, connection=connection)
        for key in ("input", "output", "cache_read", "cache_write"):
            if key in row:
                assert getattr(rates, key) == Decimal(row[key]), (row["model"], row["sent_as"], key)


# --- tiers: worst case at the dearest reachable tier, cost at the one that applied ------------


def test_a_tiered_model_is_bounded_at_its_highest_reachable_tier_and_billed_at_the_tier_that_applied():
    data, _ = catalog()
    load_catalog(data=data, overwrite=False)
    model = Model.objects.get(provider__slug="anthropic", name="claude-sonnet-4-5")
    assert model.price_tiers == [
        {
            "above_input_tokens": 200000,
            "input": "6",
            "output": "22.5",
            "cache_read": "0.6",
            "cache_write": "7.5",
            "cache_write_1h": "12",
        }
    ]
    rates = rates_for(model=model)

    # a prompt that could cross 200K tokens is bounded at the long-context rates, 1h writes included
    long = TokenBound(input_tokens=300_000, output_tokens=1000, cache_1h=True)
    assert worst_case_nano(bound=long, rates=rates) == 300_000 * 12_000 + 1000 * 22_500
    short = TokenBound(input_tokens=100_000, output_tokens=1000)
    assert worst_case_nano(bound=short, rates=rates) == 100_000 * 3_750 + 1000 * 15_000

    # the bill: the tier the reported prompt fell in
    assert cost_nano(usage=Usage(input_tokens=150_000, output_tokens=10), rates=rates) == 150_000 * 3_000 + 150_000
    above = Usage(input_tokens=150_000, cache_read_tokens=60_000, output_tokens=10)
    assert cost_nano(usage=above, rates=rates) == 150_000 * 6_000 + 60_000 * 600 + 10 * 22_500

    # control: without its tiers the same bound is below what the long prompt is billed
    model.price_tiers = []
    flat = rates_for(model=model)
    billed = cost_nano(usage=Usage(input_tokens=300_000, output_tokens=1000), rates=rates)
    assert worst_case_nano(bound=TokenBound(input_tokens=300_000, output_tokens=1000), rates=flat) < billed


def test_tier_thresholds_of_different_rates_become_one_list():
    prices = ModelPrice(
        input_mtok=TieredPrices(base=Decimal(1), tiers=[Tier(start=32000, price=Decimal(2))]),
        output_mtok=TieredPrices(base=Decimal(4), tiers=[Tier(start=128000, price=Decimal(8))]),
        cache_read_mtok=Decimal("0.1"),
    )
    entry = model_entry(info(prices), AT)
    assert entry["tiers"] == [
        {"above_input_tokens": 32000, "input": "2", "output": "4", "cache_read": "0.1"},
        {"above_input_tokens": 128000, "input": "2", "output": "8", "cache_read": "0.1"},
    ]


# --- variants, dates and hours ----------------------------------------------------------------


def test_variants_become_multipliers_and_a_mixed_one_takes_its_largest_multiple():
    data, _ = catalog()
    by_name = {(m["provider"], m["name"]): m for m in data["models"]}
    gpt4o = by_name[("openai", "gpt-4o")]
    # priority: every rate at 1.7x. Batch: input and output at half price, but cached input has no
    # batch price (it stays $1.25), so the only multiple never below the provider's bill is 1.
    assert (gpt4o["priority_multiplier"], gpt4o["batch_multiplier"]) == ("1.7", "1")
    # gpt-5.4 flex: input and output at half price, cache reads at 0.13 of 0.25 (0.52): the
    # largest multiple, so a flex request is never bounded or billed below the provider's price
    assert by_name[("openai", "gpt-5.4")]["flex_multiplier"] == "0.52"
    assert by_name[("anthropic", "claude-sonnet-4-5")]["batch_multiplier"] == "0.5"


def test_a_price_that_rises_later_is_skipped_until_it_starts_and_a_later_cut_keeps_todays_price():
    old, new = (
        ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2)),
        ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(3)),
    )
    rise = info(
        [ConditionalPrice(prices=old), ConditionalPrice(StartDateConstraint(datetime.date(2027, 1, 1)), prices=new)]
    )
    with pytest.raises(Skip, match="rises on 2027-01-01"):
        model_entry(rise, AT)
    assert model_entry(rise, datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC))["output"] == "3"
    cut = info(
        [ConditionalPrice(prices=new), ConditionalPrice(StartDateConstraint(datetime.date(2027, 1, 1)), prices=old)]
    )
    assert model_entry(cut, AT)["output"] == "3"
    # in the shipped data: Google's flash models rise on 2027-01-01
    _, skipped = catalog()
    assert {s.label: s.reason for s in skipped}["google/gemini-3.6-flash"].startswith("its price rises on 2027-01-01")


def test_daily_hours_prices_load_the_dearest_rate_of_the_day():
    data, _ = catalog()
    chat = next(m for m in data["models"] if (m["provider"], m["name"]) == ("deepseek", "deepseek-chat"))
    assert (chat["input"], chat["cache_read"], chat["output"]) == ("0.27", "0.07", "1.1")


@pytest.mark.parametrize(
    "prices, reason",
    [
        (ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2), output_image_mtok=Decimal(30)), "image output"),
        (ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2), input_mchars=Decimal(1)), "input_mchars"),
        (ModelPrice(input_mtok=Decimal(1)), "no output price"),
        (ModelPrice(audio_hours=Decimal(1)), "not priced per token"),
        (ModelPrice(), "no price"),
    ],
)
def test_a_price_shape_capgate_cannot_bound_is_skipped_with_its_reason(prices, reason):
    with pytest.raises(Skip, match=reason):
        model_entry(info(prices), AT)


def test_an_embedding_bills_input_only_and_a_price_finer_than_the_columns_is_rounded_up():
    entry = model_entry(
        ModelInfo(
            id="embed-x", match=ClauseEquals(equals="embed-x"), prices=ModelPrice(input_mtok=Decimal("0.0200001"))
        ),
        AT,
    )
    assert (entry["input"], entry["output"]) == ("0.020001", "0")


def test_a_model_with_its_own_image_token_price_gets_no_image_bound_from_the_overlay():
    prices = ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2), input_image_mtok=Decimal(5))
    entry = model_entry(info(prices), AT)
    assert entry["_own_image_price"] is True
    variant = info(
        prices,
        price_variants=[PriceVariant(when={"processing": "batch"}, prices=ModelPrice(input_mtok=Decimal("0.5")))],
    )
    assert model_entry(variant, AT)["batch_multiplier"] == "1"  # output stays at the standard price


# --- a new version: the diff, the audit and operator edits ------------------------------------


def _new_version(monkeypatch) -> None:
    """genai-prices as a later version might ship it: gpt-4.1's input and gpt-4o's output change."""
    changed = copy.deepcopy(genai_providers)
    openai = next(p for p in changed if p.id == "openai")
    for model in openai.models:
        if model.id == "gpt-4.1":
            model.prices = ModelPrice(**{**vars(model.get_prices(AT)), "input_mtok": Decimal("1.80")})
            model.price_variants = None
        if model.id == "gpt-4o":
            model.prices = ModelPrice(**{**vars(model.get_prices(AT)), "output_mtok": Decimal("9")})
    monkeypatch.setattr(genai, "genai_providers", changed)


def test_check_prints_what_a_new_version_would_change_and_changes_nothing(monkeypatch):
    run()
    before = list(Model.objects.order_by("id").values())
    audit_rows = AuditLogEntry.objects.count()
    _new_version(monkeypatch)

    out = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("load_prices", "--check", stdout=out)

    assert exited.value.code == 1
    lines = out.getvalue().strip().splitlines()
    assert (
        "would be updated openai/gpt-4.1: input 2 -> 1.8, priority_multiplier 1.75 -> -, batch_multiplier 1 -> -"
        in lines
    )
    assert "would be updated openai/gpt-4o: output 10 -> 9, priority_multiplier 1.7 -> 1.8889" in lines
    assert len(lines) == 3 and lines[-1].endswith("(dry run: nothing saved)")
    assert list(Model.objects.order_by("id").values()) == before
    assert AuditLogEntry.objects.count() == audit_rows
    # nothing new: --check says so and exits 0
    monkeypatch.undo()
    assert run("--check").strip().splitlines()[-1].startswith("prices as of")


def test_a_new_version_updates_what_nobody_edited_keeps_operator_edits_and_audits_each_change(monkeypatch):
    # given: the catalog loaded, and an operator's price for gpt-4o's input
    run()
    assert AuditLogEntry.objects.filter(organization=None, actor="load_prices", action="create").count() >= 500
    set_model_price(ref="openai/gpt-4o", input_usd_per_mtok=Decimal("2.25"))
    _new_version(monkeypatch)

    # when
    out = run()

    # then: the new prices are in; the operator's edit survived and is reported
    gpt4o = Model.objects.get(provider__slug="openai", name="gpt-4o")
    assert (gpt4o.input_usd_per_mtok, gpt4o.output_usd_per_mtok) == (Decimal("2.25"), Decimal(9))
    assert Model.objects.get(provider__slug="openai", name="gpt-4.1").input_usd_per_mtok == Decimal("1.8")
    assert "updated openai/gpt-4o: output 10 -> 9, priority_multiplier 1.7 -> 1.8889" in out
    assert "kept openai/gpt-4o (edited by an operator; --overwrite replaces it): input 2.25 (catalog 2.5)" in out
    update = AuditLogEntry.objects.get(
        organization=None, actor="load_prices", action="update", object_repr="openai/gpt-4o"
    )
    assert update.changes == {"output": ["10", "9"], "priority_multiplier": ["1.7", "1.8889"]}

    # and a later load keeps the edit while the catalog's other values stay applied
    out = run()
    assert "kept openai/gpt-4o" in out
    assert Model.objects.get(provider__slug="openai", name="gpt-4o").input_usd_per_mtok == Decimal("2.25")

    # --overwrite replaces the edit with the catalog's price
    run("--overwrite")
    assert Model.objects.get(provider__slug="openai", name="gpt-4o").input_usd_per_mtok == Decimal("2.5")
