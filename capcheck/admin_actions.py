"""capcheck's admin-actions scenario: the organization cap edited mid-burst, and the end customer
half the requests are charged to deleted, through the services the dashboard and API use."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from budgets.services import create_budget, delete_budget, update_budget
from capcheck.scenario import MidBurst, Scenario, WhenInFlight
from ledger.models import Budget
from tenants.audit import Actor
from tenants.models import EndCustomer, Organization
from tenants.services import delete_end_customer

if TYPE_CHECKING:
    from capcheck.plan import Plan, Setup

ADMIN = Actor(label="capcheck")


class AdminActions(WhenInFlight):
    """While the burst is in flight: lower and raise the organization cap, change its timezone
    and period (and back), delete and recreate it, and delete the end customer half the
    requests are charged to — through the same services the dashboard and API use."""

    def __init__(self, organization_id: int, amount_nano: int, timeout: float = 10.0):
        super().__init__(organization_id, "admin actions", timeout=timeout)
        self.amount_nano = amount_nano
        self.steps_done: list[str] = []

    def notes(self) -> list[str]:
        return [f"note: admin actions done mid-burst: {', '.join(self.steps_done) or 'none'}"]

    def act(self) -> str:
        def delete_customers() -> None:
            for c in EndCustomer.objects.filter(project__organization_id=self.organization_id):
                delete_end_customer(customer=c, actor=ADMIN)

        def cap() -> Budget:
            return Budget.objects.get(organization_id=self.organization_id, scope=Budget.Scope.ORGANIZATION)

        steps: list[tuple[str, Callable[[], object]]] = [
            ("lower", lambda: update_budget(budget=cap(), actor=ADMIN, amount_nano=self.amount_nano // 2)),
            ("raise", lambda: update_budget(budget=cap(), actor=ADMIN, amount_nano=self.amount_nano)),
            ("timezone", lambda: update_budget(budget=cap(), actor=ADMIN, timezone="Pacific/Kiritimati")),
            ("timezone back", lambda: update_budget(budget=cap(), actor=ADMIN, timezone="UTC")),
            ("period", lambda: update_budget(budget=cap(), actor=ADMIN, period=Budget.Period.WEEK)),
            ("period back", lambda: update_budget(budget=cap(), actor=ADMIN, period=Budget.Period.MONTH)),
            ("delete", lambda: delete_budget(budget=cap(), actor=ADMIN)),
            (
                "recreate",
                lambda: create_budget(
                    organization=Organization.objects.get(pk=self.organization_id),
                    actor=ADMIN,
                    scope=Budget.Scope.ORGANIZATION,
                    amount_nano=self.amount_nano,
                    name="capcheck organization cap",
                    period=Budget.Period.MONTH,
                    mode=Budget.Mode.BLOCK,
                    thresholds=[],
                ),
            ),
            ("delete customer", lambda: delete_customers()),
        ]
        for name, step in steps:
            step()
            self.steps_done.append(name)
            time.sleep(0.01)
        return ", ".join(self.steps_done)


def _during(setup: Setup, plan: Plan) -> MidBurst:
    return AdminActions(setup.organization.id, plan.cap_nano)


# Half the requests name the end customer (plan.CUSTOMER) that the actions delete.
ADMIN_ACTIONS = Scenario(name="admin-actions", mode=lambda i: "customer" if i % 2 else "plain", during=_during)
