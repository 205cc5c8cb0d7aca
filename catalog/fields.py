"""The management API's field rules for money and prices, written once (the others are in
tenants/api/fields.py).

Each rule is a DRF serializer field. The API's serializers are built from them, the dashboard
forms wrap the same fields (dashboard/fields.py), `manage.py apply` feeds every item of its file
through the API's serializers, and the price-file loader (catalog/prices.py) feeds every model
through PriceSerializer below. So a value is accepted or refused, with the same message,
whichever way it arrives (docs/decisions.md, 2026-12-01).

The services check what no single field can (a key budget names its key, a timezone exists,
thresholds are distinct); every path reaches them after these fields.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django.db import models
from rest_framework import serializers

from catalog.models import TOKENIZERS, Model
from core.money import MAX_AMOUNT_USD, is_decimal_text, nano_to_usd, usd_to_nano
from tenants.api.fields import MAX_INT, NUMBER_MESSAGES, WholeNumberField, choice_field


def _strict_text(data: Any) -> bool:
    """A number given as text is ASCII digits with at most one decimal point, a minus sign allowed
    in front (so a negative amount gets its own message); DRF's Decimal() would also read
    "1_000", "1e3" and other scripts' digits. Numbers (JSON's, YAML's) pass to DRF as before."""
    return not isinstance(data, str) or is_decimal_text(data.strip().removeprefix("-"))


class UsdField(serializers.DecimalField):
    """USD as a decimal string in and out (e.g. "5.00"); nano-USD ints inside. At most nine
    decimal places (one nano-USD), never negative, at most MAX_AMOUNT_USD (core/money.py)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_digits", 20)
        kwargs.setdefault("decimal_places", 9)
        kwargs.setdefault("error_messages", NUMBER_MESSAGES)
        # The range is checked on the USD amount, before it becomes nano-USD: DRF's validators
        # would compare the nano-USD int with the USD bound (and refuse any amount over $4.61).
        least, most = kwargs.pop("min_value", Decimal(0)), kwargs.pop("max_value", MAX_AMOUNT_USD)
        super().__init__(**kwargs)
        self.min_value, self.max_value = least, most  # also what the OpenAPI schema shows

    def to_internal_value(self, data: Any) -> int:  # type: ignore[override]
        if isinstance(data, bool) or not _strict_text(data):  # Decimal(True) is 1: a YAML `yes` is not an amount
            self.fail("invalid")
        amount = super().to_internal_value(data)
        if self.min_value is not None and amount < self.min_value:
            self.fail("min_value", min_value=self.min_value)
        if self.max_value is not None and amount > self.max_value:
            self.fail("max_value", max_value=self.max_value)
        return usd_to_nano(amount)

    def to_representation(self, value: Any) -> str:  # type: ignore[override]
        return super().to_representation(nano_to_usd(value))


class DecimalField(serializers.DecimalField):
    """A non-negative decimal (a price, a rate, a multiplier); a bool is not a number."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("min_value", Decimal(0))
        kwargs.setdefault("error_messages", NUMBER_MESSAGES)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Decimal:  # type: ignore[override]
        if isinstance(data, bool) or not _strict_text(data):
            self.fail("invalid")
        return cast(Decimal, super().to_internal_value(data))


def rate_field(**kwargs: Any) -> DecimalField:
    """An optional USD-per-1M-tokens rate (a connection's negotiated rate, a list price); null
    means the catalog's list price applies (on a connection) or unpriced (in the catalog)."""
    kwargs.setdefault("required", False)
    kwargs.setdefault("allow_null", True)
    return DecimalField(max_digits=14, decimal_places=6, max_value=Decimal("99999999"), **kwargs)


def _model_field(name: str) -> Any:
    """The catalog column a price is stored in: its digits are the field's limits."""
    return Model._meta.get_field(name)


def _price(name: str) -> DecimalField:
    column = cast(models.DecimalField, _model_field(name))
    assert column.max_digits is not None and column.decimal_places is not None
    return DecimalField(
        max_digits=column.max_digits, decimal_places=column.decimal_places, required=False, allow_null=column.null
    )


def token_count_field(**kwargs: Any) -> WholeNumberField:
    """A count of tokens a model allows or a feature adds: positive, or null (unknown)."""
    kwargs.setdefault("required", False)
    kwargs.setdefault("allow_null", True)
    return WholeNumberField(min_value=1, max_value=MAX_INT, **kwargs)


TIER_RATES = ("input", "output", "cache_read", "cache_write", "cache_write_1h")


class PriceTierField(serializers.Field):
    """A model's prompt-size tiers: a list, ascending by threshold, of {"above_input_tokens": N,
    and any of TIER_RATES as a price}. Stored as JSON with each price a Decimal string."""

    default_error_messages = {
        "invalid": "Must be a list of tiers, each an object with above_input_tokens and prices.",
        "order": "Tier thresholds must be whole numbers of at least 1, each above the one before.",
        "keys": "A tier has unknown keys ({keys}); expected above_input_tokens, " + ", ".join(TIER_RATES) + ".",
        "empty": "A tier must price at least one of " + ", ".join(TIER_RATES) + ".",
    }

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
            self.fail("invalid")
        tiers: list[dict[str, Any]] = []
        previous = 0
        for raw in data:
            unknown = set(raw) - {"above_input_tokens", *TIER_RATES}
            if unknown:
                self.fail("keys", keys=", ".join(sorted(unknown)))
            above = raw.get("above_input_tokens")
            if isinstance(above, bool) or not isinstance(above, int) or above <= previous or above > MAX_INT:
                self.fail("order")
            previous = above
            tier: dict[str, Any] = {"above_input_tokens": above}
            for key in TIER_RATES:
                if raw.get(key) is None:
                    continue
                if isinstance(raw[key], float):  # a JSON number with a fraction is not exact
                    raise serializers.ValidationError(f'{key}: must be a decimal string such as "2.50".')
                try:
                    price = _price("input_usd_per_mtok").run_validation(raw[key])
                except serializers.ValidationError as exc:
                    raise serializers.ValidationError(f"{key}: {' '.join(map(str, exc.detail))}") from exc
                tier[key] = format(price.normalize(), "f")
            if len(tier) == 1:
                self.fail("empty")
            tiers.append(tier)
        return tiers

    def to_representation(self, value: Any) -> Any:
        return value


class PriceSerializer(serializers.Serializer):
    """A catalog model's list price, as `apply`, the price file and the staff price form set it
    (the fields of catalog.services.set_model_price, and the price file's batch and video prices).
    Every field is optional: a price file additionally requires input and output
    (catalog/prices.py)."""

    input_usd_per_mtok = _price("input_usd_per_mtok")
    output_usd_per_mtok = _price("output_usd_per_mtok")
    cache_read_usd_per_mtok = _price("cache_read_usd_per_mtok")
    cache_write_usd_per_mtok = _price("cache_write_usd_per_mtok")
    per_request_usd = _price("per_request_usd")
    max_output_tokens = token_count_field()
    context_window = token_count_field()
    max_image_tokens = token_count_field()
    cache_write_1h_usd_per_mtok = _price("cache_write_1h_usd_per_mtok")
    web_search_usd_per_use = _price("web_search_usd_per_use")
    priority_multiplier = _price("priority_multiplier")
    flex_multiplier = _price("flex_multiplier")
    fast_mode_multiplier = _price("fast_mode_multiplier")
    long_context_input_multiplier = _price("long_context_input_multiplier")
    long_context_output_multiplier = _price("long_context_output_multiplier")
    server_tool_result_tokens = token_count_field()
    long_context_threshold_tokens = token_count_field()
    batch_multiplier = _price("batch_multiplier")  # the price file's; apply and the form do not set it yet
    price_tiers = PriceTierField()  # the price file's too
    video_usd_per_second = _price("video_usd_per_second")
    tokenizer = choice_field("Tokenizer", TOKENIZERS, nullable=True, required=False)
