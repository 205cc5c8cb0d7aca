"""What a capcheck scenario is: a name and the hooks that make its run differ from `basic`.

A run (capcheck/run.py) always builds the same base (a fresh organization with its own
priced model, an `echo` connection and route, key A and the blocking organization cap), sends
N requests at once, waits for the drain and checks the four properties. A scenario changes that
only through the hooks below; the registry in capcheck/scenarios.py lists them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connection

from catalog.models import Connection, Model
from ledger.models import Budget, Reservation
from tenants.models import ApiKey, Organization, Project

if TYPE_CHECKING:
    from capcheck.plan import Plan, Sent, Setup, Tokens
    from ledger.models import UsageRecord

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
# Requests in mode "customer" name this end customer (admin-actions deletes it mid-burst).
CUSTOMER = "capcheck-customer"


@dataclass
class Build:
    """What a scenario's `prepare` gets: the run's organization after the base setup."""

    plan: Plan
    tokens: Tokens
    organization: Organization
    project: Project  # "Main", where key A lives
    concurrency: int  # requests in the burst
    model: Model  # the run's own priced catalog model
    echo: Connection
    route_id: int
    keys: dict[str, str] = field(default_factory=dict)  # label -> raw key, what requests send
    api_keys: dict[str, ApiKey] = field(default_factory=dict)  # label -> the key's row

    def key(self, label: str, project: Project) -> str:
        """A new key in `project`; requests are spread over every key by label."""
        raw, prefix, digest = ApiKey.generate()
        self.api_keys[label] = ApiKey.objects.create(
            organization=self.organization,
            project=project,
            name=f"capcheck {label}",
            prefix=prefix,
            key_hash=digest,
        )
        self.keys[label] = raw
        return raw

    def budget(self, name: str, scope: str, amount: int, period: str = Budget.Period.MONTH, **subject: Any) -> None:
        """A blocking budget. No threshold alerts: a capcheck run is not news (a first refusal
        still makes an event)."""
        Budget.objects.create(
            organization=self.organization,
            name=name,
            scope=scope,
            period=period,
            mode=Budget.Mode.BLOCK,
            amount_nano=amount,
            thresholds=[],
            **subject,
        )


class MidBurst(threading.Thread):
    """Work a scenario does while its burst is in flight: started with the burst, joined after it.
    `error` makes the run inconclusive; `notes()` are added to the run's problems as notes."""

    label = "mid-burst actions"  # names it in the run's report: "<label> stopped: <error>"

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.error = ""

    def notes(self) -> list[str]:
        return []


class WhenInFlight(MidBurst):
    """Once a request of the organization is in flight, do `act` (through the services the
    dashboard and API use)."""

    def __init__(self, organization_id: int, label: str, timeout: float = 10.0) -> None:
        super().__init__(name=f"capcheck-{label}")
        self.label = label
        self.organization_id = organization_id
        self.timeout = timeout
        self.done = ""

    def act(self) -> str:
        raise NotImplementedError

    def notes(self) -> list[str]:
        return [f"note: {self.label} mid-burst: {self.done or 'not done'}"]

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout
            while not Reservation.objects.filter(organization_id=self.organization_id).exists():
                if time.monotonic() > deadline:
                    self.error = "no request was in flight to act during"
                    return
                time.sleep(0.002)
            self.done = self.act()
        except Exception as exc:  # reported as a problem of the run, never silently
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            connection.close()


def _no_changes(build: Build) -> dict[str, Any]:
    return {}


def _plain(index: int) -> str:
    return "plain"


def _no_problems(setup: Setup, records: list[UsageRecord]) -> list[str]:
    return []


def _no_refusal_problems(setup: Setup, sent: list[Sent]) -> list[str]:
    return []


@dataclass(frozen=True)
class Scenario:
    name: str
    # Shapes the run after the base setup: more keys, budgets, catalog or route changes. Returns
    # `Setup` overrides (`path`, `body_extra`, `headers`).
    prepare: Callable[[Build], dict[str, Any]] = _no_changes
    # The mode of request `index`: plain | stream | disconnect (leaves after the first chunk) |
    # fault (echo answers 500) | customer (names the end customer CUSTOMER).
    mode: Callable[[int], str] = _plain
    # Sends the burst and fills in what each request was told (`Sent.status`, `code`,
    # `request_id`, `latency_s`, `error`). None: every request at once as one HTTP call each
    # (capcheck/load.py `fire`). A scenario whose requests take several calls (e.g. a job
    # submitted, then polled) brings its own.
    send: Callable[[Setup, Plan, list[Sent]], None] | None = None
    # Started with the burst and joined after it (e.g. the admin actions).
    during: Callable[[Setup, Plan], MidBurst] | None = None
    # Checks beyond the four properties, from the run's usage records: each problem found is a
    # P1 failure ("P1: ..." text).
    books: Callable[[Setup, list[UsageRecord]], list[str]] = _no_problems
    # Checks of what the requests were told, beyond the four properties (e.g. refusals a ceiling
    # with room should not have made): each problem found is a P2 failure ("P2: ..." text).
    refusals: Callable[[Setup, list[Sent]], list[str]] = _no_refusal_problems
    # Whether the run's echo connection honours the x-capgate-echo-fail header.
    fault_headers: bool = False
    # Whether the scenario takes the database away: only then may a request be answered 503
    # budget_unavailable (capcheck/check.py).
    database_outage: bool = False
