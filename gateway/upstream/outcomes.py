"""What an answered provider call is charged: its usage priced at the model actually called and
the service tier and speed the provider says served it; a call with no usage at its worst case."""

from __future__ import annotations

from catalog.pricing import UnpricedFeature, UnpricedModel, Usage, cost_nano, rates_for
from gateway.admission.bounds import Shape
from gateway.admission.routing import Target
from ledger.recording import Outcome


def served(
    *,
    target: Target,
    usage: Usage | None,
    provider_model: str,
    error: str,
    worst_nano: int,
    governed: bool,
    shape: Shape | None,
) -> Outcome:
    """The record of a call `target` answered. Without usage the outcome is unknown: `estimated`
    at the reserved `worst_nano`, noting `error`. Under a blocking budget (`governed`), a paid
    feature that cannot be priced is charged no less than the worst case."""
    if usage is None:
        return Outcome(
            status="estimated",
            cost_nano=worst_nano,
            connection_id=target.connection.id,
            provider_model=provider_model,
            error=error,
        )
    requested = target.tier(shape.service_tier if shape else None)
    # The speed the provider says it served at; without one, the speed asked for (a fast
    # request falling back to standard is billed at standard, and the usage says so).
    speed = usage.speed or (shape.speed if shape else None)
    notes = list(usage.unpriced)
    try:
        try:
            rates = rates_for(
                model=target.model,
                connection=target.connection,
                tier=usage.service_tier or requested,
                speed=speed,
            )
        except UnpricedFeature as exc:
            notes.append(f"unpriced {exc.feature}")
            rates = rates_for(model=target.model, connection=target.connection, tier=requested)
        cost = cost_nano(usage=usage, rates=rates)
        if usage.web_search_requests and rates.web_search_per_use is None:
            notes.append("unpriced web search")
        if usage.cache_write_1h_tokens and rates.cache_write_1h is None:
            notes.append("unpriced 1-hour cache writes")
    except (UnpricedModel, UnpricedFeature):  # unpriced traffic allowed through: cost unknown
        cost = 0
        notes.append("unpriced model")
    if notes and governed:
        # A paid feature we cannot price is never dropped: charged no less than the worst
        # case reserved for it, and the record says what it was.
        cost = max(cost, worst_nano)
    return Outcome(
        status="served",
        cost_nano=cost,
        usage=usage,
        connection_id=target.connection.id,
        provider_model=provider_model or target.model.name,
        error=("unpriced usage: " + "; ".join(notes)) if notes else "",
    )
