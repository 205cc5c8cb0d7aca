"""Every capcheck scenario, in the order `manage.py capcheck` runs them.

Adding a scenario is one entry in `ALL` (its hooks, capcheck/scenario.py, in its own
module when they are more than a few lines). The command's --scenario choices, the plan's
default and the run all read this list.

- basic: plain chat requests against the organization cap.
- stream: streamed chat; every fifth client leaves after the first chunk.
- multi: three keys in two projects under three stacked ceilings (organization, project, key A
  per day); each refusal names the ceiling that refused it.
- failures: every third request makes echo answer 500 (a failed-upstream row each).
- admin-actions: the cap edited and the end customer deleted mid-burst (admin_actions.py).
- cap-appears: the organization's alert budget switched to block mid-burst; narrower-budget: a
  key budget created mid-burst while processes hold slices of a loose cap, and no request may be
  refused by it (cap_changes.py).
- cross-format: chat on a route whose first target speaks Anthropic's format and cannot be
  reached, failing over to echo; each request bounded on its translated body (cross_format.py);
  cross-format-converse: the same with a Bedrock Converse connection first.
- server-tools, service-tier, route-alias: paid features and route aliases, with the books
  checked against echo's bill (billing.py).
- jobs: every request a one-line OpenAI batch on echo, admitted at submission, held by its job
  and settled by the jobs app's poll (jobs.py).
- mixed-model-batch: every request a two-line batch whose lines name a cheap and a pricier
  model on one connection; each batch must be recorded at echo's bill, line by line (jobs.py).
- db-restart: PostgreSQL restarted mid-burst (restart.py). Never run by default: only when the
  operator names the cluster capcheck may restart (`--restart-db-cluster DIR`).
"""

from __future__ import annotations

from typing import Any

from capcheck import billing, cap_changes, jobs
from capcheck.admin_actions import ADMIN_ACTIONS
from capcheck.cross_format import CROSS_FORMAT, CROSS_FORMAT_CONVERSE
from capcheck.restart import DB_RESTART
from capcheck.scenario import Build, Scenario
from ledger.models import Budget
from tenants.models import Project


def _multi(build: Build) -> dict[str, Any]:
    main = build.project
    other = Project.objects.create(organization=build.organization, name="Other", slug="other")
    build.key("B", main)
    build.key("C", other)
    build.budget("capcheck project cap", Budget.Scope.PROJECT, build.plan.project_cap_nano, project=main)
    build.budget(
        "capcheck key A daily cap",
        Budget.Scope.KEY,
        build.plan.key_cap_nano,
        Budget.Period.DAY,
        api_key=build.api_keys["A"],
    )
    return {}


ALL: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(name="basic"),
        Scenario(name="stream", mode=lambda i: "disconnect" if i % 5 == 4 else "stream"),
        Scenario(name="multi", prepare=_multi),
        Scenario(name="failures", mode=lambda i: "fault" if i % 3 == 2 else "plain", fault_headers=True),
        ADMIN_ACTIONS,
        cap_changes.CAP_APPEARS,
        cap_changes.NARROWER_BUDGET,
        billing.SERVER_TOOLS,
        billing.SERVICE_TIER,
        billing.ROUTE_ALIAS,
        CROSS_FORMAT,
        CROSS_FORMAT_CONVERSE,
        jobs.JOBS,
        jobs.MIXED_BATCH,
        DB_RESTART,
    )
}
# Scenarios run only when asked for by name, with what they need (run.py checks it).
OPT_IN = frozenset({DB_RESTART.name})
NAMES = tuple(n for n in ALL if n not in OPT_IN)
