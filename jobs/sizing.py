"""Validate and bound the requests inside a job, each exactly as the live request would be.

A batch line is shaped by the live endpoint's shaper (gateway/admission/bounds.py: the billing inventory,
the byte bound of the input), routed like a live request, and bounded at the batch price
(catalog/pricing.py `batch_rates`). Where a live request would get an output ceiling injected,
the line gets it written into its body, so the provider cannot outrun the bound. Lines of one
batch run on one connection (the provider holds the file), so they must route to the same one;
they may name different models, each bounded (and later settled, jobs/settle.py) at its own.

Under a blocking cap a live request refuses fields the inventory refuses, parts nothing can
bound and unpriced models; a batch file remembers the first such reason (`refused_code`) and a
batch of it is refused with that code when a blocking cap would govern it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from django.conf import settings

from catalog.models import Connection
from catalog.pricing import UnpricedFeature, UnpricedModel, batch_rates, rates_for, worst_case_nano
from core.errors import CapgateError
from gateway import providers
from gateway.admission.bounds import SHAPERS, Shape, parse_json
from gateway.admission.routing import Target, resolve_route
from gateway.admission.sizing import _bound, _catalog_max_output, _default_output, target_output
from gateway.http.errors import bad_request
from gateway.upstream import continuations
from tenants.models import ApiKey

# The endpoints an OpenAI batch may call, as the live endpoint kinds.
BATCH_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/embeddings": "embeddings"}
MAX_LINES = 50_000  # OpenAI's and Anthropic's per-batch maximum


@dataclass
class SizedLines:
    kind: str
    route: str
    target: Target
    bounds: list[int] = field(default_factory=list)  # nano-USD per line at the batch price
    bodies: list[dict] = field(default_factory=list)  # what the provider gets for each line
    refused_code: str = ""  # why a blocking cap cannot admit these lines ("" if it can)
    models: dict[str, int] = field(default_factory=dict)  # custom_id -> the catalog model it runs on

    @property
    def worst_nano(self) -> int:
        return sum(self.bounds)

    @property
    def line_models(self) -> dict[str, int]:
        """{custom_id: catalog model id} when the lines run on more than one model, else {}: what
        the settlement prices each line's usage at (a batch of one model is priced at the job's)."""
        return dict(self.models) if len(set(self.models.values())) > 1 else {}


# The batch APIs by the format their lines are in: the job API (gateway/providers/base.py
# Adapter.jobs), the provider's name and what its batches are called.
_BATCH_APIS = {
    "openai": ("batches", "OpenAI", "batches"),
    "anthropic": ("message_batches", "Anthropic", "message batches"),
}


def batch_connection(sized: SizedLines, kind: str) -> Connection:
    """The connection a batch's lines route to, which runs the batch: one whose kind's adapter
    runs that batch API (`kind` "openai" or "anthropic" names it)."""
    connection = sized.target.connection
    api, provider, batches = _BATCH_APIS[kind]
    adapter = providers.adapter_for(connection.kind)
    if adapter is None or api not in adapter.jobs:
        raise bad_request(
            f"The model '{sized.route}' is not served by an {provider} connection; {batches} run on the "
            "provider's batch API.",
            param="model",
            code="batch_unsupported_connection",
        )
    return connection


def _line_error(where: str, exc: CapgateError) -> CapgateError:
    exc.message = f"{where}: {exc.message}"
    return exc


def _refusal(shape: Shape, target: Target) -> str:
    if shape.refused:
        return f"{shape.refused[0]}_under_budget"
    if shape.unbounded_parts or (shape.images and not target.model.max_image_tokens):
        return "unbounded_input_under_budget"
    return ""


def _route(key: ApiKey, name: str, kind: str, routes: dict[tuple[str, str], list[Target]] | None) -> list[Target]:
    """The route's targets, resolved once per model name and endpoint for a whole file: every line
    of one file sees the same routing, and 50,000 lines cost one lookup each, not 50,000."""
    if routes is None:
        return resolve_route(key=key, name=name, kind=kind)
    found = routes.get((name, kind))
    if found is None:
        found = routes[(name, kind)] = resolve_route(key=key, name=name, kind=kind)
    return found


def size_line(
    *,
    key: ApiKey,
    body: dict,
    kind: str,
    sized: SizedLines | None,
    where: str,
    routes: dict[tuple[str, str], list[Target]] | None = None,
) -> tuple[Target, int, dict, str]:
    """One request of a job: (its target, its bound at the batch price, the body the provider
    gets, the refusal code under a blocking cap or ""). `routes` memoizes routing across one job's lines."""
    try:
        shape = SHAPERS[kind](body, {})
        if shape.stream:
            raise bad_request("a batched request cannot stream.", param="stream")
        targets = _route(key, shape.model, kind, routes)
    except CapgateError as exc:
        raise _line_error(where, exc) from None
    target = targets[0]  # a job runs where it was submitted: no failover
    if sized is not None and target.connection.id != sized.target.connection.id:
        raise bad_request(
            f"{where}: model '{shape.model}' routes to another connection than the first line's; "
            "a batch runs on one connection.",
            param="model",
            code="batch_mixed_connections",
        )
    refused = _refusal(shape, target)
    if shape.context_ref is not None:
        earlier = continuations.context_tokens(organization_id=key.organization_id, ref=shape.context_ref)
        if earlier is None:
            refused = refused or continuations.unknown_context(shape.context_ref).code
        shape = dataclasses.replace(shape, text_tokens=shape.text_tokens + (earlier or 0))
    out = {**body, **shape.patch, "model": target.model.name}
    # A ceiling above the model's maximum is bounded, and sent, at the maximum (as live).
    output = shape.max_output and target_output(target, shape.max_output)
    if output is None and kind != "embeddings":
        output = _catalog_max_output([target])
        default = _default_output(key, [target])
        if default is not None:
            output = min(output, default)
    if output is not None and kind != "embeddings":
        # The line's bound, alone, in the parameter the provider reads (as a live request's).
        out = providers.adapter(target).with_ceiling(target, kind, out, output)
    try:
        rates = batch_rates(
            rates=rates_for(model=target.model, connection=target.connection, tier=target.tier(shape.service_tier)),
            model=target.model,
        )
        worst = worst_case_nano(bound=_bound(shape, target, rates, output or 0), rates=rates)
    except UnpricedModel:
        worst, refused = 0, refused or "unpriced_model_under_budget"
    except UnpricedFeature as exc:
        worst, refused = (
            0,
            refused or f"{'service_tier' if exc.feature.startswith('service_tier') else 'feature'}_under_budget",
        )
    return target, worst, out, refused


def _add(
    sized: SizedLines | None, *, kind: str, route: str, custom_id: str, line: tuple[Target, int, dict, str]
) -> SizedLines:
    target, worst, out, refused = line
    if sized is None:
        sized = SizedLines(kind=kind, route=route, target=target)
    sized.models[custom_id] = target.model.id
    sized.bounds.append(worst)
    sized.bodies.append(out)
    sized.refused_code = sized.refused_code or refused
    return sized


def size_openai_file(*, key: ApiKey, raw: bytes) -> tuple[SizedLines, bytes]:
    """An OpenAI batch input file (JSONL of {custom_id, method, url, body}): every line shaped,
    routed and bounded; returns the bounds and the file as the provider gets it."""
    lines = [line for line in raw.split(b"\n") if line.strip()]
    if not lines:
        raise bad_request("The batch input file has no requests.", param="file", code="invalid_batch_file")
    if len(lines) > MAX_LINES:
        raise bad_request(
            f"A batch input file holds at most {MAX_LINES} requests.", param="file", code="invalid_batch_file"
        )
    sized: SizedLines | None = None
    seen: set[str] = set()
    routes: dict[tuple[str, str], list[Target]] = {}
    out_lines: list[bytes] = []
    for i, line in enumerate(lines, 1):
        where = f"line {i}"
        try:
            item = parse_json(line)
        except CapgateError as exc:
            raise _line_error(where, exc) from None
        custom_id, url, body = item.get("custom_id"), item.get("url"), item.get("body")
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            raise bad_request(
                f"{where}: 'custom_id' must be a non-empty string, unique in the file.",
                param="custom_id",
                code="invalid_batch_file",
            )
        seen.add(custom_id)
        if (
            item.get("method", "POST") != "POST"
            or not isinstance(url, str)
            or url not in BATCH_ENDPOINTS
            or not isinstance(body, dict)
        ):
            raise bad_request(
                f"{where}: each line is {{custom_id, method: POST, url: one of "
                f"{sorted(BATCH_ENDPOINTS)}, body: {{...}}}}.",
                code="invalid_batch_file",
            )
        kind = BATCH_ENDPOINTS[url]
        if sized is not None and kind != sized.kind:
            raise bad_request(
                f"{where}: every line of a batch calls the same endpoint.", param="url", code="invalid_batch_file"
            )
        sized = _add(
            sized,
            kind=kind,
            route=str(body.get("model")),
            custom_id=custom_id,
            line=size_line(key=key, body=body, kind=kind, sized=sized, where=where, routes=routes),
        )
        out_lines.append(json.dumps({**item, "method": "POST", "body": sized.bodies[-1]}).encode())
    assert sized is not None
    return sized, b"\n".join(out_lines) + b"\n"


def size_message_batch(*, key: ApiKey, body: dict) -> tuple[SizedLines, list[dict]]:
    """An Anthropic message batch ({requests: [{custom_id, params}]}): every request shaped,
    routed and bounded like POST /v1/messages; returns the bounds and the requests to send."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise bad_request("'requests' must be a non-empty array.", param="requests")
    if len(requests) > MAX_LINES:
        raise bad_request(f"A message batch holds at most {MAX_LINES} requests.", param="requests")
    sized: SizedLines | None = None
    seen: set[str] = set()
    routes: dict[tuple[str, str], list[Target]] = {}
    out: list[dict] = []
    for i, item in enumerate(requests):
        where = f"requests[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("params"), dict):
            raise bad_request(f"{where} must be {{custom_id, params}}.", param=where)
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            raise bad_request(
                f"{where}: 'custom_id' must be a non-empty string, unique in the batch.", param=f"{where}.custom_id"
            )
        seen.add(custom_id)
        sized = _add(
            sized,
            kind="messages",
            route=str(item["params"].get("model")),
            custom_id=custom_id,
            line=size_line(key=key, body=item["params"], kind="messages", sized=sized, where=where, routes=routes),
        )
        out.append({"custom_id": custom_id, "params": sized.bodies[-1]})
    assert sized is not None
    return sized, out


def max_file_bytes() -> int:
    return int(settings.CAPGATE.get("MAX_FILE_BYTES", 100 * 1024 * 1024))
