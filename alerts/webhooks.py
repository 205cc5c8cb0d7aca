"""Signed alert webhooks: one AlertDelivery per (event, webhook channel), sent at least once
with retries and backoff, recorded attempt by attempt.

Signature: `X-Capgate-Signature: sha256=<hex>`, the HMAC-SHA256 with the channel's secret over
`<X-Capgate-Timestamp>.<raw body>` (the timestamp is Unix seconds). Receivers recompute it,
compare in constant time, and reject old timestamps (replays). `X-Capgate-Delivery` is the
delivery id: a receiver that sees it twice (a retry after a lost 2xx) can drop the second.

A webhook URL is the tenant's, so it gets exactly the destination rule of an upstream
connection: checked when saved (catalog.services) and at connect time by the same guarded
transport the gateway uses (gateway/upstream/transport.py), so a name resolving to the gateway's own
network is refused whichever answer DNS gives. Redirects are not followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from datetime import datetime, timedelta
from functools import partial

import httpx
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from alerts import emails
from alerts.alert_models import AlertChannel, AlertDelivery
from alerts.models import AlertEvent

log = logging.getLogger(__name__)

Status = AlertDelivery.Status
MAX_ATTEMPTS = 8  # with the backoff below: about an hour of a receiver answering 500
RETRY_BACKOFF = 30  # seconds, doubled per attempt
RETRY_BACKOFF_MAX = 1800
CLAIM_TTL = timedelta(minutes=2)  # a request times out after WEBHOOK_TIMEOUT (10 s)


class WebhookFailed(Exception):
    """An attempt failed and will be retried (the Celery task retries on it)."""


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(RETRY_BACKOFF * 2 ** max(attempts - 1, 0), RETRY_BACKOFF_MAX))


def sign(*, secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def create_deliveries(*, event_ids: list[int]) -> None:
    """A pending delivery per event and enabled webhook channel of its organization, in the
    caller's transaction (so an event is never left without its deliveries); their tasks are
    queued after commit."""
    if not event_ids:
        return
    from django.db import transaction

    rows = []
    now = timezone.now()
    for event_id, org_id in AlertEvent.objects.filter(id__in=event_ids).values_list("id", "organization_id"):
        for channel_id in AlertChannel.objects.filter(
            organization_id=org_id, enabled=True, kind=AlertChannel.Kind.WEBHOOK
        ).values_list("id", flat=True):
            rows.append(
                AlertDelivery(
                    event_id=event_id,
                    channel_id=channel_id,
                    organization_id=org_id,
                    next_attempt_at=now + timedelta(seconds=60),
                )
            )
    if not rows:
        return
    AlertDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    ids = list(
        AlertDelivery.objects.filter(event_id__in=event_ids, status=Status.PENDING, attempts=0).values_list(
            "id", flat=True
        )
    )
    for delivery_id in ids:
        transaction.on_commit(partial(_queue, delivery_id), robust=True)


def _queue(delivery_id: int) -> None:
    from alerts.tasks import send_alert_webhook  # alerts.tasks imports this module (WebhookFailed)

    try:
        with send_alert_webhook.app.connection_for_write(transport_options={"max_retries": 0}) as conn:
            send_alert_webhook.apply_async((delivery_id,), retry=False, connection=conn)
    except Exception:
        log.warning("webhooks: could not queue delivery %s; the catch-up will send it", delivery_id, exc_info=True)


def payload(delivery: AlertDelivery) -> dict:
    """The body: capgate's event JSON, or Slack's {"text": ...}."""

    event = delivery.event
    rendered = emails.render_alert(event)
    if delivery.channel.payload_format == AlertChannel.Format.SLACK:
        return {"text": f"*{rendered.subject}*\n{rendered.text.split('-- ')[0].strip()}"}
    budget = event.budget
    return {
        "type": f"budget.{event.kind}",
        "delivery_id": delivery.id,
        "event_id": event.id,
        "organization": budget.organization.slug,
        "budget": {
            "id": budget.id,
            "name": budget.name,
            "scope": budget.scope,
            "mode": budget.mode,
            "period": budget.period,
            "subject": emails.subject_label(budget),
        },
        "threshold_percent": event.threshold if event.kind == "threshold" else None,
        "spent_nano": event.spent_nano,
        "reserved_nano": event.reserved_nano,
        "amount_nano": event.amount_nano,
        "refusals": event.refusals if event.kind == "refusal" else None,
        "tipped_by": event.tipped_by or {},
        "detail": event.detail,
        "created_at": event.created_at.isoformat(),
        "url": emails.dashboard_url(event),
        "summary": rendered.subject,
    }


async def _post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    # Against the layers (the contract's one ignored import, docs/architecture.md): the gateway's
    # transport checks the address at connect time; imported only when a webhook is sent.
    from gateway.upstream.transport import GuardedTransport

    timeout = settings.CAPGATE.get("WEBHOOK_TIMEOUT", 10.0)
    transport = GuardedTransport(limits=httpx.Limits(max_connections=1), ssl_context=httpx.create_ssl_context())
    async with httpx.AsyncClient(
        transport=transport, timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        async with asyncio.timeout(timeout):
            return await client.post(url, content=body, headers=headers)


def deliver(*, delivery_id: int, now: datetime | None = None) -> str:
    """One attempt at one delivery. Returns its status after, or "skipped" if it was not ours.

    1. Claim by compare-and-set (pending, or a claim older than CLAIM_TTL), counting the attempt.
    2. POST the signed body, outside any transaction.
    3. Record: sent on 2xx; failed at once if the destination is not allowed (retrying cannot
       help); else pending with the next attempt time, raising WebhookFailed so the task
       retries — or failed when attempts run out.
    """
    from gateway.upstream.transport import DestinationRefused  # against the layers: see _post

    now = now or timezone.now()
    claimable = Q(status=Status.PENDING) | Q(status=Status.SENDING, claimed_at__lt=now - CLAIM_TTL)
    if not AlertDelivery.objects.filter(claimable, pk=delivery_id).update(
        status=Status.SENDING, claimed_at=now, attempts=F("attempts") + 1
    ):
        return "skipped"
    delivery = AlertDelivery.objects.select_related(
        "channel",
        "event__budget__organization",
        "event__window",
        "event__budget__project",
        "event__budget__member__user",
        "event__budget__api_key",
        "event__budget__end_customer",
    ).get(pk=delivery_id)
    mine = AlertDelivery.objects.filter(pk=delivery_id, status=Status.SENDING, claimed_at=now)
    channel = delivery.channel
    body = json.dumps(payload(delivery), separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": "capgate-webhooks/1",
        "x-capgate-timestamp": str(timestamp),
        "x-capgate-delivery": str(delivery.id),
        "x-capgate-signature": sign(secret=channel.secret, timestamp=timestamp, body=body),
    }
    status_code = None
    try:
        response = asyncio.run(_post(channel.url, body, headers))
        status_code = response.status_code
        if 200 <= status_code < 300:
            mine.update(status=Status.SENT, sent_at=timezone.now(), response_status=status_code, last_error="")
            return Status.SENT
        error = f"the receiver answered {status_code}"
    except (DestinationRefused, httpx.ConnectError) as exc:
        if _refused(exc):
            mine.update(status=Status.FAILED, last_error=str(exc)[:2000])
            log.warning("webhooks: delivery %s refused: %s", delivery_id, exc)
            return Status.FAILED
        error = f"{type(exc).__name__}: {exc}"
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if delivery.attempts >= MAX_ATTEMPTS:
        mine.update(status=Status.FAILED, last_error=error[:2000], response_status=status_code)
        log.error("webhooks: giving up on delivery %s after %s attempts: %s", delivery_id, delivery.attempts, error)
        return Status.FAILED
    mine.update(
        status=Status.PENDING,
        last_error=error[:2000],
        response_status=status_code,
        next_attempt_at=now + backoff(delivery.attempts),
    )
    raise WebhookFailed(error)


def _refused(exc: BaseException) -> bool:
    from gateway.upstream.transport import DestinationRefused  # against the layers: see _post

    seen: BaseException | None = exc
    while seen is not None:  # httpx wraps httpcore's error
        if isinstance(seen, DestinationRefused):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def send_pending(*, now: datetime | None = None, limit: int = 100) -> int:
    """The catch-up: deliveries whose task was lost or whose retry is due. Returns how many
    were sent."""
    now = now or timezone.now()
    due = (
        AlertDelivery.objects.filter(
            Q(status=Status.PENDING, next_attempt_at__lte=now)
            | Q(status=Status.SENDING, claimed_at__lt=now - CLAIM_TTL)
        )
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    sent = 0
    for delivery_id in list(due):
        try:
            sent += deliver(delivery_id=delivery_id, now=now) == Status.SENT
        except WebhookFailed:
            pass  # recorded on the delivery; the next run retries
    return sent
