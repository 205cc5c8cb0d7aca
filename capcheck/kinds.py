"""capcheck on any connection kind: the run's route calls a connection of the plan's kind instead
of the built-in echo, so the four properties are checked through that kind's adapter (its
request, signature or token, its stream format, its usage).

The provider at `upstream_url` must bill what the run asks: the fake provider
(tests/upstream/server.py) takes its numbers from the X-Upstream-* headers each request carries
(forwarded only on a connection whose options say `forward_test_headers`). A kind whose adapter
does not serve chat completions is called on /v1/messages. Only the core scenarios run on a kind
other than echo; the others check echo's own bill (paid features, jobs) or its fault switches.
"""

from __future__ import annotations

from typing import Any

from capcheck.plan import CapcheckError, Plan, Tokens
from capcheck.scenario import CHAT, MESSAGES
from catalog.models import Connection
from catalog.services import create_connection
from core.errors import InvalidChange
from gateway import providers
from tenants.audit import Actor
from tenants.models import Organization

CORE = ("basic", "stream", "multi", "failures")
ACTOR = Actor(label="capcheck")


def check_plan(plan: Plan) -> None:
    if plan.kind == "echo":
        return
    if providers.adapter_for(plan.kind) is None or plan.kind not in Connection.Kind.values:
        raise CapcheckError(f"Unknown connection kind '{plan.kind}' (choose from {', '.join(Connection.Kind.values)}).")
    if not plan.upstream_url:
        raise CapcheckError(f"--kind {plan.kind} calls a provider: name it with --upstream-url.")
    others = [s for s in plan.scenarios if s not in CORE]
    if others:
        raise CapcheckError(f"On --kind {plan.kind} only the core scenarios run ({', '.join(CORE)}), not {others}.")


def connection(*, plan: Plan, organization: Organization, tokens: Tokens, echo_options: dict) -> Connection:
    """The run's connection: echo with the run's numbers, or one of the plan's kind (checked and
    created as any connection is, destination rules included)."""
    if plan.kind == "echo":
        return Connection.objects.create(
            organization=organization, name="echo", kind=Connection.Kind.ECHO, options=echo_options
        )
    try:
        return create_connection(
            organization=organization,
            actor=ACTOR,
            name=plan.kind,
            kind=plan.kind,
            base_url=plan.upstream_url,
            secret=plan.connection_secret,
            options={**plan.connection_options, "forward_test_headers": True},
        )
    except InvalidChange as exc:
        raise CapcheckError(f"The {plan.kind} connection: {exc.message}") from None


def overrides(*, plan: Plan, tokens: Tokens) -> dict[str, Any]:
    """What a run on another kind sends: the fake's bill in headers, the endpoint the kind serves."""
    if plan.kind == "echo":
        return {}
    adapter = providers.adapter_for(plan.kind)
    assert adapter is not None
    headers = {
        "x-upstream-prompt-tokens": str(tokens.prompt),
        "x-upstream-completion-tokens": str(tokens.completion),
        "x-upstream-delay-ms": str(plan.delay_ms),
        "x-upstream-chunk-delay-ms": str(plan.chunk_delay_ms),
        "x-upstream-chunks": str(plan.chunks),
    }
    return {
        "headers": headers,
        "path": CHAT if "chat" in adapter.endpoints else MESSAGES,
        "fault_header": ("x-upstream-fail", "500"),
    }
