"""Sizing a request's worst case: price every target it could fail over to, bound its input,
pick its output ceiling, and take the largest. The proxy and the reservation API both size
here, through `size` (docs/billing.md says what each field costs).

A `proxied` request is one the gateway itself sends: it may leave unpriced fallbacks out of
the failover order and send the output ceiling it picked upstream. The reservation API's caller
calls the provider itself, so neither holds there: every target must be priced, and a request
that names no output ceiling is sized at the catalog's maximum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import cast

from django.conf import settings

from catalog.pricing import (
    Rates,
    TokenBound,
    UnpricedFeature,
    UnpricedModel,
    nano_per_output_token,
    rates_for,
    worst_case_nano,
)
from gateway.admission import request_fields, token_counter, tokens, unclassified
from gateway.admission.bounds import Shape
from gateway.admission.routing import Target, target_format
from gateway.http.errors import GatewayError
from gateway.upstream import continuations
from ledger.admission import Ceiling, headroom
from ledger.errors import BudgetExceeded
from ledger.models import Budget
from tenants.models import ApiKey


@dataclass
class Sized:
    """A request's worst case and how it was reached."""

    targets: list[Target]  # the targets it may be sent to, in failover order
    worst_nano: int
    budgets: list[Budget]  # the budgets that admit it (blocking ones left out when not governed)
    governed: bool  # False when unpriced traffic is allowed past blocking budgets
    # None when the caller stated its worst case; else with earlier context added and the
    # prompt counted exactly when it was.
    shape: Shape | None = None
    output_tokens: int = 0  # the output ceiling per choice the worst case assumes
    inject_max_output: int | None = None  # the output ceiling sent upstream (None: none is sent)
    input_bound: str = "bytes"  # how the prompt was bounded: "exact" (its tokenizer) or "bytes"
    # The request translated for targets of other formats (gateway/translate/), by format, when
    # any is tried.
    translated: dict[str, Shape] = dataclasses.field(default_factory=dict)

    def bodies(self) -> list[Shape]:
        """The shapes the targets are sent as: the request's own for its format's targets, each
        translated one for its format's (rate limits and the reserved input read these)."""
        if self.shape is None:
            return []
        kind = self.shape.kind
        formats = {target_format(kind, t.connection) or kind for t in self.targets}
        sent = [self.shape] if kind in formats else []
        sent += [body for fmt, body in self.translated.items() if fmt in formats]
        return sent or [self.shape]


# The formats an output ceiling is always sent in (the catalog's maximum when nothing else sets one).
CEILING_REQUIRED = frozenset({"messages", "converse"})

# Sizing asks for the shape of the request translated to a format only when a target of that
# format may be tried.
Translation = Callable[[str], Shape]
ShapeOf = Callable[[Target], Shape]


def _bound(shape: Shape, target: Target, rates: Rates, output_tokens: int) -> TokenBound:
    """A target's token bound. Each server-side tool use may start another sampling pass over
    the context, which by then holds the results of the uses before it, and the provider bills
    every pass's input (OpenAI's and Anthropic's usage sum it over the passes). So the input is
    bounded by (uses + 1) passes over the body plus the results each pass can hold: the i-th
    use's result is in at most (uses - i + 1) later passes, which for searches alone (each
    result at most the catalog's `server_tool_result_tokens`) sums to result x uses(uses + 1) / 2.
    With a fetch among the uses (results of different sizes) every result is counted in every
    pass after the first."""
    if shape.web_searches and rates.web_search_per_use is None:
        raise UnpricedFeature(target.model, "web search")
    if shape.web_searches and rates.server_tool_result_tokens is None:
        raise UnpricedFeature(target.model, "web search results")
    uses = shape.server_tool_uses
    images = shape.images * (target.model.max_image_tokens or 0)
    per_result = rates.server_tool_result_tokens or 0
    if shape.fetch_tokens or uses != shape.web_searches:
        results = (shape.fetch_tokens + shape.web_searches * per_result) * uses
    else:
        results = per_result * uses * (uses + 1) // 2
    return TokenBound(
        input_tokens=(shape.text_tokens + images) * (1 + uses) + results,
        output_tokens=output_tokens + shape.extra_output,
        choices=shape.choices,
        web_searches=shape.web_searches,
        cache_1h=shape.cache_1h,
    )


# Where in the body a refused name that is not itself a top-level field sits.
REFUSED_AT = {
    # An assistant message's `audio: {"id": ...}`: the provider bills the audio output it names again,
    # as input audio tokens, which the catalog has no price for and the body does not show.
    "audio_reference": "messages[].audio",
}


def bound_tokens(shape: Shape, output: int) -> int:
    """The tokens a request may use, for tokens-per-minute limits: its input bound plus its
    output ceiling per choice."""
    passes = 1 + shape.server_tool_uses
    return (shape.text_tokens + shape.fetch_tokens) * passes + (output + shape.extra_output) * shape.choices


def _catalog_max_output(targets: list[Target]) -> int:
    caps = [t.model.max_output_tokens for t in targets if t.model.max_output_tokens]
    return min(caps) if caps else settings.CAPGATE["DEFAULT_MAX_OUTPUT_TOKENS"]


def target_output(target: Target, ceiling: int) -> int:
    """The output ceiling `target` is reserved for and sent: no more than its model's catalog
    maximum (a caller's larger ceiling cannot buy more output from that model, and the smaller
    one sent upstream makes sure of it)."""
    cap = target.model.max_output_tokens
    return min(ceiling, cap) if cap else ceiling


def _default_output(key: ApiKey, targets: list[Target]) -> int | None:
    """The configured output ceiling for requests that name none: the tighter of the key's and
    the route's."""
    defaults = [d for d in (key.default_max_output_tokens, targets[0].route_max_output) if d]
    return min(defaults) if defaults else None


@dataclass
class _Priced:
    target: Target
    rates: Rates


def _price_targets(
    shape_of: ShapeOf, targets: list[Target]
) -> tuple[list[_Priced], UnpricedModel | None, UnpricedFeature | None]:
    """Each target's rates at the tier it would bill this request at, and a bound check; the
    targets that cannot be priced are set aside with the first reason."""
    priced: list[_Priced] = []
    no_model: UnpricedModel | None = None
    no_feature: UnpricedFeature | None = None
    for t in targets:
        shape = shape_of(t)
        try:
            rates = rates_for(
                model=t.model, connection=t.connection, tier=t.tier(shape.service_tier), speed=shape.speed
            )
            worst_case_nano(bound=_bound(shape, t, rates, 0), rates=rates)
        except UnpricedModel as exc:
            no_model = no_model or exc
            continue
        except UnpricedFeature as exc:
            no_feature = no_feature or exc
            continue
        priced.append(_Priced(t, rates))
    return priced, no_model, no_feature


_FEATURE_CODES = {
    "web search": "web_search",
    "web search results": "web_search",
    "1-hour cache writes": "cache_control",
    "fast mode": "speed",
}


# The catalog field a missing feature price is set in (Model; the dashboard's model page and the
# price file take the same names).
_FEATURE_FIELDS = {
    "web search": "web_search_usd_per_use, USD per search",
    "web search results": "server_tool_result_tokens, the input tokens one search's results may add",
    "1-hour cache writes": "cache_write_1h_usd_per_mtok",
}


def _feature_code(exc: UnpricedFeature) -> str:
    name = "service_tier" if exc.feature.startswith("service_tier") else _FEATURE_CODES.get(exc.feature, "feature")
    return f"{name}_under_budget"


def _countable(shape: Shape, priced: list[_Priced]) -> bool:
    return shape.prompt is not None and bool(priced) and all(p.target.model.tokenizer for p in priced)


def _count_pays(shape: Shape, priced: list[_Priced], tightest: Ceiling | None, *, governed: bool) -> bool:
    """Whether counting this prompt exactly costs less than the room it frees.

    A count frees room only under a blocking ceiling (no other budget reads a reservation's
    size), and only when every priced target's model has a local tokenizer (a byte-bound
    target, such as an Anthropic fallback, keeps bytes for all: the count must bound each
    target). There it frees (byte bound - count) x the input rate for the whole call, room that
    every other request of a burst is admitted into, and it costs CPU time linear in the text
    (bench/prompt_counts.py: ~0.03 ms per KB of English, ~0.1 ms per KB of code or CJK, on
    the gateway's database thread, not its event loop). So a prompt of up to
    EXACT_COUNT_MAX_BYTES is always counted: ~10 ms at most, against a call that holds its
    reservation for seconds. A larger one is counted only when its byte bound would take more
    than EXACT_COUNT_SHARE of the tightest ceiling's room, which includes every request the
    byte bound would refuse."""
    if not governed or not _countable(shape, priced):
        return False
    if shape.text_tokens <= settings.CAPGATE["EXACT_COUNT_MAX_BYTES"]:
        return True
    if tightest is None:
        return False
    output = shape.max_output or 0
    worst = max(
        worst_case_nano(bound=_bound(shape, p.target, p.rates, target_output(p.target, output)), rates=p.rates)
        for p in priced
    )
    return worst > settings.CAPGATE["EXACT_COUNT_SHARE"] * max(tightest.remaining_nano, 0)


def _needs_room_read(shape: Shape, priced: list[_Priced]) -> bool:
    """Whether the count decision reads the tightest ceiling: only for a prompt too large to
    count always."""
    return _countable(shape, priced) and shape.text_tokens > settings.CAPGATE["EXACT_COUNT_MAX_BYTES"]


def _exact_prompt(
    shape: Shape, priced: list[_Priced], tightest: Ceiling | None, *, governed: bool
) -> tuple[Shape, str]:
    """The shape with its prompt counted exactly where the count pays (`_count_pays`) for the
    targets it bounds. The count is the largest over the targets' encodings, and replaces the
    byte bound only below it."""
    if not _count_pays(shape, priced, tightest, governed=governed):
        return shape, "bytes"
    assert shape.prompt is not None
    counts = []
    for name in sorted({cast(str, p.target.model.tokenizer) for p in priced}):
        enc = tokens.encoding(name)
        if enc is None:  # data missing or altered: fail safe
            return shape, "bytes"
        try:
            counts.append(tokens.count(shape.prompt, enc))
        except token_counter.Unavailable:  # the token counter did not answer (logged): fail safe
            return shape, "bytes"
    exact = max(counts)
    if exact >= shape.text_tokens:
        return shape, "bytes"
    return dataclasses.replace(shape, text_tokens=exact), "exact"


def _bodies(
    shape: Shape, translated: dict[str, Shape], priced: list[_Priced]
) -> list[tuple[str, Shape, list[_Priced]]]:
    """Each body the request may be sent as, by format, with the priced targets it bounds: the
    request's own for its format's targets, each translated one for its format's."""
    by_format: dict[str, list[_Priced]] = {}
    for p in priced:
        by_format.setdefault(target_format(shape.kind, p.target.connection) or shape.kind, []).append(p)
    shapes = {shape.kind: shape, **translated}
    return [(fmt, shapes[fmt], targets) for fmt, targets in by_format.items() if fmt in shapes]


def _exact_prompts(
    shape: Shape, translated: dict[str, Shape], priced: list[_Priced], tightest: Ceiling | None, *, governed: bool
) -> tuple[Shape, dict[str, Shape], str]:
    """Every body counted where its count pays (`_exact_prompt`): a Messages request whose
    targets are OpenAI-format models with a known tokenizer is counted on the chat body it is
    sent as. "exact" when every body a priced target is sent was counted."""
    bounds = []
    translated = dict(translated)
    for fmt, body, targets in _bodies(shape, translated, priced):
        counted, bound = _exact_prompt(body, targets, tightest, governed=governed)
        bounds.append(bound)
        if fmt == shape.kind:
            shape = counted
        else:
            translated[fmt] = counted
    return shape, translated, "exact" if bounds and all(b == "exact" for b in bounds) else "bytes"


def _affordable_output(
    shape: Shape, shape_of: ShapeOf, priced: list[_Priced], tightest: Ceiling | None, cap: int
) -> int:
    floor = settings.CAPGATE["MIN_OUTPUT_TOKENS"]
    if tightest is None:
        return cap
    bounds = [(p, _bound(shape_of(p.target), p.target, p.rates, 0)) for p in priced]
    input_worst = max(worst_case_nano(bound=b, rates=p.rates) for p, b in bounds)
    per_token = (
        max(nano_per_output_token(rates=p.rates, input_tokens=b.input_tokens) for p, b in bounds) * shape.choices
    )
    room = tightest.remaining_nano - input_worst
    affordable = int(Decimal(room) / per_token) if per_token > 0 and room > 0 else (cap if per_token == 0 else 0)
    output = min(cap, max(affordable - shape.extra_output, 0))
    if output < floor:
        raise BudgetExceeded(
            code=tightest.code,
            budget_id=tightest.budget_id,
            window_id=tightest.window_id,
            limit_nano=tightest.limit_nano,
            remaining_nano=tightest.remaining_nano,
            worst_nano=input_worst + int(per_token * floor),
        )
    return output


def _settled_output(
    shape: Shape, shape_of: ShapeOf, priced: list[_Priced], tightest: Ceiling | None, cap: int, budgets: list[Budget]
) -> int:
    """`_affordable_output`, read again after applying the calls that finished on the ceilings
    (ledger/admission.py `settle_finished`) when the room it read constrains the output (a lower
    ceiling, or a refusal) and holds are counted in it: a finished call's hold must not shrink
    the next call's output ceiling."""
    try:
        output = _affordable_output(shape, shape_of, priced, tightest, cap)
        if output >= cap or tightest is None or tightest.reserved_nano == 0:
            return output
    except BudgetExceeded:
        if tightest is None or tightest.reserved_nano == 0:
            raise
    return _affordable_output(shape, shape_of, priced, headroom(budgets=budgets, settle=True), cap)


def _unpriced(exc: UnpricedModel | UnpricedFeature, *, proxied: bool) -> GatewayError:
    """The 402 for a request a blocking budget (or, unproxied, any sizing) cannot price."""
    if isinstance(exc, UnpricedFeature):
        field = _FEATURE_FIELDS.get(exc.feature)
        return GatewayError(
            f"Model {exc.model} has no catalog price for {exc.feature}"
            + (f" ({field})" if field else "")
            + ", so a blocking budget cannot admit a request that uses it."
            + ("" if proxied else " Give 'amount_usd' instead."),
            code=_feature_code(exc),
            status=402,
        )
    if not proxied:
        return GatewayError(
            f"Model {exc.model} has no price: give 'amount_usd' instead.",
            code="unpriced_model_under_budget",
            status=402,
        )
    return GatewayError(
        f"Model {exc.model} has no price, so a blocking budget cannot bound it. Add a price, or allow "
        "unpriced traffic for the organization (blocking budgets then do not govern it).",
        code="unpriced_model_under_budget",
        status=402,
    )


def _translate(
    shape: Shape, targets: list[Target], translation: Translation | None
) -> tuple[dict[str, Shape], list[Target]]:
    """The request's shape in each other format a target of which may be tried. Targets it
    cannot be translated to faithfully are left out of the failover order; with no target left,
    the request is refused (the first format's 400 naming the field)."""
    formats = [target_format(shape.kind, t.connection) or shape.kind for t in targets]
    foreign = list(dict.fromkeys(f for f in formats if f != shape.kind))
    if translation is None or not foreign:
        return {}, targets
    shapes: dict[str, Shape] = {}
    refusal: GatewayError | None = None
    for kind in foreign:
        try:
            shapes[kind] = translation(kind)
        except GatewayError as exc:
            refusal = refusal or exc
    kept = [t for t, f in zip(targets, formats, strict=True) if f == shape.kind or f in shapes]
    if not kept:
        assert refusal is not None
        raise refusal
    return shapes, kept


def size(
    *,
    key: ApiKey,
    shape: Shape,
    targets: list[Target],
    budgets: list[Budget],
    proxied: bool = True,
    translation: Translation | None = None,
) -> Sized:
    """Size the worst case of `shape` over `targets` under `budgets` (those matching its payer).

    1. Under a blocking budget, refuse fields the billing inventory refuses there
       (docs/billing.md), then price every target at the tier it would bill: a target that
       cannot be priced (no price, or none for a paid feature the request uses) is not tried,
       so a failover can never land on a call the cap does not count. With no priced target
       left: 402 naming the feature, or `unpriced_model_under_budget` unless the organization
       allows unpriced traffic (then blocking budgets do not govern it: worst case 0).
       Not proxied: any unpriced target is a 402 (the caller may call it), budget or none.
    2. Parts the catalog cannot bound (audio, files; images on a model without an image
       bound): refused under a blocking budget.
    3. Output: the caller's max tokens; else the configured default (key, route) or the
       catalog maximum, and under a blocking budget no more than the tightest ceiling can
       afford (sent upstream so the response cannot outrun it), refused below the floor.
       Not proxied: the caller's, else the catalog maximum (nothing can be sent upstream).
    4. The worst case is the largest over every target the request could fail over to, each
       bounded on the body it is sent: a target of the other format on the translated body
       (`translation`, asked for only then), each body counted exactly where its targets'
       tokenizers are known (`_exact_prompts`).
    """
    blocking = any(b.mode == Budget.Mode.BLOCK for b in budgets)
    if shape.context_ref is not None:
        earlier = continuations.context_tokens(organization_id=key.organization_id, ref=shape.context_ref)
        if earlier is None and blocking:
            raise continuations.unknown_context(shape.context_ref)
        prompt = shape.prompt and dataclasses.replace(shape.prompt, overhead=shape.prompt.overhead + (earlier or 0))
        shape = dataclasses.replace(shape, text_tokens=shape.text_tokens + (earlier or 0), prompt=prompt)
    shape = unclassified.decide(shape=shape, organization_id=key.organization_id, blocking=blocking)
    translated, targets = _translate(shape, targets, translation)

    def shape_of(target: Target) -> Shape:
        kind = target_format(shape.kind, target.connection) or shape.kind
        return translated.get(kind, shape)

    refused = shape.refused + tuple(f for t in translated.values() for f in t.refused)
    if blocking and refused:
        field = refused[0]
        raise request_fields.refused_under_budget(field, shape.forward_headers, param=REFUSED_AT.get(field, field))
    priced, no_model, no_feature = _price_targets(shape_of, targets)
    if not proxied and (no_feature or no_model):
        raise _unpriced(cast(UnpricedModel | UnpricedFeature, no_feature or no_model), proxied=False)
    if blocking and priced:
        targets = [p.target for p in priced]  # unpriced fallbacks are not tried under a cap
    elif blocking and no_feature is not None:
        raise _unpriced(no_feature, proxied=True)
    elif blocking and not key.organization.allow_unpriced:
        assert no_model is not None
        raise _unpriced(no_model, proxied=True)
    governed = blocking and bool(priced)
    if governed and (shape.unbounded_parts or (shape.images and any(not t.model.max_image_tokens for t in targets))):
        raise GatewayError(
            "The request has parts (audio, files, or images for a model without an image bound) whose cost the "
            "catalog cannot bound, so a blocking budget cannot admit it.",
            code="unbounded_input_under_budget",
            status=402,
        )

    # One unlocked read of the tightest ceiling, shared by the exact count and the output ceiling.
    affords = proxied and shape.max_output is None
    countable = any(_needs_room_read(body, ps) for _, body, ps in _bodies(shape, translated, priced))
    tightest = headroom(budgets=budgets) if governed and (affords or countable) else None
    shape, translated, input_bound = _exact_prompts(shape, translated, priced, tightest, governed=governed)
    cap = _catalog_max_output(targets)
    inject = None
    if shape.max_output is not None:
        # Sent upstream as reserved, in the parameter the provider reads: a server that knows
        # only max_tokens never sees a max_completion_tokens, so the caller's own would not hold it.
        output = shape.max_output
        inject = output if proxied else None
    elif not proxied:
        output = cap
    else:
        default = _default_output(key, targets)
        if default is not None:
            cap = min(cap, default)
        output = _settled_output(shape, shape_of, priced, tightest, cap, budgets) if governed else cap
        # Sent upstream under a cap or a configured default; Anthropic requires max_tokens, and
        # a Converse model's own default ceiling is not the catalog's, so it is always sent there.
        if governed or default is not None or CEILING_REQUIRED & {shape.kind, *translated}:
            inject = output
    if shape.kind == "embeddings":
        output, inject = 0, None
    elif shape.kind == "compact":  # no ceiling can be sent: each target may write up to its maximum
        default = settings.CAPGATE["DEFAULT_MAX_OUTPUT_TOKENS"]
        output, inject = max(t.model.max_output_tokens or default for t in targets), None
    elif targets:
        # Each target is bounded, and sent, at no more than its model's maximum (`target_output`).
        output = max(target_output(t, output) for t in targets)
        inject = inject and max(target_output(t, inject) for t in targets)

    worst = max(
        (
            worst_case_nano(
                bound=_bound(shape_of(p.target), p.target, p.rates, target_output(p.target, output)), rates=p.rates
            )
            for p in priced
        ),
        default=0,
    )
    if not governed and blocking:
        # Unpriced traffic allowed past blocking budgets: they do not govern it (the dashboard
        # says so). It still gets a reservation so its outcome is recorded and leased.
        worst = 0
        budgets = [b for b in budgets if b.mode == Budget.Mode.ALERT]
    return Sized(
        shape=shape,
        targets=targets,
        worst_nano=worst,
        output_tokens=output,
        inject_max_output=inject,
        governed=governed,
        budgets=budgets,
        input_bound=input_bound,
        translated=translated,
    )
