"""POST /v1/messages/count_tokens: Anthropic's token count, free and never charged.

Claude Code and the Anthropic SDK (`client.messages.count_tokens`) call it to size a context. It
reserves nothing and writes no usage record (the provider does not bill it), but it is a request:
it counts against the key's rate limits like one, with its input bound as its tokens.

1. Shape the body as a Messages request (the same checks; what the billing inventory does not
   list passes, counted, since nothing is charged) and route its model.
2. Rate limits (429 in Anthropic's shape).
3. Count: locally when the first target's model has a known tokenizer (gateway/admission/tokens.py);
   else from the first Anthropic connection of the route that answers; else, when none can (an
   echo route, or every connection failing), the input bound admission would reserve, marked
   `x-capgate-count: bound` (an upper bound, never less than the provider would count).
"""

from __future__ import annotations

import logging

import httpx
from django.conf import settings
from django.db import DatabaseError

from core.errors import CapgateError
from gateway.admission import token_counter, tokens
from gateway.admission.bounds import Shape, parse_json, shape_messages
from gateway.admission.limits import enforce_limits
from gateway.admission.request_fields import collecting_unclassified
from gateway.admission.routing import Target, authenticate, resolve_route
from gateway.http import metrics
from gateway.http.errors import render
from gateway.http.request import ClientGone, Request
from gateway.providers import adapter, connection_url, upstream_headers
from gateway.upstream import runtime
from gateway.upstream.transport import client
from ledger.errors import BudgetUnavailable

log = logging.getLogger("capgate.gateway")
PATH = "/v1/messages/count_tokens"


def plan_count(*, raw_key: str | None, body: dict, headers: dict[str, str]) -> tuple[Shape, list[Target]]:
    """Steps 1 and 2 (on a database thread): the shaped body and the route's targets. What the
    billing inventory does not list passes here, counted: a count is never charged."""
    key = authenticate(raw_key)
    with collecting_unclassified() as found:
        shape = shape_messages(body, headers)
    metrics.count_unclassified("count_tokens", [f"{item.what}:{item.name}" for item in found])
    targets = resolve_route(key=key, name=shape.model, kind="messages")
    enforce_limits(key=key, customer=None, tokens=shape.text_tokens, targets=targets)
    return shape, targets


def local_count(body: dict, encoding_name: str) -> int | None:
    """The prompt's tokens under a public encoding: system, messages and tools as a chat prompt."""
    enc = tokens.encoding(encoding_name)
    if enc is None:
        return None
    system = body.get("system")
    messages = list(body["messages"])
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    billed = {"messages": messages, "tools": body.get("tools")}
    try:
        return tokens.count(tokens.Prompt(kind="chat", billed=billed), enc)
    except token_counter.Unavailable:  # the token counter did not answer (logged)
        return None


async def _ask_provider(targets: list[Target], body: dict, headers: dict[str, str]) -> dict | None:
    for target in targets:
        if not adapter(target).counts_tokens:  # a kind with Anthropic's own count endpoint
            continue
        try:
            resp = await client().post(
                connection_url(target.connection.base_url, PATH),
                json={**body, "model": target.model.name},
                headers=upstream_headers(target, headers),
                timeout=30,
            )
        except httpx.HTTPError as exc:
            log.warning("count_tokens: connection %s failed (%s)", target.connection.id, type(exc).__name__)
            continue
        data = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else None
        if resp.status_code == 200 and isinstance(data, dict) and isinstance(data.get("input_tokens"), int):
            return data
        if resp.status_code < 500:  # the provider's own verdict on the body: pass it on
            return {"_status": resp.status_code, "_body": resp.content}
    return None


async def handle(req: Request) -> None:
    try:
        body = parse_json(await req.body(settings.CAPGATE["MAX_BODY_BYTES"]))
        shape, targets = await runtime.db(plan_count, raw_key=req.api_key(), body=body, headers=req.headers)
        first = targets[0].model
        counted = local_count(body, first.tokenizer) if first.tokenizer else None
        if counted is not None:
            return await req.json(200, {"input_tokens": counted}, [(b"x-capgate-count", b"local")])
        answer = await _ask_provider(targets, body, req.headers)
        if answer is not None and "_status" in answer:
            return await req.respond(answer["_status"], answer["_body"])
        if answer is not None:
            return await req.json(200, answer, [(b"x-capgate-count", b"provider")])
        return await req.json(200, {"input_tokens": shape.text_tokens}, [(b"x-capgate-count", b"bound")])
    except ClientGone:
        return
    except CapgateError as exc:
        status, headers, rendered = render(exc, flavor="anthropic")
        await req.respond(status, rendered, headers)
    except DatabaseError:
        log.exception("count_tokens: database unavailable")
        status, headers, rendered = render(BudgetUnavailable("The database is unavailable."), flavor="anthropic")
        await req.respond(status, rendered, headers)
