from decimal import Decimal

import pytest

from catalog.models import Connection, Model, Provider
from catalog.pricing import (
    TokenBound,
    Usage,
    cost_nano,
    rates_for,
    worst_case_nano,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def opus(db):
    provider = Provider.objects.create(slug="anthropic", name="Anthropic")
    return Model.objects.create(
        provider=provider,
        name="opus",
        input_usd_per_mtok=Decimal("15"),
        output_usd_per_mtok=Decimal("75"),
        cache_read_usd_per_mtok=Decimal("1.5"),
        cache_write_usd_per_mtok=Decimal("18.75"),
        max_output_tokens=32000,
    )


def test_worst_case_uses_the_most_expensive_input_rate_and_rounds_up(opus):
    rates = rates_for(model=opus)
    # 1 input token at the cache-write rate ($18.75/M = 18,750 nano) + 1 output ($75/M = 75,000)
    assert worst_case_nano(bound=TokenBound(input_tokens=1, output_tokens=1), rates=rates) == 93_750
    cheap = Model.objects.create(
        provider=opus.provider, name="tiny", input_usd_per_mtok=Decimal("0.0000001"), output_usd_per_mtok=Decimal("0")
    )
    # 1e-7 USD/M -> 1e-4 nano: a bound rounds up to 1, a cost rounds half-up to 0
    assert worst_case_nano(bound=TokenBound(input_tokens=1, output_tokens=0), rates=rates_for(model=cheap)) == 1
    assert cost_nano(usage=Usage(input_tokens=1), rates=rates_for(model=cheap)) == 0


def test_output_is_multiplied_by_choices(opus):
    rates = rates_for(model=opus)
    one = worst_case_nano(bound=TokenBound(input_tokens=0, output_tokens=100), rates=rates)
    assert worst_case_nano(bound=TokenBound(input_tokens=0, output_tokens=100, choices=3), rates=rates) == 3 * one


def test_actual_cost_prices_each_token_kind(opus):
    usage = Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=3000, cache_write_tokens=400)
    # 1000*15000 + 200*75000 + 3000*1500 + 400*18750 nano
    assert cost_nano(usage=usage, rates=rates_for(model=opus)) == 15_000_000 + 15_000_000 + 4_500_000 + 7_500_000


def test_negotiated_rates_override_list_prices(opus, acme):
    discounted = Connection(organization=acme.org, name="d", kind="anthropic", output_usd_per_mtok=Decimal("50"))
    assert rates_for(model=opus, connection=discounted).output == Decimal("50")
    assert rates_for(model=opus, connection=discounted).input == Decimal("15")


# --- prompt-size tiers ------------------------------------------------------------------------


def _tiered(provider, tiers):
    return Model.objects.create(
        provider=provider,
        name="tiered",
        input_usd_per_mtok=Decimal("2"),
        output_usd_per_mtok=Decimal("10"),
        cache_read_usd_per_mtok=Decimal("0.2"),
        price_tiers=tiers,
    )


def test_a_bound_takes_the_dearest_tier_it_can_reach_not_the_tier_of_the_bound(opus):
    # given: a middle tier dearer than the top one (a price shape no rule should assume away)
    model = _tiered(
        opus.provider,
        [
            {"above_input_tokens": 1000, "input": "5", "output": "40"},
            {"above_input_tokens": 2000, "input": "3", "output": "20"},
        ],
    )
    rates = rates_for(model=model)
    # when: a prompt of at most 3000 tokens, which may land in either tier
    bound = worst_case_nano(bound=TokenBound(input_tokens=3000, output_tokens=10), rates=rates)
    # then: bounded at the middle tier's rates, which a 1500-token prompt is billed at
    assert bound == 3000 * 5000 + 10 * 40_000
    assert cost_nano(usage=Usage(input_tokens=1500, output_tokens=10), rates=rates) == 1500 * 5000 + 10 * 40_000
    assert cost_nano(usage=Usage(input_tokens=2500, output_tokens=10), rates=rates) == 2500 * 3000 + 10 * 20_000
    # a tier's unlisted rate stays the base rate (cache reads here)
    assert cost_nano(usage=Usage(cache_read_tokens=2500), rates=rates) == 2500 * 200
    # control: bounding at the bound's own tier would be below the 1500-token prompt's bill
    top_only = rates_for(model=_tiered_top_only(opus.provider))
    assert worst_case_nano(bound=TokenBound(input_tokens=1500, output_tokens=10), rates=top_only) < 1500 * 5000


def _tiered_top_only(provider):
    return Model.objects.create(
        provider=provider,
        name="top-only",
        input_usd_per_mtok=Decimal("2"),
        output_usd_per_mtok=Decimal("10"),
        price_tiers=[{"above_input_tokens": 2000, "input": "3", "output": "20"}],
    )


def test_tiers_apply_to_the_service_tier_and_batch_multipliers_too(opus):
    from catalog.pricing import batch_rates

    model = _tiered(opus.provider, [{"above_input_tokens": 1000, "input": "4", "output": "30"}])
    model.priority_multiplier = Decimal(2)
    model.batch_multiplier = Decimal("0.5")
    priority = rates_for(model=model, tier="priority")
    assert priority.tiers[0].input == Decimal(8) and priority.tiers[0].output == Decimal(60)
    batch = batch_rates(rates=rates_for(model=model), model=model)
    assert worst_case_nano(bound=TokenBound(input_tokens=2000, output_tokens=0), rates=batch) == 2000 * 2000


@pytest.mark.parametrize(
    "kind, region, model_id, multiplier",
    [
        ("vertex", "us-east5", "claude-sonnet-4-5@20250929", "1.1"),
        ("vertex", "us", "claude-haiku-4-5@20251001", "1.1"),  # a multi-region location
        ("vertex", "europe-west1", "claude-opus-4-6", "1.1"),
        ("vertex", "us-east5", "claude-sonnet-5-5", "1.1"),  # every later model
        ("vertex", "global", "claude-sonnet-4-5@20250929", "1"),
        ("vertex", "us-east5", "claude-sonnet-4@20250514", "1"),  # released before the premium
        ("vertex", "us-east5", "claude-opus-4-1@20250805", "1"),
        ("vertex", "us-east5", "claude-3-7-sonnet@20250219", "1"),
        ("vertex", "us-east5", "gemini-2.5-pro", "1"),  # Gemini: one price on every location
        ("anthropic", "us-east5", "claude-sonnet-4-5", "1"),
        ("bedrock", "us-east-1", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", "1.1"),  # a geographic profile
        ("bedrock", "us-east-1", "anthropic.claude-haiku-4-5-20251001-v1:0", "1.1"),  # in-region
        ("bedrock", "us-east-1", "global.anthropic.claude-sonnet-4-5-20250929-v1:0", "1"),
        ("bedrock", "us-east-1", "us.anthropic.claude-sonnet-4-20250514-v1:0", "1"),
        ("bedrock", "us-east-1", "amazon.nova-pro-v1:0", "1"),
    ],
)
def test_off_the_global_endpoint_the_list_rates_of_claude_that_carries_the_premium_are_multiplied(
    opus, acme, kind, region, model_id, multiplier
):
    # given: the catalog's opus sent to the provider as `model_id` (the id decides the premium)
    conn = Connection.objects.create(
        organization=acme.org,
        name="c",
        kind=kind,
        options={"project": "p", "region": region, "model_ids": {"opus": model_id}},
    )
    opus.price_tiers = [{"above_input_tokens": 200_000, "input": "30", "output": "112.5"}]
    opus.save()

    rates = rates_for(model=opus, connection=conn)

    m = Decimal(multiplier)
    assert (rates.input, rates.output, rates.cache_read, rates.cache_write) == (
        15 * m,
        75 * m,
        Decimal("1.5") * m,
        Decimal("18.75") * m,
    )
    assert (rates.tiers[0].input, rates.tiers[0].output) == (30 * m, Decimal("112.5") * m)
    bound = TokenBound(input_tokens=1000, output_tokens=1000)
    assert worst_case_nano(bound=bound, rates=rates) == int((1000 * Decimal("18.75") + 1000 * 75) * m * 1000)


def test_negotiated_rates_are_the_connections_bill_and_carry_no_location_premium(opus, acme):
    # given: a us-east5 Vertex connection with a negotiated input rate, sending Claude Sonnet 4.5
    conn = Connection.objects.create(
        organization=acme.org,
        name="vx",
        kind="vertex",
        options={"project": "p", "region": "us-east5", "model_ids": {"opus": "claude-sonnet-4-5@20250929"}},
        input_usd_per_mtok=Decimal("12"),
    )

    rates = rates_for(model=opus, connection=conn)

    # then: the negotiated rate as set; the list rates it leaves with the premium
    assert (rates.input, rates.output) == (Decimal("12"), Decimal("75") * Decimal("1.1"))


def test_a_bedrock_catalog_price_that_is_already_regional_is_not_raised_again(opus, acme):
    regional = Model.objects.create(
        provider=opus.provider,
        name="regional.anthropic.claude-sonnet-4-5-20250929-v1:0",
        input_usd_per_mtok=Decimal("3.3"),
        output_usd_per_mtok=Decimal("16.5"),
    )
    conn = Connection.objects.create(
        organization=acme.org,
        name="br",
        kind="bedrock",
        options={"region": "us-east-1", "model_ids": {regional.name: "us.anthropic.claude-sonnet-4-5-20250929-v1:0"}},
    )

    rates = rates_for(model=regional, connection=conn)

    assert (rates.input, rates.output) == (Decimal("3.3"), Decimal("16.5"))
