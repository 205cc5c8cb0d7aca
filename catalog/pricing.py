"""Prices to nano-USD: the only place USD-per-1M-token Decimals become integer money.

Worst cases round *up* (a bound must never be below what could be billed); actual costs round
half-up. Both return ints of nano-USD.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import cast

from catalog.models import Connection, Model

# USD per 1M tokens -> nano-USD per token: * 1e9 / 1e6.
_NANO_PER_TOKEN_PER_USD_PER_MTOK = Decimal(1000)
_NANO_PER_USD = Decimal(1_000_000_000)
RATE_FIELDS = ("input", "output", "cache_read", "cache_write")


class UnpricedModel(Exception):
    """The model (on some target of the route) has no input or output price."""

    def __init__(self, model: Model):
        super().__init__(f"model {model} has no price")
        self.model = model


@dataclass(frozen=True)
class Rates:
    """Effective USD-per-1M-token rates for one (connection, model) target."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    per_request: Decimal

    @property
    def max_input(self) -> Decimal:
        # The most expensive way the provider could bill an input token (e.g. a cache write).
        return max(self.input, self.cache_read, self.cache_write)


@dataclass(frozen=True)
class TokenBound:
    """An upper bound on what one request can be billed for, in tokens."""

    input_tokens: int
    output_tokens: int  # per choice
    choices: int = 1


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


def rates_for(*, model: Model, connection: Connection | None = None) -> Rates:
    """Negotiated connection rates override the list price field by field."""

    def pick(field: str) -> Decimal | None:
        override = getattr(connection, f"{field}_usd_per_mtok", None) if connection else None
        return override if override is not None else getattr(model, f"{field}_usd_per_mtok")

    input_rate, output_rate = pick("input"), pick("output")
    if input_rate is None or output_rate is None:
        raise UnpricedModel(model)
    return Rates(
        input=input_rate,
        output=output_rate,
        # Missing cache prices: the provider bills those tokens as plain input.
        # (cast: mypy cannot narrow a repeated call; the branch runs only when it is not None.)
        cache_read=cast(Decimal, pick("cache_read")) if pick("cache_read") is not None else input_rate,
        cache_write=cast(Decimal, pick("cache_write")) if pick("cache_write") is not None else input_rate,
        per_request=model.per_request_usd or Decimal(0),
    )


def _nano(tokens: int, usd_per_mtok: Decimal) -> Decimal:
    return Decimal(tokens) * usd_per_mtok * _NANO_PER_TOKEN_PER_USD_PER_MTOK


def worst_case_nano(*, bound: TokenBound, rates: Rates) -> int:
    total = (
        _nano(bound.input_tokens, rates.max_input)
        + _nano(bound.output_tokens * bound.choices, rates.output)
        + rates.per_request * _NANO_PER_USD
    )
    return int(total.to_integral_value(rounding=ROUND_CEILING))


def worst_case_over_route(*, bound: TokenBound, targets: Iterable[tuple[Model, Connection | None]]) -> int:
    """The worst case at the most expensive target the request could fail over to.

    Raises UnpricedModel if any target is unpriced: a failover to it would be uncounted.
    """
    worst = 0
    for model, connection in targets:
        worst = max(worst, worst_case_nano(bound=bound, rates=rates_for(model=model, connection=connection)))
    return worst


def cost_nano(*, usage: Usage, rates: Rates) -> int:
    total = (
        _nano(usage.input_tokens, rates.input)
        + _nano(usage.output_tokens, rates.output)
        + _nano(usage.cache_read_tokens, rates.cache_read)
        + _nano(usage.cache_write_tokens, rates.cache_write)
        + rates.per_request * _NANO_PER_USD
    )
    return int(total.to_integral_value(rounding=ROUND_HALF_UP))


def usd_to_nano(usd: Decimal | str | int) -> int:
    """Exact conversion of a USD amount given by a user; sub-nano fractions round half-up."""
    return int((Decimal(usd) * _NANO_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))


def nano_to_usd(nano: int) -> Decimal:
    return Decimal(nano) / _NANO_PER_USD
