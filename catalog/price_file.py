"""The price-file format (catalog/data/prices.json, and what catalog/genai.py builds) and its
validation; catalog/prices.py loads a validated file into Provider and Model rows.

The file, all prices being Decimal-exact strings of USD per 1M tokens:

    {
      "prices_as_of": "YYYY-MM-DD",
      "source": "where the prices come from" | ["...", ...],        (optional)
      "providers": [{"slug": "openai", "name": "OpenAI"}, ...],
      "models": [
        {"provider": "openai", "name": "gpt-4o",                     (required)
         "input": "2.50", "output": "10.00",                         (required, not null)
         "cache_read": "1.25", "cache_write": null,                  (optional; null: billed as input)
         "per_request": "0",                                         (optional, default 0)
         "max_output_tokens": 16384, "context_window": 128000,       (optional integers or null)
         "max_image_tokens": 1445,                                   (optional; null: images unbounded)
         "tokenizer": "o200k_base",                                  (optional; null: prompts bounded by bytes)
         "cache_write_1h": "6", "web_search_per_use": "0.01",         (optional paid features, docs/billing.md;
         "server_tool_result_tokens": 2000,                           null or absent: refused under a
         "priority_multiplier": "2", "flex_multiplier": "0.5",        blocking cap when a request uses them)
         "long_context_threshold_tokens": 272000,
         "long_context_input_multiplier": "2", "long_context_output_multiplier": "1.5",
         "batch_multiplier": "0.5", "video_per_second": "0.10",       (batch price; video per second)
         "tiers": [{"above_input_tokens": 200000, "input": "6",       (optional prompt-size tiers,
                    "output": "22.5", "cache_read": "0.6"}],          ascending; catalog.fields.PriceTierField)
         "note": "free text, not stored"},                           (optional)
        ...
      ]
    }

validate_catalog() checks the whole file before anything touches the database, so a bad file
changes nothing; it reports every problem at once. Each model's
prices and limits are checked by catalog.fields.PriceSerializer, the rules (and messages) of
`manage.py apply`'s prices and the staff price form; the file adds its own: input and output are
required, and a price is a string (a JSON number with a fraction is not exact).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from django.utils.text import slugify

from catalog.fields import PriceSerializer
from catalog.models import Model
from catalog.pricing import RATE_FIELDS
from tenants.api.fields import flat_errors

DEFAULT_CATALOG_PATH = Path(__file__).resolve().parent / "data" / "prices.json"

_TOP_KEYS = {"prices_as_of", "source", "providers", "models"}
_PROVIDER_KEYS = {"slug", "name"}
_REQUIRED_RATES = ("input", "output")
_INT_FIELDS = (
    "max_output_tokens",
    "context_window",
    "max_image_tokens",
    "server_tool_result_tokens",
    "long_context_threshold_tokens",
)
# Paid features beyond tokens (docs/billing.md), optional; null or absent: not priced (refused
# under a blocking cap when a request asks for them).
_FEATURE_PRICES = {
    "cache_write_1h": "cache_write_1h_usd_per_mtok",  # USD per 1M tokens
    "web_search_per_use": "web_search_usd_per_use",  # USD per search
    "priority_multiplier": "priority_multiplier",  # x every token rate
    "flex_multiplier": "flex_multiplier",
    "fast_mode_multiplier": "fast_mode_multiplier",  # x every token rate at speed "fast" (Anthropic)
    "long_context_input_multiplier": "long_context_input_multiplier",
    "long_context_output_multiplier": "long_context_output_multiplier",
    "batch_multiplier": "batch_multiplier",  # x every token rate in a batch (null: standard price)
    "video_per_second": "video_usd_per_second",  # USD per second of generated video
}
_MODEL_KEYS = {
    "provider",
    "name",
    "per_request",
    "note",
    "tokenizer",
    "tiers",
    *RATE_FIELDS,
    *_INT_FIELDS,
    *_FEATURE_PRICES,
}
_NAME_MAX = cast(int, Model._meta.get_field("name").max_length)  # a CharField: always set

# Model attribute for each catalog key; also the order fields are reported in.
FIELD_ATTRS: dict[str, str] = {
    **{rate: f"{rate}_usd_per_mtok" for rate in RATE_FIELDS},
    "per_request": "per_request_usd",
    **_FEATURE_PRICES,
    **{name: name for name in _INT_FIELDS},
    "tokenizer": "tokenizer",
    "tiers": "price_tiers",
    "prices_as_of": "prices_as_of",
}
_PRICE_KEYS = (*RATE_FIELDS, "per_request", *_FEATURE_PRICES)
_KEY_OF = {attr: key for key, attr in FIELD_ATTRS.items()}  # a price's key in the file, by column


@dataclass(frozen=True)
class Problem:
    model: str | None  # "provider/name", or None for the file or a provider entry
    field: str | None
    message: str

    def __str__(self) -> str:
        where = " ".join(part for part in (self.model, self.field and f"field {self.field!r}") if part)
        return f"{where}: {self.message}" if where else self.message


class CatalogError(ValueError):
    """The catalog is invalid; nothing was written. Lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        first = problems[0]
        self.model, self.field = first.model, first.field
        lines = [str(p) for p in problems]
        super().__init__(lines[0] if len(lines) == 1 else f"{len(lines)} problems:\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class _Entry:
    provider: str
    name: str
    values: dict[str, Any]  # catalog key -> validated value, for every key of FIELD_ATTRS


def read_catalog(path: str | Path) -> dict:
    """Parse a catalog file; a missing file or bad JSON is a CatalogError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError([Problem(None, None, f"cannot read {path}: {exc.strerror or exc}")]) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError([Problem(None, None, f"{path} is not valid JSON: {exc}")]) from exc


# --- validation -------------------------------------------------------------------------------


def validate_catalog(data: Any) -> tuple[datetime.date, dict[str, str], list[_Entry]]:
    problems: list[Problem] = []

    def problem(message: str, *, model: str | None = None, field: str | None = None) -> None:
        problems.append(Problem(model, field, message))

    if not isinstance(data, dict):
        raise CatalogError([Problem(None, None, "the catalog must be a JSON object")])
    for key in sorted(set(data) - _TOP_KEYS):
        problem(f"unknown top-level key (expected {', '.join(sorted(_TOP_KEYS))})", field=key)

    prices_as_of = None
    raw_date = data.get("prices_as_of")
    if raw_date is None:
        problem("is required (the date the prices were taken, YYYY-MM-DD)", field="prices_as_of")
    else:
        try:
            prices_as_of = datetime.date.fromisoformat(raw_date) if isinstance(raw_date, str) else None
        except ValueError:
            prices_as_of = None
        if prices_as_of is None:
            problem(f"must be a date as YYYY-MM-DD, not {raw_date!r}", field="prices_as_of")
    source = data.get("source")
    if source is not None and not (
        isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))
    ):
        problem("must be a string or a list of strings", field="source")

    providers: dict[str, str] = {}
    raw_providers = data.get("providers")
    if not isinstance(raw_providers, list):
        problem("is required: a list of {slug, name}", field="providers")
        raw_providers = []
    for i, raw in enumerate(raw_providers):
        where = f"providers[{i}]"
        if not isinstance(raw, dict):
            problem("must be an object with slug and name", model=where)
            continue
        for key in sorted(set(raw) - _PROVIDER_KEYS):
            problem("unknown key (expected slug, name)", model=where, field=key)
        slug, name = raw.get("slug"), raw.get("name")
        if not isinstance(slug, str) or not slug or slugify(slug) != slug or len(slug) > 50:
            problem(f"must be a lowercase slug of at most 50 characters, not {slug!r}", model=where, field="slug")
            continue
        where = f"provider {slug}"
        if not isinstance(name, str) or not name.strip() or len(name) > 100:
            problem("must be a non-empty string of at most 100 characters", model=where, field="name")
        elif slug in providers:
            problem("is listed twice", model=where, field="slug")
        else:
            providers[slug] = name

    entries: list[_Entry] = []
    seen: set[tuple[str, str]] = set()
    raw_models = data.get("models")
    if not isinstance(raw_models, list):
        problem("is required: a list of model objects", field="models")
        raw_models = []
    for i, raw in enumerate(raw_models):
        entry = _validate_model(i, raw, providers, prices_as_of, problem)
        if entry is None:
            continue
        if (entry.provider, entry.name) in seen:
            problem("is listed twice", model=f"{entry.provider}/{entry.name}", field="name")
            continue
        seen.add((entry.provider, entry.name))
        entries.append(entry)

    if problems:
        raise CatalogError(problems)
    assert prices_as_of is not None
    return prices_as_of, providers, entries


def _validate_model(i, raw, providers, prices_as_of, problem) -> _Entry | None:
    if not isinstance(raw, dict):
        problem("must be an object", model=f"models[{i}]")
        return None
    # Untyped JSON: validated below (the `named` flag is the str check mypy cannot follow).
    provider: Any = raw.get("provider")
    name: Any = raw.get("name")
    named = isinstance(name, str) and name.strip() != ""
    where = f"{provider}/{name}" if named and isinstance(provider, str) else f"models[{i}]"
    ok = True
    if not named:
        problem("is required: the API model id", model=where, field="name")
        ok = False
    elif name != name.strip() or len(name) > _NAME_MAX:
        problem(f"must have no surrounding spaces and at most {_NAME_MAX} characters", model=where, field="name")
        ok = False
    if provider not in providers:
        known = ", ".join(sorted(providers)) or "none"
        problem(f"must be one of the catalog's providers ({known}), not {provider!r}", model=where, field="provider")
        ok = False
    for key in sorted(set(raw) - _MODEL_KEYS):
        problem(f"unknown key (expected {', '.join(sorted(_MODEL_KEYS))})", model=where, field=key)
        ok = False
    note = raw.get("note")
    if note is not None and not isinstance(note, str):
        problem("must be a string", model=where, field="note")
        ok = False

    values: dict[str, Any] = {}
    for rate in _REQUIRED_RATES:  # the file's own rule: every model is priced
        if rate not in raw:
            problem("is required (USD per 1M tokens, as a string)", model=where, field=rate)
            ok = False
        elif raw[rate] is None:
            problem("must be a price, not null", model=where, field=rate)
            ok = False
    # Every price and limit: the rules of the API and the staff price form (PriceSerializer),
    # after the file's one rule of its own: a JSON number with a fraction is not exact.
    data = {FIELD_ATTRS[key]: raw.get(key) for key in (*_PRICE_KEYS, *_INT_FIELDS, "tokenizer")}
    data[FIELD_ATTRS["per_request"]] = raw.get("per_request", "0")
    data[FIELD_ATTRS["tiers"]] = raw.get("tiers", [])
    for key in _PRICE_KEYS:
        if isinstance(raw.get(key), float):
            problem(f'must be a decimal string such as "2.50", not {raw[key]!r}', model=where, field=key)
            ok = False
            del data[FIELD_ATTRS[key]]
    serializer = PriceSerializer(data=data)
    if not serializer.is_valid():
        for attr, message in flat_errors(serializer.errors):
            problem(message, model=where, field=_KEY_OF.get(attr, attr))
        ok = False
    for key in (*_PRICE_KEYS, *_INT_FIELDS, "tokenizer", "tiers"):
        values[key] = serializer.validated_data.get(FIELD_ATTRS[key]) if ok else None
    values["prices_as_of"] = prices_as_of
    return _Entry(provider, name, values) if ok else None
