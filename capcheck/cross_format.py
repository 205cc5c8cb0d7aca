"""capcheck's cross-format scenario: chat requests, half of them streamed, on a route whose first
target speaks Anthropic's format (a pricier model, on a connection that cannot be reached) and
whose second is the run's echo connection. Each request is sized on its translated body at the
Anthropic target (gateway/translate/), fails over from it (a connect error: not billed, no row
of its own) to echo, and is recorded once at echo's bill for the model called. The address is
never reachable: loopback is refused as an upstream destination unless the operator allows it,
and where it is allowed the port is closed, so no traffic leaves the machine.
"""

from __future__ import annotations

from typing import Any

from capcheck.billing import problems
from capcheck.scenario import Build, Scenario
from catalog.models import Connection, Model, RouteTarget

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: closed on any host capcheck runs on


def _cross_format(build: Build) -> dict[str, Any]:
    model = build.model
    assert model.input_usd_per_mtok is not None and model.output_usd_per_mtok is not None
    pricey = Model.objects.create(
        provider=model.provider,
        name=f"{model.name}-claude",
        input_usd_per_mtok=model.input_usd_per_mtok * 2,
        output_usd_per_mtok=model.output_usd_per_mtok * 2,
        max_output_tokens=model.max_output_tokens,
    )
    anthropic = Connection.objects.create(
        organization=build.organization,
        name="capcheck-anthropic",
        kind="anthropic",
        base_url=UNREACHABLE,
        secret="capcheck-unreachable",
    )
    RouteTarget.objects.filter(route_id=build.route_id).update(position=1)
    RouteTarget.objects.create(route_id=build.route_id, connection=anthropic, model=pricey, position=0)
    return {}


CROSS_FORMAT = Scenario(
    name="cross-format",
    prepare=_cross_format,
    mode=lambda i: "stream" if i % 2 else "plain",
    books=problems,
)
