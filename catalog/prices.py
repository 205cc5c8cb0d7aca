"""Loading a validated price catalog (catalog/price_file.py) into Provider and Model rows.

Loading is an upsert keyed on (provider slug, model name), all or nothing, serialized by an
advisory lock. New models are created. For an existing model each field is compared three ways:
its stored value, what the catalog said when it was last loaded (`Model.catalog_values`) and
what it says now. A field nobody edited follows the catalog; a field an operator edited (its
value is not what the catalog last said) is kept and reported, unless overwrite=True. Models
missing from the catalog are never deleted (route targets protect them). Every created or
updated model leaves an audit entry (deployment-wide: no organization).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import connection, transaction

from catalog.models import Model, Provider
from catalog.price_file import (
    DEFAULT_CATALOG_PATH,
    FIELD_ATTRS,
    CatalogError,
    Problem,
    read_catalog,
    validate_catalog,
)
from tenants.audit import Actor, audit, audit_all

__all__ = [
    "DEFAULT_CATALOG_PATH",
    "FIELD_ATTRS",
    "LOADER",
    "CatalogError",
    "LoadResult",
    "ModelChange",
    "Problem",
    "load_catalog",
    "read_catalog",
]

# Serializes concurrent loads (any bigint unique to this purpose).
_ADVISORY_LOCK_KEY = 0x6361_7067_7072_6963  # "capgpric"
LOADER = Actor(label="load_prices", operator=True)


@dataclass(frozen=True)
class ModelChange:
    """One model of the catalog and, field by field, (stored value, catalog value) where they differ."""

    provider: str
    name: str
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.name}"


@dataclass
class LoadResult:
    created: list[ModelChange] = field(default_factory=list)
    updated: list[ModelChange] = field(default_factory=list)
    unchanged: list[ModelChange] = field(default_factory=list)
    # Existing models that differ from the catalog but were left alone (overwrite=False).
    kept: list[ModelChange] = field(default_factory=list)
    providers_created: list[str] = field(default_factory=list)
    prices_as_of: datetime.date | None = None
    dry_run: bool = False


def load_catalog(*, data: dict, overwrite: bool, dry_run: bool = False, actor: Actor = LOADER) -> LoadResult:
    """Upsert the catalog's providers and models; all or nothing. Raises CatalogError.

    1. Validate the whole catalog (nothing is locked or written for a bad one).
    2. Take the loader's advisory lock, then the providers' and models' rows.
    3. Per model: create it, or apply the fields nobody edited and keep the edited ones.
    4. Record what the catalog said, audit each change; a dry run rolls all of it back.
    """
    prices_as_of, providers, entries = validate_catalog(data)
    result = LoadResult(prices_as_of=prices_as_of, dry_run=dry_run)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_LOCK_KEY])
        by_slug = _upsert_providers(providers, overwrite=overwrite, result=result)
        existing = {
            (m.provider.slug, m.name): m
            for m in Model.objects.select_for_update()
            .select_related("provider")
            .filter(provider__slug__in=list(providers))
        }
        created: list[tuple[Model, ModelChange]] = []
        for entry in entries:
            record = {key: _json(value) for key, value in entry.values.items() if key != "prices_as_of"}
            model = existing.get((entry.provider, entry.name))
            if model is None:
                model = Model(provider=by_slug[entry.provider], name=entry.name, catalog_values=record)
                _assign(model, entry.values)
                change = ModelChange(entry.provider, entry.name, {k: (None, v) for k, v in entry.values.items()})
                created.append((model, change))
                continue
            applied, kept = {}, {}
            for key, (old, new) in _diff(model, entry.values).items():
                if overwrite or _follows_catalog(model, key, old):
                    applied[key] = (old, new)
                else:
                    kept[key] = (old, new)
            fields = ["catalog_values"] if model.catalog_values != record else []
            model.catalog_values = record
            if applied:
                _assign(model, {key: entry.values[key] for key in (*applied, "prices_as_of")})
                fields += [FIELD_ATTRS[key] for key in (*applied, "prices_as_of")]
                change = ModelChange(entry.provider, entry.name, applied)
                result.updated.append(change)
                audit(organization=None, actor=actor, action="update", obj=model, changes=_audited(change))
            if kept:
                result.kept.append(ModelChange(entry.provider, entry.name, kept))
            if not applied and not kept:
                result.unchanged.append(ModelChange(entry.provider, entry.name))
            if fields:
                model.save(update_fields=fields)
        # One insert for the new models and one for their audit entries: a first load creates
        # thousands. bulk_create sets their ids (PostgreSQL returns them).
        Model.objects.bulk_create([model for model, _ in created])
        audit_all(
            organization=None,
            actor=actor,
            entries=[("create", model, _audited(change)) for model, change in created],
        )
        result.created += [change for _, change in created]
        if dry_run:
            transaction.set_rollback(True)
    return result


def _json(value: Any) -> Any:
    """A catalog value as JSON, exact: Decimals as their strings."""
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _follows_catalog(model: Model, key: str, current: Any) -> bool:
    """Whether the stored value is what the catalog said last time (nobody edited it)."""
    recorded = model.catalog_values
    if not isinstance(recorded, dict) or key not in recorded:
        return False  # no record: the difference may be an operator's, so it is kept
    said = recorded[key]
    if isinstance(current, Decimal) and isinstance(said, str):
        return current == Decimal(said)
    return current == said


def _audited(change: ModelChange) -> dict[str, list[Any]]:
    return {key: [_json(old), _json(new)] for key, (old, new) in change.changes.items() if old != new}


def _assign(model: Model, values: dict[str, Any]) -> None:
    for key, value in values.items():
        setattr(model, FIELD_ATTRS[key], value)


def _diff(model: Model, values: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields whose stored value differs from the catalog's. The date alone is not a change:
    a catalog resolved on another day with the same prices changes nothing."""
    diff = {}
    for key, new in values.items():
        old = getattr(model, FIELD_ATTRS[key])
        if key != "prices_as_of" and old != new:
            diff[key] = (old, new)
    return diff


def _upsert_providers(providers: dict[str, str], *, overwrite: bool, result: LoadResult) -> dict[str, Provider]:
    found = {p.slug: p for p in Provider.objects.select_for_update().filter(slug__in=list(providers))}
    for slug, name in providers.items():
        provider = found.get(slug)
        if provider is None:
            found[slug] = Provider.objects.create(slug=slug, name=name)
            result.providers_created.append(slug)
        elif overwrite and provider.name != name:
            provider.name = name
            provider.save(update_fields=["name"])
    return found
