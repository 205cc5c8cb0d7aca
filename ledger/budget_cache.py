"""Budget definitions cached per gateway process: the read every admission starts with, saved.

`budgets_for(subject)` is `matching_budgets(subject)` (ledger/admission.py) read through a cache
of this process, keyed by the whole subject and emptied by the notice the trigger on
budgets_budget sends from every writing transaction (core/invalidation.py). A notice names the
subject the budget covers (ledger/migrations/0006_budget_notice_subject.py) and drops only the
entries whose subject includes it: a budget of scope S covers a subject exactly when the
subject's S column holds the budget's value (ledger/scopes.py `matching_sql`), so a run's budget
reaches the entries of that run and no other. A run's or a new end customer's budget, created
on its first call, leaves every other subject's entries in place. An organization budget's
notice, or one naming a column this process does not know, drops the organization's entries.

The rule — what a stale entry can and cannot admit:

- **An entry is used only while the process is current** (`freshness.current()`: a fence it sent
  came back less than CAPGATE["CACHE_LEASE_SECONDS"] ago, so every write committed before then
  has emptied its entries). Otherwise the budgets are read from the database, as without a cache.
- **An edit made through budgets.services returns only after the lease has passed since it
  committed**, whenever a gateway process is alive (and CACHE_NOTIFY is on: the same in every
  process). By then every process has either handled the edit's notice or stopped trusting its
  entries. So **no request that arrives after an edit
  returned is admitted against the budgets from before it**: not against an amount it lowered,
  and not without a budget it created or switched to block.
- Between the commit and the return (at most the lease), a request may still be admitted from
  a headroom slice taken under the old definitions, as it would have been a moment before the
  edit. An admission made by its own statement is exact even then: the statement reads every
  amount under the window lock and reads the budgets again when a blocking budget exists that it
  does not know at its version (ledger/admission.py `stale`).
- Reads inside a transaction (a run's first call creating its budget) are neither served from
  nor stored in the cache: what they see may roll back.

tests/gateway/test_cache_notices.py and tests/gateway/test_budget_notice_scope.py show each part,
and the removal tests what breaks without it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import astuple

from django.db import connection

from core.guards import Guards
from core.invalidation import freshness
from ledger.admission import Subject, matching_budgets
from ledger.models import Budget
from ledger.scopes import SCOPES

# Notices 'budgets:<organization id>[:<subject column>:<value>]' or 'budgets:*'
# (ledger/migrations/0006_budget_notice_subject.py).
KIND = "budgets"
LIMIT = 50_000  # subjects kept per process (each a handful of budgets); least recently used go first
# Subjects whose notices are counted per organization; past it, the organization's entries are
# all dropped and its counts start again (a flood of new runs costs that organization, no other).
SUBJECT_LIMIT = 10_000
# The subject columns a notice may name: every scope's but the organization's; those holding a
# row's id (a foreign key) are counted under the int, as a Subject carries them.
COLUMNS: tuple[str, ...] = tuple(s.attname for s in SCOPES if s.attname is not None)
_ID_COLUMNS = frozenset(s.attname for s in SCOPES if s.attname is not None and s.attname != s.column)

# Removal tests: tests/gateway/test_cache_notices.py, tests/gateway/test_budget_notice_scope.py.
GUARDS = Guards(
    invalidate_on_notice="a budget write's notice empties the cached budgets it can change",
    trust_only_while_current="cached budgets are used only while a fence came back within the lease",
    drop_subject_entries="a notice naming a subject makes stale every cached entry whose subject includes it, "
    "and a read that began before it is not kept",
)


Stamp = tuple[int, int, tuple[int, ...]]  # (resets, the organization's notices, each subject column's)


class BudgetCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[Stamp, list[Budget]]] = OrderedDict()
        self._generations: dict[int, int] = {}  # organization -> organization-wide notices handled
        self._subjects: dict[int, dict[tuple[str, object], int]] = {}  # organization -> subject -> notices
        self._epoch = 0  # resets handled
        self.hits = 0
        self.misses = 0

    def budgets_for(self, subject: Subject) -> list[Budget]:
        if connection.in_atomic_block or not self._trusted():
            return matching_budgets(subject)
        key = astuple(subject)
        with self._lock:
            stamp = self._stamp(subject)
            hit = self._entries.get(key)
            if hit is not None and hit[0] == stamp:
                self._entries.move_to_end(key)
                self.hits += 1
                return list(hit[1])
        self.misses += 1
        budgets = matching_budgets(subject)
        with self._lock:
            # Kept only if no notice that can change it was handled while it was read: a read
            # that began before a write committed must not outlive the write's notice.
            if self._stamp(subject) == stamp and self._trusted():
                self._entries[key] = (stamp, budgets)
                self._entries.move_to_end(key)
                if len(self._entries) > LIMIT:
                    self._entries.popitem(last=False)
        return list(budgets)

    def _stamp(self, subject: Subject) -> Stamp:
        """What the notices that can change the subject's budgets have counted so far (lock held)."""
        org = subject.organization_id
        counts: tuple[int, ...] = ()
        if GUARDS.drop_subject_entries:
            mine = self._subjects.get(org, {})
            counts = tuple(mine.get((c, getattr(subject, c)), 0) for c in COLUMNS)
        return self._epoch, self._generations.get(org, 0), counts

    def _trusted(self) -> bool:
        return freshness.current() or not GUARDS.trust_only_while_current and freshness.enabled

    # Notices (the listener's thread or loop) --------------------------------------------------

    def changed(self, rest: str) -> None:
        """A notice `budgets:<organization id>:<column>:<value>` (a budget of that subject),
        `budgets:<organization id>` (of the whole organization), or `budgets:*` (a TRUNCATE:
        every organization's). A value may itself hold ':' (a run id)."""
        if not GUARDS.invalidate_on_notice:
            return
        org_text, _, named = rest.partition(":")
        if not org_text.isdigit():
            self.reset()
            return
        org = int(org_text)
        column, named_one, value = named.partition(":")
        known = bool(named_one) and column in COLUMNS and (column not in _ID_COLUMNS or value.isdigit())
        subject = (column, int(value) if known and column in _ID_COLUMNS else value)
        with self._lock:
            mine = self._subjects.setdefault(org, {})
            if known and (subject in mine or len(mine) < SUBJECT_LIMIT):
                mine[subject] = mine.get(subject, 0) + 1
                return
            # The whole organization (its budget, a column not known here, or too many subjects
            # counted): every entry of it is stale, so its subject counts can start again.
            self._generations[org] = self._generations.get(org, 0) + 1
            mine.clear()

    def reset(self) -> None:
        with self._lock:
            self._epoch += 1
            self._entries.clear()
            self._generations.clear()
            self._subjects.clear()

    def __len__(self) -> int:
        return len(self._entries)


cache = BudgetCache()
freshness.subscribe(KIND, changed=cache.changed, reset=cache.reset)


def budgets_for(subject: Subject) -> list[Budget]:
    """The subject's budgets: from this process's cache while it is current, else read."""
    return cache.budgets_for(subject)
