"""Today's prices from genai-prices (pinned in pyproject.toml), as a catalog in the price-file
format (catalog/price_file.py), plus the models it leaves out and why.

genai-prices ships its data inside the package (genai_prices.data): Decimal USD prices per
million tokens, tiers by prompt size, service-tier and batch variants, 5-minute and 1-hour cache
writes, web search per thousand uses, and prices with start dates or daily hours. Nothing is
fetched at run time. Each model becomes one catalog entry only if capgate can bound every price
a request to it may be billed at; otherwise it is skipped with the reason. The rules:

- The price is the one in force at `at`. A price that starts later and is higher in any rate is
  a rise the loaded row would not know about, so the model is skipped until that date; a later
  cut keeps today's price (a bound above the bill until the reload after the cut).
- Daily-hours prices (off-peak discounts) load the dearest rate of the day: bounds hold at any
  hour, and off-peak requests are billed at the peak rate (the safe direction).
- Tiers become `tiers` (every token price at each threshold). Variants become multipliers of
  every token rate: batch, priority (and OpenAI's "fast", the same tier), flex, and Anthropic's
  fast mode (`speed: "fast"`, a multiplier of its own). A variant whose
  rates are not one multiple of the standard ones is given the largest multiple, so its bound
  holds and its bill is at most that much above the provider's.
- Prices of parts or tools the billing inventory refuses under a blocking cap or bounds with a
  catalog limit left unset here (audio, images, video, documents, file search) are left out.
  Output billed at its own rate (generated images or audio, reasoning, citations) above the text
  output rate cannot be bounded by max_tokens at that rate: those models are skipped.

capgate's own file (catalog/data/prices.json) fills in what genai-prices does not have: output
limits, image-token bounds, tokenizers and server-tool result sizes for the models it lists,
and the models genai-prices does not know (the echo test model, video models).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal
from importlib.metadata import version
from typing import Any

from genai_prices.data import providers as genai_providers
from genai_prices.types import (
    ConditionalPrice,
    ModelInfo,
    ModelPrice,
    StartDateConstraint,
    TieredPrices,
    TimeOfDateConstraint,
)

# genai-prices key -> the price file's key, for the token rates (USD per 1M tokens).
TOKEN_KEYS = {
    "input_mtok": "input",
    "output_mtok": "output",
    "cache_read_mtok": "cache_read",
    "cache_write_mtok": "cache_write",
    "cache_write_1h_mtok": "cache_write_1h",
}
# Prices per thousand uses -> the price file's per-use prices.
PER_THOUSAND = {"web_searches_kcount": "web_search_per_use", "requests_kcount": "per_request"}
# Billed only for a part or tool the billing inventory refuses under a blocking cap (audio,
# video, documents, file search) or bounds by the model's max_image_tokens, which is left unset
# for a model with a price of its own for image tokens.
PART_KEYS = frozenset(
    {
        "input_audio_mtok",
        "cache_audio_read_mtok",
        "input_audio_hours",
        "audio_hours",
        "input_image_mtok",
        "cache_image_read_mtok",
        "input_video_mtok",
        "input_document_kpages",
        "input_annotated_document_kpages",
        "storage_searches_kcount",
    }
)
IMAGE_KEYS = frozenset({"input_image_mtok", "cache_image_read_mtok"})
# Output a text request can produce, billed at its own rate: boundable only at or below the
# text output rate.
OUTPUT_KEYS = {
    "output_audio_mtok": "audio output",
    "output_image_mtok": "image output",
    "output_video_mtok": "video output",
    "output_reasoning_mtok": "reasoning tokens",
    "output_citation_mtok": "citation tokens",
}
# Variants capgate prices, by (request context key, value): the catalog field they set.
VARIANTS = {
    ("processing", "batch"): "batch_multiplier",
    ("service_tier", "priority"): "priority_multiplier",
    ("service_tier", "fast"): "priority_multiplier",  # OpenAI's name for the same tier
    ("service_tier", "flex"): "flex_multiplier",
    ("speed", "fast"): "fast_mode_multiplier",  # Anthropic's fast mode, on top of any tier
}
# The overlay's fields that genai-prices has no data for (context_window only where it has none).
OVERLAY_LIMITS = ("max_output_tokens", "max_image_tokens", "tokenizer", "server_tool_result_tokens")
_THOUSAND = Decimal(1000)


@dataclass(frozen=True)
class Skipped:
    provider: str
    name: str
    reason: str

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.name}"


class Skip(Exception):
    """This model has a price shape capgate cannot bound; the message says which."""


def source() -> str:
    return f"genai-prices {version('genai-prices')}"


def genai_catalog(*, at: datetime.datetime, overlay: dict) -> tuple[dict, list[Skipped]]:
    """The price file for `at`: every genai-prices model capgate can bound, with the overlay's
    limits on the models both list and the overlay's own models added; and the skipped ones."""
    models: dict[tuple[str, str], dict[str, Any]] = {}
    skipped: list[Skipped] = []
    providers = []
    for provider in genai_providers:
        providers.append({"slug": provider.id, "name": provider.name})
        for info in provider.models:
            try:
                models[(provider.id, info.id)] = {"provider": provider.id, "name": info.id, **model_entry(info, at)}
            except Skip as exc:
                skipped.append(Skipped(provider.id, info.id, str(exc)))
    known = {p["slug"] for p in providers}
    providers += [p for p in overlay.get("providers", []) if p.get("slug") not in known]
    for extra in overlay.get("models", []):
        key = (extra.get("provider"), extra.get("name"))
        entry = models.get(key)  # type: ignore[arg-type]
        if entry is None:
            if key not in {(s.provider, s.name) for s in skipped}:
                models[key] = dict(extra)  # type: ignore[index]
            continue
        own_image_price = entry.pop("_own_image_price", False)
        for limit in OVERLAY_LIMITS:
            if extra.get(limit) is not None and not (limit == "max_image_tokens" and own_image_price):
                entry[limit] = extra[limit]
        if entry.get("context_window") is None and extra.get("context_window") is not None:
            entry["context_window"] = extra["context_window"]
    for entry in models.values():
        entry.pop("_own_image_price", None)
    overlay_source = overlay.get("source") or []
    catalog = {
        "prices_as_of": at.date().isoformat(),
        "source": [
            f"{source()} (PyPI, MIT): the prices in force on {at.date().isoformat()}, from the data it ships.",
            "Limits, tokenizers and the models genai-prices does not list: capgate's catalog/data/prices.json.",
            *([overlay_source] if isinstance(overlay_source, str) else overlay_source),
        ],
        "providers": providers,
        "models": list(models.values()),
    }
    return catalog, skipped


def model_entry(info: ModelInfo, at: datetime.datetime) -> dict[str, Any]:
    """One model's price-file entry (without provider and name). Raises Skip."""
    prices = _in_force(info, at)
    present = {k: v for k, v in vars(prices).items() if v is not None and not k.startswith("_")}
    unknown = sorted(set(present) - {*TOKEN_KEYS, *PER_THOUSAND, *PART_KEYS, *OUTPUT_KEYS})
    if unknown:
        raise Skip(f"priced by {', '.join(unknown)}, which capgate cannot bound")
    if not present:
        raise Skip("genai-prices lists no price for it")
    if "output_mtok" not in present and "input_mtok" in present and "embed" in info.id.lower():
        present["output_mtok"] = Decimal(0)  # an embedding bills its input only
    if "input_mtok" not in present or "output_mtok" not in present:
        if "input_mtok" in present:
            raise Skip("no output price, so its output cannot be bounded")
        raise Skip(f"not priced per token (priced by {', '.join(sorted(present))})")
    top_output = _highest(present["output_mtok"])
    for key, what in OUTPUT_KEYS.items():
        if key in present and _highest(present[key]) > top_output:
            raise Skip(f"bills {what} at ${_highest(present[key])}/M, above the output rate a bound uses")
    entry: dict[str, Any] = {"context_window": info.context_window}
    tiered = {k: v for k, v in present.items() if k in TOKEN_KEYS and isinstance(v, TieredPrices)}
    for key, name in TOKEN_KEYS.items():
        if key in present:
            entry[name] = _text(_base(present[key]))
    for key, name in PER_THOUSAND.items():
        if key in present:
            if isinstance(present[key], TieredPrices):
                raise Skip(f"{key} is tiered by prompt size, which capgate cannot price per use")
            entry[name] = _text(present[key] / _THOUSAND)
    if tiered:
        entry["tiers"] = _tiers(present, tiered)
    image = [_highest(present[k]) for k in IMAGE_KEYS if k in present]
    entry["_own_image_price"] = bool(image) and max(image) > _base(present["input_mtok"])
    for field, multiple in _variants(info, prices, at).items():
        entry[field] = _text(multiple)
    return entry


def _in_force(info: ModelInfo, at: datetime.datetime) -> ModelPrice:
    if isinstance(info.prices, ModelPrice):
        return info.prices
    conditionals: list[ConditionalPrice] = info.prices
    dated = [c for c in conditionals if not isinstance(c.constraint, TimeOfDateConstraint)]
    current = dated[0].prices if dated else conditionals[0].prices
    for c in reversed(dated):  # the last one in force wins
        if c.constraint is None or c.constraint.active(at):
            current = c.prices
            break
    for c in conditionals:
        if isinstance(c.constraint, StartDateConstraint) and c.constraint.start_date > at.date():
            rises = [k for k, v in vars(c.prices).items() if v is not None and _rises(getattr(current, k, None), v)]
            if rises:
                raise Skip(f"its price rises on {c.constraint.start_date} ({', '.join(sorted(rises))}): load it then")
    hours = [c.prices for c in conditionals if isinstance(c.constraint, TimeOfDateConstraint)]
    return _dearest(current, hours) if hours else current


def _rises(now: Any, later: Any) -> bool:
    return now is None or _highest(later) > _highest(now) or _base(later) > _base(now)


def _dearest(current: ModelPrice, others: list[ModelPrice]) -> ModelPrice:
    """Per rate, the dearest of the prices a day can bring."""
    merged = dict(vars(current))
    for other in others:
        for key, value in vars(other).items():
            if value is None:
                continue
            if isinstance(value, TieredPrices) or isinstance(merged.get(key), TieredPrices):
                raise Skip("its daily-hours prices are tiered by prompt size, which capgate cannot combine")
            if merged.get(key) is None or value > merged[key]:
                merged[key] = value
    return ModelPrice(**merged)


def _tiers(present: dict[str, Any], tiered: dict[str, TieredPrices]) -> list[dict[str, Any]]:
    """Every token price at each threshold any of them has: genai-prices' rule (a prompt above
    a tier's start bills all its tokens at the tier price) in capgate's one list of thresholds."""
    starts = sorted({t.start for prices in tiered.values() for t in prices.tiers})
    if starts and starts[0] < 1:
        raise Skip("a price tier starts at 0 tokens")
    out = []
    for start in starts:
        tier: dict[str, Any] = {"above_input_tokens": start}
        for key, name in TOKEN_KEYS.items():
            if key in present:
                tier[name] = _text(_at(present[key], start + 1))
        out.append(tier)
    return out


def _variants(info: ModelInfo, standard: ModelPrice, at: datetime.datetime) -> dict[str, Decimal]:
    """Each priced variant as the largest multiple of a standard token rate it bills."""
    found: dict[str, Decimal] = {}
    seen: set[tuple[str, str]] = set()
    for variant in info.price_variants or ():
        if variant.constraint is not None and not variant.constraint.active(at):
            continue
        for when in variant.when.items():
            field = VARIANTS.get(when)
            if field is None or when in seen:
                continue  # a later variant for the same context is overridden by the first
            seen.add(when)
            multiple = _multiple(standard, variant.prices)
            found[field] = max(found.get(field, multiple), multiple)
    return found


def _multiple(standard: ModelPrice, variant: ModelPrice) -> Decimal:
    points = [0]
    for key in TOKEN_KEYS:
        for prices in (getattr(standard, key, None), getattr(variant, key, None)):
            if isinstance(prices, TieredPrices):
                points += [t.start for t in prices.tiers]
    ratios = []
    for key in TOKEN_KEYS:
        base = getattr(standard, key, None)
        if base is None:
            continue
        replaced = getattr(variant, key, None)
        for point in sorted(set(points)):
            was = _at(base, point + 1)
            now = _at(replaced, point + 1) if replaced is not None else was
            if was == 0:
                if now > 0:
                    raise Skip(f"a variant prices {key} that the standard price leaves free")
                continue
            ratios.append(now / was)
    multiple = max(ratios) if ratios else Decimal(1)
    # Rounded up to the catalog column's 4 places: never below the provider's multiple.
    return multiple.quantize(Decimal("0.0001"), rounding="ROUND_CEILING")


def _at(price: Decimal | TieredPrices, tokens: int) -> Decimal:
    if not isinstance(price, TieredPrices):
        return price
    applied = price.base
    for tier in price.tiers:
        if tokens > tier.start:
            applied = tier.price
    return applied


def _base(price: Decimal | TieredPrices) -> Decimal:
    return price.base if isinstance(price, TieredPrices) else price


def _highest(price: Decimal | TieredPrices) -> Decimal:
    if isinstance(price, TieredPrices):
        return max([price.base, *(t.price for t in price.tiers)])
    return price


_PLACES = Decimal("0.000001")  # the catalog's price columns hold six decimal places


def _text(value: Decimal) -> str:
    """A price as the file's exact string; one finer than the columns hold is rounded up (at
    most $0.000001 per million tokens above the provider's: the safe direction)."""
    if value.as_tuple().exponent < -6:  # type: ignore[operator]
        value = value.quantize(_PLACES, rounding="ROUND_CEILING")
    return format(value.normalize(), "f")
