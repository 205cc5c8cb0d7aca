"""capcheck's plan and the shapes every part of a run shares: the numbers a run is asked to
prove (`Plan`), the request shape that makes the gateway reserve and echo bill exactly those
numbers (`Tokens`), one request and what its client was told (`Sent`), and one run's fresh
organization (`Setup`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal

from capcheck.scenario import CHAT, MESSAGES
from capcheck.scenarios import NAMES as SCENARIOS
from core.errors import CapgateError
from gateway.admission.bounds import shape_chat
from tenants.models import Organization

# The run's catalog model is priced here so worst and actual costs are exact and independent
# of the shared catalog: nano-USD per token at $15 / $75 per 1M tokens (no cache prices, so the
# most expensive input rate is the plain one).
INPUT_USD, OUTPUT_USD = Decimal(15), Decimal(75)
INPUT_NANO, OUTPUT_NANO = 15_000, 75_000


class CapcheckError(CapgateError):
    def __init__(self, message: str):
        super().__init__(message, code="capcheck_error", status=400)


@dataclass(frozen=True)
class Plan:
    url: str
    scenarios: tuple[str, ...] = SCENARIOS
    concurrency: tuple[int, ...] = (50, 200, 500)
    cap_nano: int = 1_000_000_000
    key_cap_nano: int = 300_000_000  # multi: key A, per day
    project_cap_nano: int = 500_000_000  # multi: keys A and B's project
    worst_nano: int = 37_000_000
    actual_nano: int = 12_000_000
    delay_ms: int = 100  # echo: time before the response (or the first stream chunk)
    chunk_delay_ms: int = 50
    chunks: int = 4
    request_timeout: float = 120.0
    settle_timeout: float = 60.0
    sample_interval: float = 0.01
    keep: bool = False
    # db-restart only: the scripts/pg-cluster.sh cluster serving the gateway's database, which
    # the operator allows capcheck to restart, and how long it stays down.
    restart_db_cluster: str = ""
    restart_seconds: float = 6.0
    # The connection kind the run's route calls (capcheck/kinds.py): the built-in echo, or
    # any other kind at `upstream_url` (a fake provider that takes its bill from X-Upstream-*
    # headers, tests/upstream/server.py), with that kind's secret and options.
    kind: str = "echo"
    upstream_url: str = ""
    connection_secret: str = ""
    connection_options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Tokens:
    """Request shape that makes the gateway's worst case and the echo's bill what the plan asks."""

    max_tokens: int  # sent by the client: the output half of the worst case
    input_bound: int  # the gateway's byte bound on input tokens, reached by padding the prompt
    prompt: int  # what echo reports
    completion: int

    @classmethod
    def for_plan(cls, plan: Plan) -> Tokens:
        if not 0 < plan.actual_nano <= plan.worst_nano:
            raise CapcheckError("Need 0 < actual <= worst per request.")
        max_tokens = max(1, plan.worst_nano * 4 // 5 // OUTPUT_NANO)
        input_bound = math.ceil((plan.worst_nano - max_tokens * OUTPUT_NANO) / INPUT_NANO)
        completion = min(max_tokens, max(1, plan.actual_nano // 2 // OUTPUT_NANO))
        prompt = max(0, round((plan.actual_nano - completion * OUTPUT_NANO) / INPUT_NANO))
        return cls(max_tokens=max_tokens, input_bound=input_bound, prompt=prompt, completion=completion)

    @property
    def worst_nano(self) -> int:
        return self.input_bound * INPUT_NANO + self.max_tokens * OUTPUT_NANO

    @property
    def actual_nano(self) -> int:
        return self.prompt * INPUT_NANO + self.completion * OUTPUT_NANO

    def body(self, model: str, *, stream: bool) -> dict:
        """A chat body padded so the gateway's input bound is exactly `input_bound`."""

        def make(pad: int) -> dict:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "x" * pad}],
                "max_tokens": self.max_tokens,
            }
            return {**body, "stream": True} if stream else body

        base = shape_chat(make(0)).text_tokens
        if base > self.input_bound:
            raise CapcheckError(
                f"The worst case cannot cover the request body's own {base}-token input bound: raise --worst-usd."
            )
        body = make(self.input_bound - base)
        assert shape_chat(body).text_tokens == self.input_bound
        return body


@dataclass
class Sent:
    """One request and what its client was told (status 0: no response arrived)."""

    index: int
    key: str
    mode: str  # plain | stream | disconnect (leaves after the first chunk) | fault
    status: int = 0
    code: str = ""
    request_id: str = ""
    latency_s: float = 0.0
    error: str = ""


@dataclass
class Setup:
    scenario: str
    concurrency: int
    organization: Organization
    route: str
    keys: dict[str, str]  # label -> raw key
    connection_id: int
    tokens: Tokens
    # Set by a scenario's `prepare` (capcheck/scenarios.py): endpoint, extra body fields
    # and headers.
    path: str = CHAT
    body_extra: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    served_model: str = ""
    # A batch scenario's line routes, one line each (default: one line on `route`).
    batch_routes: tuple[str, ...] = ()
    # The header that makes the run's provider answer 500 (mode "fault").
    fault_header: tuple[str, str] = ("x-capgate-echo-fail", "500")

    def body(self, *, stream: bool) -> dict:
        """The body every request of the run sends: the plan's chat shape plus the scenario's
        extra fields (Anthropic's Messages API has no `n`)."""
        out = {**self.tokens.body(self.route, stream=stream), **self.body_extra}
        if self.path == MESSAGES:
            out.pop("n", None)
        return out
