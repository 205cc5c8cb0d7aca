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
