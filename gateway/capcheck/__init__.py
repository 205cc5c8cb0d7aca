"""capcheck: the four-property method (DESIGN §1) run against a live capgate.

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

from gateway.capcheck.check import CeilingReport, RunReport, check_organization
from gateway.capcheck.load import Sampler, fire, wait_settled
from gateway.capcheck.plan import SCENARIOS, CapcheckError, Plan, Sent, Setup, Tokens
from gateway.capcheck.run import create_run, finish_run, plan_requests, run_capcheck, run_one

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
