"""Budget definitions cached per gateway process: the read every admission starts with, saved.

`budgets_for(subject)` is `matching_budgets(subject)` (ledger/admission.py) read through a cache
of this process, keyed by the whole subject and emptied, per organization, by the notice the
trigger on budgets_budget sends from every writing transaction (core/invalidation.py).

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

tests/ledger/test_budget_cache.py shows each part, and the removal tests what breaks without it.
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

KIND = "budgets"  # notices 'budgets:<organization id>' (ledger/migrations/0002_budget_notices.py)
LIMIT = 50_000  # subjects kept per process (each a handful of budgets); least recently used go first

GUARDS = Guards(
    invalidate_on_notice="a budget write's notice empties its organization's cached budgets",
    trust_only_while_current="cached budgets are used only while a fence came back within the lease",
)


class BudgetCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[int, int, list[Budget]]] = OrderedDict()
        self._generations: dict[int, int] = {}  # organization -> notices handled
        self._epoch = 0  # resets handled
        self.hits = 0
        self.misses = 0

    def budgets_for(self, subject: Subject) -> list[Budget]:
        if connection.in_atomic_block or not self._trusted():
            return matching_budgets(subject)
        key = astuple(subject)
        org = subject.organization_id
        with self._lock:
            epoch, generation = self._epoch, self._generations.get(org, 0)
            hit = self._entries.get(key)
            if hit is not None and hit[0] == epoch and hit[1] == generation:
                self._entries.move_to_end(key)
                self.hits += 1
                return list(hit[2])
        self.misses += 1
        budgets = matching_budgets(subject)
        with self._lock:
            # Kept only if no notice for the organization was handled while it was read: a read
            # that began before a write committed must not outlive the write's notice.
            if self._epoch == epoch and self._generations.get(org, 0) == generation and self._trusted():
                self._entries[key] = (epoch, generation, budgets)
                self._entries.move_to_end(key)
                if len(self._entries) > LIMIT:
                    self._entries.popitem(last=False)
        return list(budgets)

    def _trusted(self) -> bool:
        return freshness.current() or not GUARDS.trust_only_while_current and freshness.enabled

    # Notices (the listener's thread or loop) --------------------------------------------------

    def changed(self, rest: str) -> None:
        """A notice `budgets:<organization id>`, or `budgets:*` (a TRUNCATE: every organization's)."""
        if not GUARDS.invalidate_on_notice:
            return
        if not rest.isdigit():
            self.reset()
            return
        with self._lock:
            org = int(rest)
            self._generations[org] = self._generations.get(org, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self._epoch += 1
            self._entries.clear()
            self._generations.clear()

    def __len__(self) -> int:
        return len(self._entries)


cache = BudgetCache()
freshness.subscribe(KIND, changed=cache.changed, reset=cache.reset)


def budgets_for(subject: Subject) -> list[Budget]:
    """The subject's budgets: from this process's cache while it is current, else read."""
    return cache.budgets_for(subject)
