"""Background responses (POST /v1/responses with `background: true`) as provider jobs.

The gateway admits one like the same response in the foreground (gateway/upstream/proxy.py: the same
shape, output ceiling and worst case, through the same `admit`); here it is sent, and once the
provider has queued it the reservation moves to the job. A response the provider finished at
once is settled at once. GET, cancel and DELETE go through the stored-response endpoints
(gateway/upstream/proxy.py `handle_stored_response`), for the owning organization only."""

from __future__ import annotations

import json
import logging

import httpx
from django.db import DatabaseError

from gateway import providers
from gateway.http.errors import GatewayError
from gateway.providers import usage_responses
from gateway.upstream import continuations, runtime
from gateway.upstream.proxy import ProxyCall, client
from jobs import quotas, service
from jobs.models import Job
from jobs.submit import give_back_slot
from jobs.upstream import NOT_SENT, loads, send
from ledger.errors import BudgetUnavailable
from ledger.models import UsageRecord
from ledger.recording import Outcome

log = logging.getLogger("capgate.jobs")
FINAL = {"completed", "incomplete", "failed", "cancelled"}


async def submit(call: ProxyCall, body: dict) -> None:
    p = call.admission
    assert p is not None
    if body.get("stream"):
        await call.record(Outcome(status=UsageRecord.Status.FAILED_UPSTREAM, error="background stream not sent"))
        return await call.fail(
            GatewayError(
                "A background response cannot stream through capgate; poll it with GET /v1/responses/{id}.",
                code="invalid_request",
                status=400,
                param="stream",
            )
        )
    if call.conversation is not None and p.governed:
        # A job runs for as long as the provider takes, beside whatever turn comes next: the one
        # turn at a time a conversation is held to under a blocking budget cannot cover it.
        await call.record(Outcome(status=UsageRecord.Status.FAILED_UPSTREAM, error="background turn not sent"))
        return await call.fail(
            GatewayError(
                "A background response cannot continue a conversation under a blocking budget: capgate runs one "
                "turn of a conversation at a time, and a background turn outlives the request.",
                code="background_conversation_under_budget",
                status=402,
                param="conversation",
            )
        )
    request_id = p.reservation.request_id
    try:  # admitted already (the proxy's admission): refused here, its hold is released at zero
        await runtime.db(quotas.take_slot, organization_id=p.reservation.organization_id, request_id=request_id)
    except (GatewayError, DatabaseError) as exc:
        refusal = exc if isinstance(exc, GatewayError) else BudgetUnavailable("The database is unavailable.")
        await call.record(Outcome(status=UsageRecord.Status.FAILED_UPSTREAM, error=refusal.message))
        return await call.fail(refusal)
    try:
        await _send(call, body)
    finally:
        await give_back_slot(request_id)


async def _send(call: ProxyCall, body: dict) -> None:
    p = call.admission
    assert p is not None
    target = next((t for t in p.targets if runtime.health.ok(t.connection.id)), p.targets[0])
    adapter = providers.adapter_for(target.connection.kind)
    if adapter is None or "background" not in adapter.jobs:
        await call.record(Outcome(status=UsageRecord.Status.FAILED_UPSTREAM, error="background not supported here"))
        return await call.fail(
            GatewayError(
                "Background responses need an OpenAI connection.",
                code="background_unsupported_connection",
                status=400,
                param="model",
            )
        )
    up_body = call.upstream_body(body, target)
    try:
        resp = await send(client(), target.connection, "POST", "/v1/responses", body=up_body)
    except NOT_SENT as exc:
        await call.record(
            Outcome(
                status=UsageRecord.Status.FAILED_UPSTREAM,
                connection_id=target.connection.id,
                error=f"not sent: {type(exc).__name__}",
            )
        )
        return await call.fail(
            GatewayError(f"Upstream failed: {type(exc).__name__}", code="upstream_error", status=502)
        )
    except httpx.HTTPError as exc:
        await call.record(
            Outcome(
                status=UsageRecord.Status.ESTIMATED,
                cost_nano=p.worst_nano,
                connection_id=target.connection.id,
                error=f"outcome unknown: {type(exc).__name__}",
            )
        )
        return await call.fail(GatewayError("Upstream outcome unknown.", code="upstream_timeout", status=504))
    data = loads(resp.content)
    if resp.status_code != 200 or not isinstance(data, dict) or not isinstance(data.get("id"), str):
        await call.record(
            Outcome(
                status=UsageRecord.Status.FAILED_UPSTREAM,
                connection_id=target.connection.id,
                error=f"upstream rejected: {resp.status_code}",
            )
        )
        return await call.req.respond(
            resp.status_code if resp.status_code >= 400 else 502, resp.content, call.capgate_headers()
        )
    response_id = data["id"]
    # Owned by this organization from now on, with a context bound a continuation can use before
    # it finishes: everything this response may read and write.
    output = p.inject_max_output or (call.shape.max_output if call.shape else None) or 0
    try:
        await runtime.db(
            continuations.remember,
            organization_id=p.reservation.organization_id,
            connection_id=target.connection.id,
            response_id=response_id,
            conversation_id=None,
            context=p.input_tokens + output,
            lane="settle",
        )
    except DatabaseError:
        log.warning("could not remember background response %s", response_id)
    if data.get("status") in FINAL:
        usage = usage_responses(data)
        await call.record(
            call.served_outcome(target, usage, str(data.get("model") or ""))
            if usage is not None
            else Outcome(
                status=UsageRecord.Status.FAILED_UPSTREAM,
                connection_id=target.connection.id,
                error=f"background response {data.get('status')} without usage",
            ),
            target,
        )
    else:
        try:
            await runtime.db(
                service.start_job,
                reservation=p.reservation,
                kind=Job.Kind.RESPONSE,
                provider_job_id=response_id,
                connection_id=target.connection.id,
                model_id=target.model.id,
                route=call.model_name,
                api_key_id=p.reservation.api_key_id,
                provider_status=str(data.get("status") or ""),
                lane="settle",
            )
        except DatabaseError:
            log.exception("jobs: background response %s not recorded; its hold lapses to worst case", response_id)
    await call.req.respond(200, json.dumps(data).encode(), call.capgate_headers())
