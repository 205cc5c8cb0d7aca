"""What the ledger tells the apps above it, without importing them.

`windows_changed` is sent after a transaction that added spend to windows commits (the drain,
an estimate corrected upward), with `window_ids`. usage's AppConfig.ready() connects the alert
threshold check to it (alerts/apps.py). Receivers run after commit, outside the window locks,
and one that raises is logged and cannot undo the ledger's write (`send_after_commit`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.dispatch import Signal

# kwargs: window_ids (list[int], ascending); from the drain also `windows`: {window id:
# {"spent_nano", "amount_nano", "thresholds"}} as its statement left them.
windows_changed = Signal()


def send_after_commit(*, window_ids: list[int], **state: Any) -> None:
    """Send `windows_changed` once the current transaction commits (at once outside one).

    robust=True: a receiver that raises is logged by Django and the other on-commit callbacks
    still run, as when the drain called the alert check directly."""
    transaction.on_commit(partial(windows_changed.send, sender=None, window_ids=window_ids, **state), robust=True)
