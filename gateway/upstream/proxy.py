"""One proxied request: admit, call the provider (with failover), relay, record.

Every admitted request ends in exactly one usage record (the four properties' 2 and 3):
- served: the provider reported usage; charged at its actual cost;
- failed_upstream: known not billed (connect refused, 5xx, 4xx validation); zero cost;
- estimated: the outcome is unknown (client left, timeout after sending, stream without
  usage); charged at the reserved worst case — the safe direction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable

import httpx
from django.conf import settings
from django.db import DatabaseError

from alerts.alerts import note_refusal
from catalog.pricing import Usage
from core import fastjson
from core.errors import CapgateError
from core.guards import Guards
from core.money import usd_str
from gateway.admission.bounds import SHAPERS, Shape, parse_json
from gateway.admission.request_fields import collecting_unclassified
from gateway.admission.routing import TRANSLATED, target_format
from gateway.admission.service import Admission, Target, admit_call
from gateway.admission.sizing import target_output
from gateway.http import metrics
from gateway.http.errors import GatewayError, refused_in_stream, render, render_failed_response
from gateway.http.request import ClientGone, Request
from gateway.providers import adapter, response_state
from gateway.translate import Translated, client_headers_for, translate_request
from gateway.translate import error as translated_error
from gateway.translate import reply as translated_reply
from gateway.upstream import continuations, outcomes, runtime, streams, transport
from gateway.upstream.recorder import recorder
from gateway.upstream.streams import NOT_BILLED, Attempt
from gateway.upstream.transport import client  # noqa: F401 — the jobs app calls proxy.client()
from ledger.admission import disown
from ledger.errors import BudgetExceeded, BudgetUnavailable
from ledger.recording import Outcome, RecordRejected
from ledger.spool import append
from requestlog import buffer as request_log

log = logging.getLogger("capgate.gateway")
# Removal test: tests/gateway/test_record_rejected.py.
GUARDS = Guards(
    disown_rejected="a reservation whose record the database refuses for good is disowned, so it "
    "lapses with its lease rather than being renewed by this process until its hard deadline",
)


# Background responses (`background: true`) are provider jobs: admitted here like any response,
# then handed to the jobs app (jobs/background.py), which registers itself at startup.
_background: Callable[[ProxyCall, dict], Awaitable[None]] | None = None


def register_background(handler: Callable[[ProxyCall, dict], Awaitable[None]]) -> None:
    """Hand every admitted background response to `handler` (the jobs app, once, from its
    AppConfig.ready). A second registration is refused: a response has one owner."""
    global _background
    if _background is not None:
        raise RuntimeError(f"background responses are already handed to {_background.__qualname__}")
    _background = handler


def new_request_id() -> str:
    """The `req_` prefix and a random UUID's 32 hex digits (version 4, set as uuid4 sets it),
    without building the UUID object (uuid4 was a measurable share of the event loop's time)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return "req_" + b.hex()


async def handle(req: Request, kind: str) -> None:
    call = ProxyCall(req, kind)
    await call.run()


class ProxyCall:
    """One proxied request, from its body to its one usage record (`run`).

    Its public interface, for the modules that take part in a call (gateway/upstream/streams.py,
    the jobs app's background responses); nothing outside this module uses a `_name` of it:
    - read only: `req`, `kind`, `flavor`, `request_id`, `started`, `model_name`, `shape`,
      `admission` (once admitted), `client_stream_options` (what the request log's `note` reads
      is among these);
    - what a target is sent: `format_of`, `upstream_body`, `headers_for`, `upstream_tag`;
    - how long an upstream call may take: `until_client_leaves` (cancelled when the client
      leaves) and `seconds_left` (until the request's hard deadline);
    - how it ends: `capgate_headers` (the answer's x-capgate-* headers), `served_outcome` (what
      an answered call is charged), `record` (its one usage record), `remember_response` (a
      stored response's context, for continuations), `fail` (an error in the endpoint's shape).
    """

    def __init__(self, req: Request, kind: str):
        self.req = req
        self.kind = kind
        self.flavor = "anthropic" if kind == "messages" else "openai"
        self.request_id = new_request_id()
        self.started = time.monotonic()
        self.admission: Admission | None = None
        self.text_tokens = 0  # the input bound, told to in-process providers (transport.Call)
        self.client_stream_options: dict = {}
        self.shape: Shape | None = None
        self.model_name = ""  # as the caller asked for it, for the request log
        self.body: dict = {}
        # The request in each other format, made on the admission thread when a target of that
        # format may be tried (gateway/translate/); an untranslatable request keeps its error.
        self.translated: dict[str, Translated | CapgateError] = {}
        self.conversation: str | None = None  # the Responses conversation this request is a turn of
        self.remembered = False  # its response's context is kept (`remember_response`)

    def capgate_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"x-capgate-request-id", self.request_id.encode())]
        p = self.admission
        if p is not None:  # admitted: what it reserved, and the room left under its tightest cap
            headers.append((b"x-capgate-reserved-usd", usd_str(p.worst_nano).encode()))
            # The prompt tokens that worst case reserves and how they were bounded (exact count or bytes).
            headers.append((b"x-capgate-reserved-input-tokens", str(p.input_tokens).encode()))
            headers.append((b"x-capgate-input-bound", p.input_bound.encode()))
            if p.remaining_nano is not None:
                headers.append((b"x-capgate-budget-remaining-usd", usd_str(max(p.remaining_nano, 0)).encode()))
        return headers

    async def fail(self, exc: CapgateError) -> None:
        request_log.note(self, exc)  # refused before admission: the log's row (admitted ones have a usage record)
        body_stream = self.kind == "responses" and isinstance(self.body, dict) and self.body.get("stream") is True
        if refused_in_stream(stream=body_stream, accept=self.req.headers.get("accept", ""), status=exc.status):
            status, headers, body = render_failed_response(
                exc, response_id=f"resp_{self.request_id.removeprefix('req_')}", model=self.model_name
            )
            return await self.req.respond(status, body, headers + self.capgate_headers(), b"text/event-stream")
        status, headers, body = render(exc, flavor=self.flavor)
        await self.req.respond(status, body, headers + self.capgate_headers())

    async def run(self) -> None:
        try:
            await self._proceed()
        finally:
            await self._release_turn()

    async def _release_turn(self) -> None:
        """End a conversation turn's hold (gateway/upstream/continuations.py) once its response is
        remembered or its call ended without one; a no-op when admission held nothing."""
        if self.conversation is None:
            return
        try:
            await runtime.db(
                continuations.release_turn,
                conversation_id=self.conversation,
                request_id=self.request_id,
                ran=self.admission is not None and not self.remembered,
                lane="settle",
            )
        except DatabaseError:  # the hold lapses at its expiry; the conversation waits until then
            log.warning("could not release conversation %s: database unavailable", self.conversation)

    async def _proceed(self) -> None:
        try:
            raw = await self.req.body(settings.CAPGATE["MAX_BODY_BYTES"])
        except GatewayError as exc:
            return await self.fail(exc)
        except ClientGone:
            return
        body: dict = {}
        shape = shape_error = None
        background = False
        try:
            body = self.body = parse_json(raw)
            self.model_name = str(body.get("model") or "") if isinstance(body, dict) else ""
            background = self.kind == "responses" and body.get("background") is True and _background is not None
            # A background response is bounded like the same response in the foreground. What the
            # billing inventory does not list is decided once the budgets are known (gateway/admission/unclassified.py).
            with collecting_unclassified() as found:
                shape = SHAPERS[self.kind](
                    {k: v for k, v in body.items() if k != "background"} if background else body, self.req.headers
                )
            if found:
                shape = dataclasses.replace(shape, unclassified=tuple(found))
        except CapgateError as exc:
            shape_error = exc
        if shape is not None and shape.context_ref is not None and shape.context_ref[0] == "conversation":
            self.conversation = shape.context_ref[1]
        bg = runtime.background
        admitting = time.monotonic()
        try:
            _key, self.admission = await runtime.db(
                admit_call,
                raw_key=self.req.api_key(),
                shape=shape,
                shape_error=shape_error,
                kind=self.kind,
                request_id=self.request_id,
                customer_id=self.req.headers.get("x-capgate-customer"),
                run_id=self.req.headers.get("x-capgate-run"),
                run_budget_usd=self.req.headers.get("x-capgate-run-budget-usd"),
                owner_id=bg.instance_id if bg else None,
                healthy=runtime.health.ok,
                sliced=not background,  # a provider job's reservation moves to the job
                translation=self._translation if self.kind in TRANSLATED else None,
            )
        except BudgetExceeded as exc:
            h = self.req.headers
            runtime.run_soon(
                note_refusal,
                window_id=exc.window_id,
                tipped_by={
                    "request_id": self.request_id,
                    "key": (self.req.api_key() or "")[:12],
                    "customer": h.get("x-capgate-customer", ""),
                    "run": h.get("x-capgate-run", ""),
                    "model": str(body.get("model", ""))[:200] if isinstance(body, dict) else "",
                },
            )
            return await self.fail(exc)
        except CapgateError as exc:
            return await self.fail(exc)
        except DatabaseError:
            log.exception("admission failed: database unavailable")
            return await self.fail(
                BudgetUnavailable(
                    "Budgets cannot be checked right now (database unavailable); the request was not sent."
                )
            )
        finally:
            metrics.observe_admission(time.monotonic() - admitting)
        assert shape is not None
        self.text_tokens = shape.text_tokens
        self.shape = shape
        if self.admission is not None and self.admission.unclassified:
            metrics.count_unclassified(self.kind, self.admission.unclassified)
        if self.kind == "responses" and body.get("background") is True and _background is not None:
            return await _background(self, body)
        options = body.get("stream_options")
        self.client_stream_options = options if isinstance(options, dict) else {}
        try:
            await self.forward(body, shape.stream)
        except transport.UpstreamBusy as exc:  # the tenant's upstream share is in use: nothing was sent
            await self.record(Outcome(status="failed_upstream", error=exc.message))
            await self.fail(exc)
        except Exception:
            # A bug after admission: the call may have gone out, so it is charged at its worst case
            # now rather than holding the room until expiry. If the outcome was already recorded,
            # this record is a no-op (the first record of a request id wins).
            assert self.admission is not None
            await self.record(
                Outcome(status="estimated", cost_nano=self.admission.worst_nano, error="internal error after admission")
            )
            raise

    def _translation(self, target: str) -> Shape:
        """The shape of the request in the `target` format (sizing asks on the admission thread,
        only when a target of that format may be tried); raises the field's 400 if it has none."""
        found = self.translated.get(target)
        if found is None:
            try:
                found = translate_request(kind=self.kind, body=self.body, headers=self.req.headers, target=target)
            except CapgateError as exc:
                found = exc
            self.translated[target] = found
        if isinstance(found, CapgateError):
            raise found
        return found.shape

    def format_of(self, target: Target) -> str:
        """The format `target` is sent this request in (the endpoint's own unless translated)."""
        return target_format(self.kind, target.connection) or self.kind

    # --- after admission: exactly one record per request from here on -------------------

    def upstream_body(self, body: dict, target: Target) -> dict:
        # The provider gets the target's own model id (a route name is capgate's alias) and any
        # field the billing bound rewrote (server tools' injected max_uses); a target of another
        # format gets the translated body the bound was taken from.
        kind = self.format_of(target)
        ad = adapter(target)
        patch = self.shape.patch if self.shape else {}
        if kind != self.kind:
            translated = self.translated[kind]
            assert isinstance(translated, Translated)
            body, patch = translated.body, translated.shape.patch
        out = {**body, **patch, "model": ad.model_id(target)}
        p = self.admission
        assert p is not None
        if p.inject_max_output is not None:
            out = ad.with_ceiling(target, kind, out, target_output(target, p.inject_max_output))
        if kind == "chat" and body.get("stream"):
            out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return out

    async def forward(self, body: dict, stream: bool) -> None:
        p = self.admission
        assert p is not None
        last = Attempt(kind="not_billed", status=502, error="no connection was tried")
        for target in p.targets:
            if not runtime.health.ok(target.connection.id):
                continue
            up_body = self.upstream_body(body, target)
            try:
                if stream:
                    attempt = await self.stream_attempt(target, up_body)
                else:
                    async with asyncio.timeout(self.seconds_left()):
                        attempt = await self.call_attempt(target, up_body)
            except TimeoutError:
                attempt = Attempt(kind="unknown", error="request reached its maximum lifetime")
            except ClientGone:
                await self.record(
                    Outcome(
                        status="estimated",
                        cost_nano=p.worst_nano,
                        connection_id=target.connection.id,
                        error="client disconnected before the response",
                    ),
                    target,
                )
                return
            if attempt.body and self.format_of(target) != self.kind:  # the error in the endpoint's shape
                attempt.body = translated_error(
                    attempt.body, status=attempt.status, client=self.kind, upstream=self.format_of(target)
                )
            if attempt.kind == "failover":
                runtime.health.failed(target.connection.id)
                last = attempt
                continue
            if attempt.kind == "done":
                return
            last = attempt
            break
        # No target billed (or the outcome is unknown): record it and tell the client.
        if last.kind == "unknown":
            await self.record(Outcome(status="estimated", cost_nano=p.worst_nano, error=last.error))
            return await self.fail(
                GatewayError(f"Upstream outcome unknown: {last.error}", code="upstream_timeout", status=504)
            )
        await self.record(Outcome(status="failed_upstream", error=last.error or f"upstream status {last.status}"))
        if last.body and 400 <= last.status < 500 and last.status not in (401, 403):
            return await self.req.respond(last.status, last.body, self.capgate_headers())
        if last.body and last.status in (429, 500, 502, 503, 529):
            return await self.req.respond(last.status, last.body, self.capgate_headers())
        await self.fail(
            GatewayError(f"Upstream failed: {last.error or last.status}", code="upstream_error", status=502)
        )

    async def until_client_leaves(self, coro):
        """Run coro; if the client disconnects first, cancel it and raise ClientGone."""
        work = asyncio.ensure_future(coro)
        gone = asyncio.ensure_future(_wait_disconnect(self.req))
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                return work.result()
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise ClientGone()
        finally:
            gone.cancel()

    async def call_attempt(self, target: Target, up_body: dict) -> Attempt:
        try:
            resp = await self.until_client_leaves(self._whole_call(target, up_body))
        except NOT_BILLED as exc:
            return Attempt(kind="failover", error=f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:  # sent, then the answer never came: maybe billed
            return Attempt(kind="unknown", error=f"{type(exc).__name__}: {exc}")
        status, data = resp.status_code, resp.content
        if status >= 500 or status == 429:
            return Attempt(kind="failover", status=status, body=data, error=f"upstream status {status}")
        if status >= 400:
            return Attempt(kind="not_billed", status=status, body=data, error=f"upstream rejected: {status}")
        runtime.health.succeeded(target.connection.id)
        kind = self.format_of(target)
        usage, provider_model = adapter(target).usage_from_body(kind, data)  # billed from the target's own format
        await self.record(self.served_outcome(target, usage, provider_model), target)
        if self.kind == "responses" and kind == "responses":  # a translated answer is stored nowhere
            await self.remember_response(target, _loads(data))
        if self.kind == "messages" and kind == "messages" and usage is not None:
            message = _loads(data)
            await self.remember_message(target, message.get("id") if isinstance(message, dict) else None, usage)
        if kind != self.kind:
            try:
                data = translated_reply(
                    data, upstream=kind, client=self.kind, model=provider_model or target.model.name, request=self.body
                )
            except (ValueError, TypeError, AttributeError):
                await self.fail(
                    GatewayError("The provider's answer could not be read.", code="upstream_error", status=502)
                )
                return Attempt(kind="done")
        await self.req.respond(200, data, self.capgate_headers())
        return Attempt(kind="done")

    async def _whole_call(self, target: Target, up_body: dict) -> transport.Whole:
        # The adapter may fetch a credential first (a refused one is not billed either).
        up = await adapter(target).request(
            target, self.format_of(target), up_body, self.headers_for(target), stream=False
        )
        return await transport.post(
            up.url, content=up.content, headers=up.headers, extensions=self.upstream_tag(target)
        )

    def headers_for(self, target: Target) -> dict[str, str]:
        """The client's headers an adapter may forward: none of the other format's."""
        return self.req.headers if self.format_of(target) == self.kind else client_headers_for(self.req.headers)

    async def remember_response(self, target: Target, response: object) -> None:
        """Keep a relayed response's context size, so a continuation from it can be bounded
        (gateway/upstream/continuations.py). Not when the provider does not store it either."""
        state = response_state(response)
        if state is None or (self.shape is not None and self.shape.stored is False):
            return
        await self._remember(target, *state)

    async def remember_message(self, target: Target, message_id: object, usage: Usage) -> None:
        """Keep a threaded message's context (its whole prompt and its output), so a thread's
        `continue` from it can be bounded. Only a message the provider keeps (a `thread` was sent)."""
        if self.shape is None or not self.shape.stored or not isinstance(message_id, str) or not message_id:
            return
        context = usage.prompt_tokens + usage.output_tokens
        await self._remember(target, continuations.THREAD + message_id, None, context)

    async def _remember(self, target: Target, response_id: str, conversation_id: str | None, context: int) -> None:
        p = self.admission
        assert p is not None
        try:
            await runtime.db(
                continuations.remember,
                organization_id=p.reservation.organization_id,
                connection_id=target.connection.id,
                response_id=response_id,
                conversation_id=conversation_id or self.conversation,
                context=context,
                lane="settle",
            )
            self.remembered = True
        except DatabaseError:
            # Safe direction: a continuation from an unknown id is refused under a cap.
            log.warning("could not remember response %s: database unavailable", response_id)

    def seconds_left(self) -> float:
        assert self.admission is not None
        return max(self.admission.reservation.deadline_at.timestamp() - time.time(), 0.001)

    def upstream_tag(self, target: Target) -> dict:
        """The upstream call's request extensions: whose slot it takes, and what an in-process
        provider is told of the call (gateway/upstream/transport.py)."""
        return transport.tag(
            connection=target.connection, client_headers=self.req.headers, input_tokens=self.text_tokens
        )

    def served_outcome(
        self, target: Target, usage: Usage | None, provider_model: str, error: str = "no usage reported"
    ) -> Outcome:
        """The record of a call `target` answered (gateway/upstream/outcomes.py `served`): priced
        from `usage`, or at the worst case with `error` when the provider reported none."""
        p = self.admission
        assert p is not None
        return outcomes.served(
            target=target,
            usage=usage,
            provider_model=provider_model,
            error=error,
            worst_nano=p.worst_nano,
            governed=p.governed,
            shape=self.shape,
        )

    async def stream_attempt(self, target: Target, up_body: dict) -> Attempt:
        return await streams.stream_attempt(self, target, up_body)

    async def record(self, outcome: Outcome, target: Target | None = None) -> None:
        """Insert the usage record (group commit with the records of other requests finishing
        meanwhile, gateway/upstream/recorder.py); if the database is down, spool it to disk (fsync'd)."""

        p = self.admission
        assert p is not None
        outcome = Outcome(
            **{
                **outcome.__dict__,
                "latency_ms": int((time.monotonic() - self.started) * 1000),
                "input_bound": p.input_bound,
                "error": _with_unclassified(outcome.error, p.unclassified),
            }
        )
        try:
            await recorder().record(reservation=p.reservation, outcome=outcome)
        except RecordRejected:
            # Logged once where it was refused, and never spooled (a replay would be refused
            # forever). The client is still answered; the reservation is disowned, so it lapses
            # with its lease and expiry charges it at its worst case — the safe direction — rather
            # than this process renewing it until its hard deadline. (A request from a slice has
            # no row of its own: its part stays in the slice, charged with it.)
            if p.reservation.slice_id is None and GUARDS.disown_rejected:
                try:
                    await runtime.db(disown, request_id=p.reservation.request_id, lane="settle")
                except DatabaseError:
                    log.warning("could not disown %s: it lapses at its deadline instead", self.request_id)
        except DatabaseError:
            # Kept in memory and written again when the database answers (gateway/upstream/recorder.py),
            # and spooled to disk (fsync'd) so that a crash before then loses nothing either. A
            # spool that cannot be written (full, read-only) costs the crash-safety of this one
            # record, never the answer: the provider has billed, so the client gets its response.
            recorder().park(reservation=p.reservation, outcome=outcome)
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: append(reservation=p.reservation, outcome=outcome)
                )
                log.warning("usage record for %s spooled: database unavailable", self.request_id)
            except OSError as exc:
                log.error(
                    "usage record for %s kept in memory only: database unavailable and spool not writable (%s)",
                    self.request_id,
                    exc,
                )
        if runtime.background is not None:
            runtime.background.kick_drain()


def _with_unclassified(error: str, names: list[str]) -> str:
    """The record's note names what passed unclassified (no blocking budget applied to it)."""
    if not names:
        return error
    note = "unclassified: " + ", ".join(names)
    return f"{error}; {note}" if error else note


def _loads(data: bytes) -> object:
    try:
        return fastjson.loads(data)
    except ValueError:
        return None


async def _wait_disconnect(req: Request) -> None:
    while True:
        message = await req.receive()
        if message["type"] == "http.disconnect":
            return
