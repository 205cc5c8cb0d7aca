"""Writes on the catalog: an organization's connections (secrets write-only) and routes, and
list prices — validated and audited."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlparse

from django.db import transaction

from catalog.destinations import refusal_reason
from catalog.kinds import check_kind
from catalog.models import TOKENIZERS, Connection, Model, Provider, Route, RouteTarget
from catalog.presets import PRESETS
from core.errors import InvalidChange
from tenants.audit import Actor, audit, save_changes, snapshot
from tenants.models import Organization
from tenants.services import check_output_ceiling


class KEEP:
    """Sentinel: leave a field as it is."""


RATE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok", "cache_read_usd_per_mtok", "cache_write_usd_per_mtok")
CONNECTION_FIELDS = ("name", "kind", "base_url", *RATE_FIELDS, "options", "enabled")
# Paid features beyond tokens (docs/billing.md): Decimal prices and multipliers, and token counts.
FEATURE_DECIMAL_FIELDS = (
    "cache_write_1h_usd_per_mtok",
    "web_search_usd_per_use",
    "priority_multiplier",
    "flex_multiplier",
    "fast_mode_multiplier",
    "long_context_input_multiplier",
    "long_context_output_multiplier",
)
FEATURE_INT_FIELDS = ("server_tool_result_tokens", "long_context_threshold_tokens")
MODEL_PRICE_FIELDS = (
    *RATE_FIELDS,
    "per_request_usd",
    "max_output_tokens",
    "context_window",
    "max_image_tokens",
    *FEATURE_DECIMAL_FIELDS,
    *FEATURE_INT_FIELDS,
    "tokenizer",
)
TOKENIZER_NAMES = tuple(value for value, _ in TOKENIZERS)
_MAX_RATE = Decimal("99999999")


def _check_rate(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0 or value >= _MAX_RATE:
        raise InvalidChange("A non-negative USD amount per 1M tokens.", param=name)
    if value.as_tuple().exponent < -6:  # type: ignore[operator]
        raise InvalidChange("At most 6 decimal places.", param=name)


def _check_connection(fields: dict[str, Any], *, current: Connection | None = None, secret: str | None = None) -> None:
    """The fields of a new connection, or of an edit to `current` (its kind, options and secret
    are checked as they will be after the edit)."""
    if "name" in fields and not (fields["name"] or "").strip():
        raise InvalidChange("A connection needs a name.", param="name")
    if "kind" in fields and fields["kind"] not in Connection.Kind.values:
        raise InvalidChange(f"Kind must be one of {', '.join(Connection.Kind.values)}.", param="kind")
    url = fields.get("base_url") or ""
    if url and (urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc):
        raise InvalidChange("An http(s) URL.", param="base_url")
    if url:
        _check_destination(url)
    if "options" in fields and not isinstance(fields["options"], dict):
        raise InvalidChange("An object.", param="options")
    for name in RATE_FIELDS:
        _check_rate(name, fields.get(name))
    kind = fields.get("kind", current.kind if current is not None else "")
    options = fields["options"] if "options" in fields else (current.options if current is not None else {})
    if current is not None and secret is None and kind != current.kind:
        secret = current.secret  # a new kind checks the stored secret too
    check_kind(kind=kind, options=options or {}, secret=secret if current is not None else (secret or ""))
    preset = PRESETS.get(kind)
    if preset is not None and not url and not (current is not None and current.base_url and "base_url" not in fields):
        # The preset's own base URL goes through the destination rules like any other.
        try:
            _check_destination(preset.base_url)
        except InvalidChange as exc:
            raise InvalidChange(
                f"{preset.title}'s default base URL {preset.base_url}: {exc.message} Give the server's base URL.",
                param="base_url",
            ) from None


def _check_destination(url: str, *, param: str = "base_url", what: str = "A base URL") -> None:
    """A base URL names a host and a path only; the gateway adds the endpoint's path to it.
    A host given as an address (or localhost) must be one tenants may reach; a name is checked
    on every connect, on each address it resolves to (gateway/upstream/transport.py). Alert webhooks'
    URLs go through the same check (alerts/channels.py)."""
    parts = urlparse(url)
    if parts.username is not None or parts.password is not None:
        raise InvalidChange(f"{what} cannot carry a user or password; put the key in the secret.", param=param)
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise InvalidChange(f"{what} cannot have a query (?) or a fragment (#).", param=param)
    try:
        host = parts.hostname or ""
        parts.port  # noqa: B018 — raises on a bad port
    except ValueError:
        raise InvalidChange("An http(s) URL with a valid port.", param=param) from None
    if host == "localhost" or host.endswith(".localhost"):
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return
    reason = refusal_reason(host)
    if reason is not None:
        raise InvalidChange(
            f"{parts.hostname} is not a public address ({reason}); connections may only reach "
            "public addresses unless the operator allows the network.",
            param=param,
        )


check_destination = _check_destination


def create_connection(*, organization: Organization, actor: Actor, secret: str = "", **fields: Any) -> Connection:
    _check_connection(fields, secret=secret)
    if organization.connections.filter(name=fields["name"]).exists():
        raise InvalidChange(f"A connection named {fields['name']!r} exists.", param="name")
    connection = Connection.objects.create(organization=organization, secret=secret, **fields)
    changes: dict[str, Any] = {k: [None, v] for k, v in snapshot(connection, CONNECTION_FIELDS).items()}
    if secret:
        changes["secret"] = [None, "(set)"]
    audit(organization=organization, actor=actor, action="create", obj=connection, changes=changes)
    return connection


def update_connection(
    *, connection: Connection, actor: Actor, secret: str | None = None, **fields: Any
) -> dict[str, list[Any]]:
    """`secret=None` keeps the stored secret (it is write-only: forms never show it back)."""
    _check_connection(fields, current=connection, secret=secret)
    if (
        "name" in fields
        and connection.organization.connections.filter(name=fields["name"]).exclude(pk=connection.pk).exists()
    ):
        raise InvalidChange(f"A connection named {fields['name']!r} exists.", param="name")
    secret_fields = []
    if secret is not None and secret != connection.secret:
        fields["secret"] = secret
        secret_fields = ["secret"]
    return save_changes(
        obj=connection, organization=connection.organization, actor=actor, fields=fields, secret_fields=secret_fields
    )


def delete_connection(*, connection: Connection, actor: Actor) -> None:
    audit(organization=connection.organization, actor=actor, action="delete", obj=connection)
    connection.delete()


def find_model(ref: str) -> Model:
    """`provider/model` -> the catalog Model, or InvalidChange naming what is missing."""
    provider, _, name = ref.partition("/")
    if not provider or not name:
        raise InvalidChange(f"{ref!r}: write a model as provider/model.", param="model")
    found = Model.objects.select_related("provider").filter(provider__slug=provider, name=name).first()
    if found is None:
        raise InvalidChange(f"Model {ref!r} is not in the catalog.", param="model")
    return found


def set_route(
    *,
    organization: Organization,
    name: str,
    targets: Sequence[tuple[Connection, Model]],
    actor: Actor,
    default_max_output_tokens: int | None | type[KEEP] = KEEP,
) -> tuple[Route, bool]:
    """Create or replace the route `name` with ordered targets, and set its default output
    ceiling unless it is KEEP. Returns (route, changed)."""
    if default_max_output_tokens is not KEEP:
        check_output_ceiling(default_max_output_tokens)
    if not name.strip():
        raise InvalidChange("A route needs a name.", param="name")
    if not targets:
        raise InvalidChange("A route needs at least one target.", param="targets")
    for connection, _ in targets:
        if connection.organization_id != organization.id:
            raise InvalidChange("No such connection.", param="targets")
    wanted = [(c.pk, m.pk) for c, m in targets]
    with transaction.atomic():
        route, created = Route.objects.get_or_create(organization=organization, name=name)
        ceiling_changed = False
        if default_max_output_tokens is not KEEP and route.default_max_output_tokens != default_max_output_tokens:
            audit(
                organization=organization,
                actor=actor,
                action="update",
                obj=route,
                changes={"default_max_output_tokens": [route.default_max_output_tokens, default_max_output_tokens]},
            )
            route.default_max_output_tokens = default_max_output_tokens  # type: ignore[assignment]
            route.save(update_fields=["default_max_output_tokens"])
            ceiling_changed = True
        current = list(route.targets.order_by("position").values_list("connection_id", "model_id"))
        if current == wanted:
            return route, ceiling_changed
        route.targets.all().delete()
        RouteTarget.objects.bulk_create(
            RouteTarget(route=route, connection=c, model=m, position=i) for i, (c, m) in enumerate(targets)
        )
        shown = [f"{c.name} -> {m}" for c, m in targets]
        audit(
            organization=organization,
            actor=actor,
            action="create" if created else "update",
            obj=route,
            changes={"targets": [None if created else _describe(current), shown]},
        )
    return route, True


def _describe(pairs: list[tuple[int, int]]) -> list[str]:
    conns = dict(Connection.objects.filter(pk__in=[c for c, _ in pairs]).values_list("pk", "name"))
    models = {m.pk: str(m) for m in Model.objects.select_related("provider").filter(pk__in=[m for _, m in pairs])}
    return [f"{conns.get(c)} -> {models.get(m)}" for c, m in pairs]


def delete_route(*, route: Route, actor: Actor) -> None:
    audit(organization=route.organization, actor=actor, action="delete", obj=route)
    route.delete()


def set_model_price(*, ref: str, create: bool = True, **fields: Any) -> tuple[Model, dict[str, list[Any]]]:
    """Create or update a catalog model's list price (global, not per organization: only
    staff and `manage.py apply` call this). Returns (model, {field: [from, to]})."""
    unknown = set(fields) - set(MODEL_PRICE_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {', '.join(sorted(unknown))}")
    for name in (*RATE_FIELDS, "per_request_usd", *FEATURE_DECIMAL_FIELDS):
        _check_rate(name, fields.get(name))
    # Null, never "": one spelling of "bounded by bytes" (gateway/admission/tokens.py). A wrong encoding
    # would under-count a model's prompts, so only the ones the gateway ships are accepted.
    if "tokenizer" in fields and fields["tokenizer"] is not None and fields["tokenizer"] not in TOKENIZER_NAMES:
        raise InvalidChange(f"Tokenizer must be one of {', '.join(TOKENIZER_NAMES)} or null.", param="tokenizer")
    provider_slug, _, name = ref.partition("/")
    if not provider_slug or not name:
        raise InvalidChange(f"{ref!r}: write a model as provider/model.", param="model")
    model = Model.objects.filter(provider__slug=provider_slug, name=name).first()
    if model is None:
        if not create:
            raise InvalidChange(f"Model {ref!r} is not in the catalog.", param="model")
        provider, _ = Provider.objects.get_or_create(slug=provider_slug, defaults={"name": provider_slug})
        model = Model.objects.create(provider=provider, name=name, **fields)
        return model, {k: [None, _str(v)] for k, v in fields.items() if v is not None}
    before = {k: getattr(model, k) for k in fields}
    changes = {k: [_str(before[k]), _str(v)] for k, v in fields.items() if before[k] != v}
    if changes:
        for k in changes:
            setattr(model, k, fields[k])
        model.save(update_fields=list(changes))
    return model, changes


def _str(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value
