"""Who pays: the one table of budget scopes.

A request is charged to an organization and, within it, to up to five narrower subjects. Each
scope names the column that holds its subject (the same name on Budget, Reservation and
UsageRecord), the code a caller reads when its ceiling refuses, and where a request's subject
comes from. Budget matching, window seeding, the admission statement's columns, budget
validation and the refusal code are all derived from this table; tests/ledger/test_scopes.py
checks that every derived place agrees with it. docs/architecture.md ("Adding a budget scope")
lists what else adding one touches.

Plain data: importable by budgets, the ledger, usage and the gateway alike (it imports nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scope:
    name: str  # Budget.scope
    column: str | None  # the subject's model field; None: the organization itself (every request)
    code: str  # the refusal code when a ceiling of this scope refuses
    source: str  # where a request's subject comes from

    @property
    def attname(self) -> str | None:
        """The subject's database column (a foreign key's `<field>_id`), also the attribute
        ledger.admission.Subject carries it in."""
        if self.column is None:
            return None
        return self.column if self.column.endswith("_id") else f"{self.column}_id"


# Narrowest first: when several ceilings refuse, the caller is told the first (most specific).
SCOPES: tuple[Scope, ...] = (
    Scope("run", "run_id", "run_budget", "header X-Capgate-Run (amount: X-Capgate-Run-Budget-Usd)"),
    Scope("end_customer", "end_customer", "customer_budget", "header X-Capgate-Customer"),
    Scope("key", "api_key", "key_budget", "the API key"),
    Scope("member", "member", "member_budget", "the API key's member"),
    Scope("project", "project", "project_budget", "the API key's project"),
    Scope("organization", None, "organization_budget", "the API key's organization"),
)
BY_NAME: dict[str, Scope] = {s.name: s for s in SCOPES}
# The narrower subjects' fields, broadest first (the order of the models' columns).
SUBJECT_COLUMNS: tuple[str, ...] = tuple(s.column for s in reversed(SCOPES) if s.column is not None)
# Every subject column of a charged row, with the organization's: what a reservation, a usage
# record and the admission statement's INSERT carry.
CHARGED_COLUMNS: tuple[str, ...] = (
    "organization_id",
    *(s.attname for s in reversed(SCOPES) if s.attname),
)
RANK: dict[str, int] = {s.name: i for i, s in enumerate(SCOPES)}


def refusal_code(scope: str) -> str:
    """The error code a caller reads when a ceiling of `scope` refuses."""
    return BY_NAME[scope].code


def subject_filter(budget: Any) -> dict[str, Any]:
    """{column: value} selecting the rows (reservations, usage records) charged to the subject a
    budget names; {} for an organization budget (its organization is matched apart)."""
    attname = BY_NAME[budget.scope].attname
    return {} if attname is None else {attname: getattr(budget, attname)}


def matching_sql(alias: str, params: dict[str, str]) -> str:
    """SQL that is true for a budget row (`alias`) whose scope covers a request: its scope's
    subject column equals the request's. `params` maps each subject column to its named
    parameter (`%(name)s`) holding the request's value. The organization is matched apart."""
    terms = []
    for s in reversed(SCOPES):
        if s.attname is None:
            terms.append(f"{alias}.scope = '{s.name}'")
        else:
            terms.append(f"({alias}.scope = '{s.name}' AND {alias}.{s.attname} = %({params[s.attname]})s)")
    return "(" + "\n        OR ".join(terms) + ")"


def usage_sql(scope: str, alias: str, param: str) -> str:
    """SQL that is true for a reservation or usage row (`alias`) charged to the subject of a
    budget of `scope`, the subject's value in the named parameter `param`."""
    attname = BY_NAME[scope].attname
    return "true" if attname is None else f"{alias}.{attname} = %({param})s"
