"""capcheck's cap-change scenarios: a blocking cap that appears while the burst is in flight, and
a narrower budget that appears while gateway processes hold headroom slices of a looser one.

- cap-appears: the organization's budget is an alert budget when the burst starts; once requests
  are in flight it is switched to block. The new window must carry every request in flight
  (those admitted from a slice of no blocking ceiling too): P1 holds from where it started.
- narrower-budget: the organization cap is loose (four times the burst's worst cases), so
  processes take large slices; once requests are in flight, key A gets a budget that can hold
  every request of the burst. Its window carries the live slices' whole rows, unused parts
  included; a request it refuses was refused for room the key had, and is counted as a problem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from budgets.services import create_budget, update_budget
from capcheck.scenario import Build, MidBurst, Scenario, WhenInFlight
from ledger.models import Budget
from tenants.audit import Actor
from tenants.models import ApiKey, Organization

if TYPE_CHECKING:
    from capcheck.plan import Plan, Sent, Setup

ADMIN = Actor(label="capcheck")
# The narrower budget holds this many times the burst's worst cases: it never needs to refuse.
NARROWER_MARGIN = 1.1
LOOSE_CAP_FACTOR = 4


class SwitchToBlock(WhenInFlight):
    def act(self) -> str:
        cap = Budget.objects.get(organization_id=self.organization_id, scope=Budget.Scope.ORGANIZATION)
        update_budget(budget=cap, actor=ADMIN, mode=Budget.Mode.BLOCK)
        return "the organization budget switched from alert to block"


class NarrowerKeyBudget(WhenInFlight):
    def __init__(self, organization_id: int, amount_nano: int) -> None:
        super().__init__(organization_id, "narrower budget")
        self.amount_nano = amount_nano

    def act(self) -> str:
        org = Organization.objects.get(pk=self.organization_id)
        key = ApiKey.objects.get(organization=org, name="capcheck A")
        create_budget(
            organization=org,
            actor=ADMIN,
            scope=Budget.Scope.KEY,
            api_key=key,
            amount_nano=self.amount_nano,
            name="capcheck narrower key budget",
            period=Budget.Period.MONTH,
            mode=Budget.Mode.BLOCK,
            thresholds=[],
        )
        return f"key A budget of {self.amount_nano} nano-USD created"


def _alert_first(build: Build) -> dict[str, Any]:
    Budget.objects.filter(organization=build.organization, scope=Budget.Scope.ORGANIZATION).update(
        mode=Budget.Mode.ALERT
    )
    return {}


def _loose_cap(build: Build) -> dict[str, Any]:
    Budget.objects.filter(organization=build.organization, scope=Budget.Scope.ORGANIZATION).update(
        amount_nano=LOOSE_CAP_FACTOR * build.concurrency * build.tokens.worst_nano
    )
    return {}


def _narrower_amount(setup: Setup) -> int:
    return int(setup.concurrency * setup.tokens.worst_nano * NARROWER_MARGIN)


def _no_false_refusals(setup: Setup, sent: list[Sent]) -> list[str]:
    false = [s for s in sent if s.status == 402 and s.code == "key_budget"]
    if not false:
        return []
    return [
        f"P2: {len(false)} requests refused key_budget by a budget of {_narrower_amount(setup)} nano-USD that "
        f"holds every request of the burst (first: request {false[0].index}, {false[0].request_id})"
    ]


def _switch(setup: Setup, plan: Plan) -> MidBurst:
    return SwitchToBlock(setup.organization.id, "cap appears")


def _narrower(setup: Setup, plan: Plan) -> MidBurst:
    return NarrowerKeyBudget(setup.organization.id, _narrower_amount(setup))


CAP_APPEARS = Scenario(name="cap-appears", prepare=_alert_first, during=_switch)
NARROWER_BUDGET = Scenario(name="narrower-budget", prepare=_loose_cap, during=_narrower, refusals=_no_false_refusals)
