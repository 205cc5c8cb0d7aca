"""Prices to nano-USD: the only place USD-per-1M-token Decimals become integer money.

Worst cases round *up* (a bound must never be below what could be billed); actual costs round
half-up. Both return ints of nano-USD. Converting and formatting amounts is `core/money.py`'s.
"""

import dataclasses
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import cast

from catalog.models import Connection, Model
from core.guards import Guards
from core.money import NANO_PER_USD

# USD per 1M tokens -> nano-USD per token: * 1e9 / 1e6.
_NANO_PER_TOKEN_PER_USD_PER_MTOK = Decimal(1000)
_NANO_PER_USD = Decimal(NANO_PER_USD)
RATE_FIELDS = ("input", "output", "cache_read", "cache_write")


class UnpricedModel(Exception):
    """The model (on some target of the route) has no input or output price."""

    def __init__(self, model: Model):
        super().__init__(f"model {model} has no price")
        self.model = model


class UnpricedFeature(Exception):
    """The request asks for a paid feature (a service tier, web search, 1-hour cache writes, a
    long-context band) that the model's catalog entry does not price."""

    def __init__(self, model: Model | str, feature: str):
        super().__init__(f"model {model} has no price for {feature}")
        self.model = str(model)
        self.feature = feature


@dataclass(frozen=True)
class Rates:
    """Effective USD-per-1M-token rates for one (connection, model) target, with the request's
    service tier already applied."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    per_request: Decimal
    cache_write_1h: Decimal | None = None  # None: 1-hour cache writes are not priced
    web_search_per_use: Decimal | None = None  # USD per search; None: not priced
    server_tool_result_tokens: int | None = None  # input tokens one search may add
    # Prompt-size tiers, ascending: above a tier's threshold every token of the request is billed
    # at that tier's rates (the providers' "cliff" rule, not a marginal one).
    tiers: tuple["Tier", ...] = ()
    model: str = ""  # "provider/name", for errors

    @property
    def max_input(self) -> Decimal:
        # The most expensive way the provider could bill an input token (e.g. a cache write).
        return max(self.input, self.cache_read, self.cache_write)


@dataclass(frozen=True)
class Tier:
    """The token rates of a request whose prompt (input + cache reads + cache writes) has more
    than `above` tokens, with the request's service tier applied."""

    above: int
    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    cache_write_1h: Decimal | None


@dataclass(frozen=True)
class TokenBound:
    """An upper bound on what one request can be billed for, in tokens and paid uses."""

    input_tokens: int
    output_tokens: int  # per choice
    choices: int = 1
    web_searches: int = 0  # server-side searches the request allows (max_uses)
    cache_1h: bool = False  # the request may write 1-hour cache entries


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0  # 5-minute (or unspecified) cache writes
    cache_write_1h_tokens: int = 0
    web_search_requests: int = 0
    service_tier: str | None = None  # the tier the provider says served the request
    speed: str | None = None  # Anthropic: the speed the provider says served it ("fast" | "standard")
    # Paid features the provider reported that capgate cannot price (audio tokens, an unknown
    # server tool): the record is charged no less than its worst case and says why.
    unpriced: tuple[str, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens + self.cache_write_1h_tokens


# Tiers priced at the model's standard rates, by the name each provider uses.
STANDARD_TIERS = frozenset({"", "default", "standard", "standard_only"})
_TIER_FIELDS = {"priority": "priority_multiplier", "fast": "priority_multiplier", "flex": "flex_multiplier"}


def tier_multiplier(model: Model, tier: str | None) -> Decimal:
    """The price multiplier of a service tier; UnpricedFeature if the catalog has none."""
    if tier is None or tier in STANDARD_TIERS:
        return Decimal(1)
    attr = _TIER_FIELDS.get(tier)
    value = getattr(model, attr) if attr else None
    if value is None:
        raise UnpricedFeature(model, f"service_tier {tier!r}")
    return cast(Decimal, value)


def speed_multiplier(model: Model, speed: str | None) -> Decimal:
    """The price multiplier of Anthropic's fast mode; UnpricedFeature if the catalog has none."""
    if speed in (None, "standard"):
        return Decimal(1)
    if speed != "fast" or model.fast_mode_multiplier is None:
        raise UnpricedFeature(model, "fast mode")
    return cast(Decimal, model.fast_mode_multiplier)


# Removal tests: tests/gateway/test_vertex.py, test_bedrock.py.
GUARDS = Guards(
    price_regional_premium=(
        "a target's list rates carry the premium its provider bills where the connection runs; without it a "
        "regional Vertex or Bedrock call reserves and records Claude at the global price, 10% below the bill"
    ),
)

# Vertex AI and Bedrock bill Claude Sonnet 4.5 and every later Claude model 10% above their global
# price anywhere else: Vertex on any location but `global` (a region such as us-east5, or a
# multi-region such as us or eu), Bedrock on an in-region model id or a geographic inference
# profile (us., eu., ...) rather than a `global.` one. A Vertex catalog price is the global one;
# a Bedrock one is global unless its catalog name says `regional.` (genai-prices lists both).
# Sources and dates: tests/catalog/data/published_prices.json.
REGIONAL_PREMIUM = Decimal("1.1")
# The Claude models released before that premium keep one price everywhere. A closed list (every
# later model carries the premium), matched on the id sent to the provider.
_ONE_PRICE_CLAUDE = re.compile(
    r"claude-(?:instant|v1|2|3|4-opus|4-sonnet)(?:[-.@].*)?"
    r"|claude-(?:sonnet|opus)-4(?:-[01])?(?:[-@]\d{8})?(?:-v\d+(?::\d+)?)?"
)


def _claude_with_premium(model_id: str) -> bool:
    return model_id.startswith("claude") and not _ONE_PRICE_CLAUDE.fullmatch(model_id)


def location_multiplier(*, model: Model, connection: Connection | None) -> Decimal:
    """What the provider adds to the list price for where this connection sends the request: the
    regional premium on the Claude models that carry it, else 1."""
    if not GUARDS.price_regional_premium or connection is None or connection.kind not in ("vertex", "bedrock"):
        return Decimal(1)
    sent = connection.provider_model_id(model.name).lower()
    if connection.kind == "vertex":
        regional = (connection.options or {}).get("region") != "global" and _claude_with_premium(sent)
    else:  # bedrock: the Claude id after the profile's geography, if any ("us.anthropic.claude-...")
        regional = (
            not sent.startswith("global.")
            and not model.name.lower().startswith("regional.")
            and _claude_with_premium(sent.partition("anthropic.")[2])
        )
    return REGIONAL_PREMIUM if regional else Decimal(1)


def rates_for(
    *, model: Model, connection: Connection | None = None, tier: str | None = None, speed: str | None = None
) -> Rates:
    """Negotiated connection rates override the list price field by field (a negotiated rate is
    the rate billed on that connection, wherever it runs); a list rate carries the connection's
    location premium; a service tier multiplies every token rate, and fast mode multiplies them
    again (Anthropic documents that fast-mode pricing stacks with the other modifiers)."""
    located = location_multiplier(model=model, connection=connection)

    def pick(field: str) -> Decimal | None:
        override = getattr(connection, f"{field}_usd_per_mtok", None) if connection else None
        if override is not None:
            return override
        listed = getattr(model, f"{field}_usd_per_mtok")
        return listed * located if listed is not None else None

    input_rate, output_rate = pick("input"), pick("output")
    if input_rate is None or output_rate is None:
        raise UnpricedModel(model)
    m = tier_multiplier(model, tier) * speed_multiplier(model, speed)
    cache_read, cache_write, cache_1h = pick("cache_read"), pick("cache_write"), pick("cache_write_1h")
    base = Tier(
        above=0,
        input=input_rate * m,
        output=output_rate * m,
        # Missing cache prices: the provider bills those tokens as plain input.
        cache_read=(cache_read if cache_read is not None else input_rate) * m,
        cache_write=(cache_write if cache_write is not None else input_rate) * m,
        cache_write_1h=cache_1h * m if cache_1h is not None else None,
    )
    return Rates(
        input=base.input,
        output=base.output,
        cache_read=base.cache_read,
        cache_write=base.cache_write,
        cache_write_1h=base.cache_write_1h,
        per_request=model.per_request_usd or Decimal(0),
        web_search_per_use=model.web_search_usd_per_use,
        server_tool_result_tokens=model.server_tool_result_tokens,
        tiers=_tiers(model, base, m * located),
        model=model.name,
    )


def _tiers(model: Model, base: Tier, m: Decimal) -> tuple[Tier, ...]:
    """The model's prompt-size tiers: its listed tier prices (a rate a tier does not list stays
    the base rate, negotiated or not; an unpriced cache rate follows the tier's input) and the
    long-context band given as multipliers of the base."""
    tiers = []
    for raw in model.price_tiers or ():
        tier_input = _tier_rate(raw, "input", base.input, m)
        tiers.append(
            Tier(
                above=int(raw["above_input_tokens"]),
                input=tier_input,
                output=_tier_rate(raw, "output", base.output, m),
                cache_read=_tier_rate(
                    raw, "cache_read", base.cache_read if model.cache_read_usd_per_mtok is not None else tier_input, m
                ),
                cache_write=_tier_rate(
                    raw,
                    "cache_write",
                    base.cache_write if model.cache_write_usd_per_mtok is not None else tier_input,
                    m,
                ),
                cache_write_1h=Decimal(raw["cache_write_1h"]) * m
                if raw.get("cache_write_1h") is not None
                else base.cache_write_1h,
            )
        )
    if model.long_context_threshold_tokens is not None:
        band_in = model.long_context_input_multiplier or Decimal(1)
        band_out = model.long_context_output_multiplier or Decimal(1)
        tiers.append(
            Tier(
                above=model.long_context_threshold_tokens,
                input=base.input * band_in,
                output=base.output * band_out,
                cache_read=base.cache_read * band_in,
                cache_write=base.cache_write * band_in,
                cache_write_1h=base.cache_write_1h * band_in if base.cache_write_1h is not None else None,
            )
        )
    return tuple(sorted(tiers, key=lambda t: t.above))


def _tier_rate(raw: dict, key: str, fallback: Decimal, m: Decimal) -> Decimal:
    value = raw.get(key)
    return Decimal(value) * m if value is not None else fallback


def batch_rates(*, rates: Rates, model: Model) -> Rates:
    """The rates of a batch line: every token rate (and the per-request and per-search prices)
    times the model's batch multiplier; the standard rates when the catalog gives none."""
    m = model.batch_multiplier
    if m is None or m == 1:
        return rates
    return dataclasses.replace(
        rates,
        input=rates.input * m,
        output=rates.output * m,
        cache_read=rates.cache_read * m,
        cache_write=rates.cache_write * m,
        per_request=rates.per_request * m,
        cache_write_1h=rates.cache_write_1h * m if rates.cache_write_1h is not None else None,
        web_search_per_use=rates.web_search_per_use * m if rates.web_search_per_use is not None else None,
        tiers=tuple(_scaled(t, m) for t in rates.tiers),
    )


def _scaled(tier: Tier, m: Decimal) -> Tier:
    return dataclasses.replace(
        tier,
        input=tier.input * m,
        output=tier.output * m,
        cache_read=tier.cache_read * m,
        cache_write=tier.cache_write * m,
        cache_write_1h=tier.cache_write_1h * m if tier.cache_write_1h is not None else None,
    )


def video_nano(*, model: Model, seconds: int, worst: bool) -> int:
    """Seconds of video at the model's per-second price: rounded up for a worst case, half-up
    for a bill. UnpricedFeature when the catalog has no video price for the model."""
    if model.video_usd_per_second is None:
        raise UnpricedFeature(model, "video seconds")
    total = Decimal(seconds) * model.video_usd_per_second * _NANO_PER_USD
    return int(total.to_integral_value(rounding=ROUND_CEILING if worst else ROUND_HALF_UP))


def _nano(tokens: int, usd_per_mtok: Decimal) -> Decimal:
    return Decimal(tokens) * usd_per_mtok * _NANO_PER_TOKEN_PER_USD_PER_MTOK


def _base(rates: Rates) -> Tier:
    return Tier(0, rates.input, rates.output, rates.cache_read, rates.cache_write, rates.cache_write_1h)


def _tier_at(rates: Rates, prompt_tokens: int) -> Tier:
    """The tier that bills a prompt of this many tokens: the highest one it is above."""
    applied = _base(rates)
    for tier in rates.tiers:
        if prompt_tokens > tier.above:
            applied = tier
    return applied


def _reachable(rates: Rates, bound_tokens: int) -> list[Tier]:
    """Every tier a prompt of at most `bound_tokens` could be billed at. The bound takes the
    dearest rate among them, not the tier of the bound itself: a tier is not assumed dearer."""
    return [_base(rates), *(t for t in rates.tiers if bound_tokens > t.above)]


def worst_case_nano(*, bound: TokenBound, rates: Rates) -> int:
    """Raises UnpricedFeature when the bound needs a price the catalog lacks."""
    if bound.cache_1h and rates.cache_write_1h is None:
        raise UnpricedFeature(rates.model, "1-hour cache writes")
    if bound.web_searches and rates.web_search_per_use is None:
        raise UnpricedFeature(rates.model, "web search")
    tiers = _reachable(rates, bound.input_tokens)
    max_input = max(max(t.input, t.cache_read, t.cache_write) for t in tiers)
    if bound.cache_1h:
        max_input = max(max_input, *(t.cache_write_1h or Decimal(0) for t in tiers))
    max_output = max(t.output for t in tiers)
    total = (
        _nano(bound.input_tokens, max_input)
        + _nano(bound.output_tokens * bound.choices, max_output)
        + rates.per_request * _NANO_PER_USD
        + bound.web_searches * (rates.web_search_per_use or Decimal(0)) * _NANO_PER_USD
    )
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def nano_per_output_token(*, rates: Rates, input_tokens: int) -> Decimal:
    """What one more output token can cost, in nano-USD, at the dearest tier an input of at
    most this many tokens can reach."""
    return max(t.output for t in _reachable(rates, input_tokens)) * _NANO_PER_TOKEN_PER_USD_PER_MTOK


def cost_nano(*, usage: Usage, rates: Rates) -> int:
    """The actual cost of reported usage, at the tier its prompt size falls in. A priced feature
    the catalog lacks a price for is billed at the nearest known rate (1-hour writes at the
    5-minute rate); the caller flags it."""
    tier = _tier_at(rates, usage.prompt_tokens)
    total = (
        _nano(usage.input_tokens, tier.input)
        + _nano(usage.output_tokens, tier.output)
        + _nano(usage.cache_read_tokens, tier.cache_read)
        + _nano(usage.cache_write_tokens, tier.cache_write)
        + _nano(usage.cache_write_1h_tokens, tier.cache_write_1h or tier.cache_write)
        + rates.per_request * _NANO_PER_USD
        + usage.web_search_requests * (rates.web_search_per_use or Decimal(0)) * _NANO_PER_USD
    )
    return int(total.to_integral_value(rounding=ROUND_HALF_UP))
