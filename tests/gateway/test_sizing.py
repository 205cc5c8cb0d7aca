"""Sizing over a route (gateway/admission/sizing.py): the worst case is the most expensive target the
request could fail over to, and a caller who makes the call itself (the reservation API) gets
a 402 for an unpriced target anywhere in the route. Moved from tests/catalog/test_pricing.py
when catalog.pricing.worst_case_over_route gave way to gateway.admission.sizing.size."""

from decimal import Decimal

import pytest

from catalog.models import Connection, Model, Provider
from catalog.pricing import TokenBound, rates_for, worst_case_nano
from gateway.admission.bounds import Shape
from gateway.admission.routing import Target
from gateway.admission.sizing import size
from gateway.http.errors import GatewayError

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


def _shape(model: str) -> Shape:
    return Shape(
        kind="chat",
        model=model,
        text_tokens=10,
        images=0,
        unbounded_parts=0,
        max_output=10,
        output_param=None,
        choices=1,
        stream=False,
    )


def test_the_route_takes_the_most_expensive_target(opus, acme):
    discounted = Connection(organization=acme.org, name="d", kind="anthropic", output_usd_per_mtok=Decimal("50"))
    listed = Connection(organization=acme.org, name="l", kind="anthropic")
    targets = [Target(connection=discounted, model=opus), Target(connection=listed, model=opus)]
    for proxied in (True, False):
        sized = size(key=acme.key, shape=_shape("opus"), targets=targets, budgets=[], proxied=proxied)
        assert sized.worst_nano == worst_case_nano(
            bound=TokenBound(input_tokens=10, output_tokens=10), rates=rates_for(model=opus)
        )


def test_an_unpriced_target_anywhere_in_the_route_is_refused_when_the_caller_calls_it(opus, acme):
    free = Model.objects.create(provider=opus.provider, name="mystery")
    conn = Connection(organization=acme.org, name="l", kind="anthropic")
    targets = [Target(connection=conn, model=opus), Target(connection=conn, model=free)]
    with pytest.raises(GatewayError) as refused:
        size(key=acme.key, shape=_shape("opus"), targets=targets, budgets=[], proxied=False)
    assert (refused.value.status, refused.value.code) == (402, "unpriced_model_under_budget")
