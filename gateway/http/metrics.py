"""Prometheus metrics (GET /metrics), correct with several uvicorn workers.

Two kinds of numbers, collected two ways:
- Events each process sees (requests, upstream calls, admissions) are prometheus-client
  counters and histograms. With PROMETHEUS_MULTIPROC_DIR set (scripts/up.sh sets it and wipes
  it at start) every process writes them to its own files there, and a scrape, whichever worker
  answers it, adds up all the files: the numbers are the server's, not one worker's.
- State that lives in the database or on disk (outbox depth and lag, live reservations and
  what they hold, alert deliveries, when each periodic task last ran, the spool) is read at
  scrape time by `StateCollector`, in the scraping process only. Per-process gauges of shared
  state would be summed (or maxed) across workers and go stale with them; one read at scrape
  time is exact and costs a scrape a few indexed counts.

Labels are bounded: endpoint (a fixed set), status, refusal code (capgate's own codes, read
from capgate's own headers), connection id and organization slug. Never a customer, a run,
a key or a request id: each would be a new series per value.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from alerts.models import AlertDelivery, AlertEvent
from core.money import nano_to_usd
from ledger.models import Reservation, UsageRecord
from ledger.periodic import staleness
from ledger.spool import pending, spool_dir

log = logging.getLogger("capgate.metrics")

# Latency buckets in seconds: admission is milliseconds, an upstream call up to minutes.
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SLOW = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

REQUESTS = Counter(
    "capgate_requests",
    "Gateway requests answered, by endpoint, status and refusal code.",
    ["endpoint", "status", "code"],
)
UPSTREAM_LATENCY = Histogram(
    "capgate_upstream_latency_seconds",
    "Time from sending an upstream call to its response headers, per connection.",
    ["connection"],
    buckets=_SLOW,
)
UPSTREAM_ERRORS = Counter(
    "capgate_upstream_errors",
    "Upstream calls that failed (connect error, timeout, 429 or 5xx), per connection.",
    ["connection", "reason"],
)
UNCLASSIFIED = Counter(
    "capgate_unclassified",
    "Admitted requests carrying a field, tool type, beta or header the billing inventory does not list "
    "(passed because no blocking budget applied), by endpoint and name (what:name).",
    ["endpoint", "name"],
)
# Names are the client's to choose: past this many distinct ones a process counts the rest as "other".
UNCLASSIFIED_NAMES_MAX = 200
_unclassified_names: set[tuple[str, str]] = set()
ADMISSION_LATENCY = Histogram(
    "capgate_admission_latency_seconds",
    "Time to authenticate, price and admit (or refuse) one gateway request.",
    buckets=_FAST,
)

_ENDPOINTS = {
    "/v1/chat/completions": "chat_completions",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses",
    "/v1/responses/compact": "responses_compact",
    "/v1/embeddings": "embeddings",
    "/v1/models": "models",
    "/v1/reservations": "reservations",
}
_RESERVATION_ACTION = re.compile(r"^/v1/reservations/[^/]+/(settle|release)$")
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def endpoint_label(path: str) -> str:
    """A fixed set of names: an unknown path is `other`, never the path itself."""
    path = path.rstrip("/")
    if path in _ENDPOINTS:
        return _ENDPOINTS[path]
    match = _RESERVATION_ACTION.match(path)
    return f"reservation_{match.group(1)}" if match else "other"


def refusal_code(status: int, headers: list[tuple[bytes, bytes]]) -> str:
    """The ceiling (402, or 200 for a refusal answered in a Responses stream: gateway/http/errors.py
    `render_failed_response`) or limit (429) that refused, from the headers capgate itself sets on
    its own refusals; relayed upstream errors carry neither header, so their codes never become
    labels."""
    wanted = b"x-capgate-budget-code" if status in (200, 402) else b"x-capgate-rate-limit" if status == 429 else None
    if wanted is None:
        return ""
    for name, value in headers:
        if name.lower() == wanted:
            code = value.decode("latin-1")
            return code if _CODE.match(code) else "other"
    return ""


Send = Callable[[dict], Awaitable[None]]


def counting(scope: dict, send: Send) -> Send:
    """Wrap a gateway request's `send` so its response is counted once, when it starts."""
    endpoint = endpoint_label(scope["path"])

    async def wrapped(message: dict) -> None:
        if message["type"] == "http.response.start":
            try:
                status = int(message["status"])
                REQUESTS.labels(endpoint, str(status), refusal_code(status, message.get("headers") or [])).inc()
            except Exception:  # metrics never break a response
                log.exception("metrics: counting a response failed")
        await send(message)

    return wrapped


def count_unclassified(endpoint: str, names: list[str]) -> None:
    for name in names:
        label = (endpoint, name[:100])
        if label not in _unclassified_names:
            if len(_unclassified_names) >= UNCLASSIFIED_NAMES_MAX:
                label = (endpoint, "other")
            else:
                _unclassified_names.add(label)
        UNCLASSIFIED.labels(*label).inc()


def observe_admission(seconds: float) -> None:
    ADMISSION_LATENCY.observe(seconds)


def observe_upstream(
    *, connection_id: int, seconds: float, status: int | None = None, error: BaseException | None = None
) -> None:
    """One upstream call: its time to headers, and whether it failed (what failover counts as
    a failure: no answer, 429 or 5xx)."""
    try:
        label = str(connection_id)
        if error is not None:
            UPSTREAM_ERRORS.labels(label, type(error).__name__[:40]).inc()
            return
        UPSTREAM_LATENCY.labels(label).observe(seconds)
        if status is not None and (status >= 500 or status == 429):
            UPSTREAM_ERRORS.labels(label, f"status_{status}").inc()
    except Exception:
        log.exception("metrics: observing an upstream call failed")


# --- state read at scrape time ----------------------------------------------------------------


def _state_rows() -> dict[str, Any]:
    """Everything StateCollector reports, in a few indexed queries."""
    from django.db.models import Count, Sum
    from django.utils import timezone

    now = timezone.now()
    outbox = UsageRecord.objects.filter(applied=False)
    oldest = outbox.order_by("id").values_list("created_at", flat=True).first()
    live = list(Reservation.objects.values("organization__slug").annotate(n=Count("id"), held=Sum("amount_nano")))
    alerts = list(AlertEvent.objects.values("status").annotate(n=Count("id")))

    deliveries = list(AlertDelivery.objects.values("status").annotate(n=Count("id")))
    return {
        "outbox": outbox.count(),
        "lag": (now - oldest).total_seconds() if oldest else 0.0,
        "live": live,
        "alerts": alerts,
        "deliveries": deliveries,
        "periodic": staleness(now=now),
    }


def _spool_lines() -> tuple[int, int]:
    """Records waiting in this host's spool, and files in its dead letter."""

    waiting = 0
    for path in pending():
        try:
            with open(path, "rb") as fh:
                waiting += sum(1 for line in fh if line.strip())
        except FileNotFoundError:  # replayed meanwhile
            continue
    return waiting, len(list(spool_dir().glob("dead-*.jsonl")))


class StateCollector(Collector):
    """Database and disk state, read when scraped. If the database is down the scrape still
    answers (process metrics, spool depth) and says so in `capgate_state_up`."""

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("capgate_state_up", "1 if the database state below could be read by this scrape.")
        try:
            state = _state_rows()
        except DatabaseError:
            log.warning("metrics: database unavailable; state metrics skipped")
            state = None
        up.add_metric([], 1.0 if state is not None else 0.0)
        yield up
        if state is not None:
            yield GaugeMetricFamily(
                "capgate_outbox_depth", "Usage records not yet applied to the budget windows.", value=state["outbox"]
            )
            yield GaugeMetricFamily(
                "capgate_drain_lag_seconds",
                "Age of the oldest usage record waiting in the outbox (0 when empty).",
                value=state["lag"],
            )
            count = GaugeMetricFamily(
                "capgate_live_reservations", "Reservations currently held, per organization.", labels=["organization"]
            )
            held = GaugeMetricFamily(
                "capgate_reserved_usd", "USD held by live reservations, per organization.", labels=["organization"]
            )
            for row in state["live"]:
                count.add_metric([row["organization__slug"]], row["n"])
                # A float only here, for Prometheus; the books stay in integer nano-USD.
                held.add_metric([row["organization__slug"]], float(nano_to_usd(row["held"] or 0)))
            yield count
            yield held
            sent = CounterMetricFamily(
                "capgate_alert_deliveries", "Alert deliveries by channel and status.", labels=["channel", "status"]
            )
            for row in state["alerts"]:
                sent.add_metric(["email", row["status"]], row["n"])
            for row in state["deliveries"]:
                sent.add_metric(["webhook", row["status"]], row["n"])
            yield sent
            yield from _periodic_families(state["periodic"])
        waiting, dead = _spool_lines()
        yield GaugeMetricFamily(
            "capgate_spool_depth", "Usage records spooled on this host, waiting for the database.", value=waiting
        )
        yield GaugeMetricFamily("capgate_spool_dead_letter_files", "Dead-letter spool files on this host.", value=dead)


def _periodic_families(rows: list) -> Iterator[GaugeMetricFamily]:
    """Beat's periodic tasks (ledger/periodic.py): one series each, labelled by task name."""
    age = GaugeMetricFamily(
        "capgate_beat_task_age_seconds",
        "Seconds since the periodic task last succeeded (since beat registered it, if it never did).",
        labels=["task"],
    )
    interval = GaugeMetricFamily(
        "capgate_beat_task_interval_seconds", "How often beat runs the periodic task.", labels=["task"]
    )
    stale = GaugeMetricFamily(
        "capgate_beat_task_stale",
        "1 if the periodic task has not succeeded for a whole interval (and at least 30 s) past its due time.",
        labels=["task"],
    )
    for row in rows:
        age.add_metric([row.task], row.age_seconds)
        interval.add_metric([row.task], row.interval_seconds)
        stale.add_metric([row.task], 1.0 if row.stale else 0.0)
    yield from (age, interval, stale)


def multiprocess_dir() -> str | None:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return path if path and os.path.isdir(path) else None


def scrape() -> bytes:
    """The exposition: every worker's counters (multiprocess mode) or this process's, plus the
    state read now."""
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    path = multiprocess_dir()
    if path is not None:
        multiprocess.MultiProcessCollector(registry, path=path)
    else:
        registry = REGISTRY  # one process: its own registry already holds everything
    state = CollectorRegistry()
    state.register(StateCollector())
    return generate_latest(registry) + generate_latest(state)


def authorized(headers: dict[str, str]) -> bool:
    """CAPGATE_METRICS_TOKEN, when set, must come as `Authorization: Bearer <token>`."""
    token = settings.CAPGATE.get("METRICS_TOKEN") or ""
    if not token:
        return True
    given = headers.get("authorization", "")
    given = given[7:].strip() if given.lower().startswith("bearer ") else ""
    return hmac.compare_digest(given.encode(), token.encode())


__all__ = ["CONTENT_TYPE_LATEST", "counting", "observe_admission", "observe_upstream", "scrape", "authorized"]
