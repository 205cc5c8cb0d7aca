"""capcheck: the four-property method (docs/architecture.md) run against a live capgate.

For each scenario at each concurrency, `run_capcheck`:

1. creates a fresh organization with its own priced catalog model, an `echo` connection whose
   responses cost a known amount, its keys and the scenario's blocking budgets;
2. sends N requests at once over N connections (httpx, one event loop) while a sampler thread
   reads the ceilings' counters and keeps the highest `spent + reserved` it saw;
3. waits for the outbox to drain (no unapplied record, no reservation; bounded);
4. reads the database and decides the four properties (`check_organization`).

The client's view is used only to know what each request was told (served, refused, failed);
every property is decided by rows in the database. Nothing is deleted: the run's rows are the
record of the proof. Unless `keep`, the run's keys are revoked and its connection disabled.

The package: `plan` (the numbers and shapes a run shares), `scenario` (what a scenario is) and
`scenarios` (every scenario: adding one is an entry there), `load` (the burst, the sampler, the
drain wait), `check` (the four properties), `run` (the runner). This module re-exports the names
the command and the tests use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capcheck.check import CeilingReport, RunReport, check_organization
    from capcheck.load import Sampler, fire, wait_settled
    from capcheck.plan import SCENARIOS, CapcheckError, Plan, Sent, Setup, Tokens
    from capcheck.run import create_run, finish_run, plan_requests, run_capcheck, run_one

# Loaded on first use: Django imports an app's package before its models are ready, and these
# modules import models.
_HOMES = {
    "capcheck.check": ("CeilingReport", "RunReport", "check_organization"),
    "capcheck.load": ("Sampler", "fire", "wait_settled"),
    "capcheck.plan": ("SCENARIOS", "CapcheckError", "Plan", "Sent", "Setup", "Tokens"),
    "capcheck.run": ("create_run", "finish_run", "plan_requests", "run_capcheck", "run_one"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'capcheck' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


__all__ = [
    "SCENARIOS",
    "CapcheckError",
    "CeilingReport",
    "Plan",
    "RunReport",
    "Sampler",
    "Sent",
    "Setup",
    "Tokens",
    "check_organization",
    "create_run",
    "finish_run",
    "fire",
    "plan_requests",
    "run_capcheck",
    "run_one",
    "wait_settled",
]
