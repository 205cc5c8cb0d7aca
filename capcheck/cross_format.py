"""capcheck's cross-format scenario: chat requests, half of them streamed, on a route whose first
target speaks Anthropic's format (a pricier model, on a connection that cannot be reached) and
whose second is the run's echo connection. Each request is sized on its translated body at the
Anthropic target (gateway/translate/), fails over from it (a connect error: not billed, no row
of its own) to echo, and is recorded once at echo's bill for the model called. Its variant
(cross-format-converse) has a Bedrock connection on the Converse API first, signed as any. The address is
never reachable: loopback is refused as an upstream destination unless the operator allows it,
and where it is allowed the port is closed, so no traffic leaves the machine.
"""

from __future__ import annotations

import json
from typing import Any

from capcheck.billing import problems
from capcheck.scenario import Build, Scenario
from catalog.models import Connection, Model, RouteTarget

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: closed on any host capcheck runs on


def _cross_format(build: Build) -> dict[str, Any]:
    return _first_target(
        build,
        suffix="claude",
        kind="anthropic",
        secret="capcheck-unreachable",
        options={},
    )


def _cross_format_converse(build: Build) -> dict[str, Any]:
    # The keys only sign: the address is closed, so nothing is sent with them.
    keys = json.dumps({"access_key_id": "AKIDCAPCHECKUNREACHABLE", "secret_access_key": "capcheck-unreachable"})
    return _first_target(
        build,
        suffix="llama",
        kind="bedrock",
        secret=keys,
        options={"region": "us-east-1", "api": "converse"},
    )


def _first_target(build: Build, *, suffix: str, kind: str, secret: str, options: dict[str, Any]) -> dict[str, Any]:
    model = build.model
    assert model.input_usd_per_mtok is not None and model.output_usd_per_mtok is not None
    pricey = Model.objects.create(
        provider=model.provider,
        name=f"{model.name}-{suffix}",
        input_usd_per_mtok=model.input_usd_per_mtok * 2,
        output_usd_per_mtok=model.output_usd_per_mtok * 2,
        max_output_tokens=model.max_output_tokens,
    )
    first = Connection.objects.create(
        organization=build.organization,
        name=f"capcheck-{kind}",
        kind=kind,
        base_url=UNREACHABLE,
        secret=secret,
        options=options,
    )
    RouteTarget.objects.filter(route_id=build.route_id).update(position=1)
    RouteTarget.objects.create(route_id=build.route_id, connection=first, model=pricey, position=0)
    return {}


CROSS_FORMAT = Scenario(
    name="cross-format",
    prepare=_cross_format,
    mode=lambda i: "stream" if i % 2 else "plain",
    books=problems,
)
# The same with the first target a Bedrock connection on the Converse API (its own format).
CROSS_FORMAT_CONVERSE = Scenario(
    name="cross-format-converse",
    prepare=_cross_format_converse,
    mode=lambda i: "stream" if i % 2 else "plain",
    books=problems,
)
