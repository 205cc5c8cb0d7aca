"""An admission inside a caller's transaction (a first call's, which creates its end customer or
run budget in the same transaction) creates no window: a window row it inserted would stay
uncommitted until the caller commits, and a concurrent admission creating the same window waits
on it while holding the reservations table's lock, which this transaction's own admission then
needs: a deadlock (seen as 503s when budgets were edited under a burst of first calls). It gives
the transaction up instead (AdmitAgain); its caller creates the windows first and admits again."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from ledger import admission
from ledger.errors import AdmitAgain
from ledger.models import Budget, Window
from ledger.windows import ensure_windows
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _window_created_elsewhere(budget_id: int, timeout: float) -> bool:
    """Whether another connection can create the budget's window within `timeout` seconds."""
    done = threading.Event()

    def create() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = %s", [f"{int(timeout * 1000)}ms"])
            ensure_windows(budgets=[Budget.objects.get(pk=budget_id)], now=timezone.now())
            done.set()
        except OperationalError as exc:  # lock_timeout: the window is held by the other transaction
            assert getattr(exc.__cause__, "sqlstate", None) == "55P03", exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=create)
    thread.start()
    thread.join(timeout + 5)
    return done.is_set()


def test_inside_a_transaction_admission_creates_no_window(acme: Tenant):
    budget = acme.budget(amount="10")
    with pytest.raises(AdmitAgain), transaction.atomic(), admission.in_callers_transaction():
        admission.admit(request=acme.request(worst_nano=1, budgets=[budget]))
    assert not Window.objects.filter(budget=budget).exists()
    # outside one it creates the window and admits, as always
    admission.admit(request=acme.request(worst_nano=1, budgets=[budget]))
    assert Window.objects.filter(budget=budget).count() == 1


def test_without_the_guard_a_transactions_window_blocks_every_other_admission(acme: Tenant, monkeypatch):
    monkeypatch.setattr(admission.GUARDS, "admit_again_outside", False)
    budget = acme.budget(amount="10")
    with transaction.atomic(), admission.in_callers_transaction():
        admission.admit(request=acme.request(worst_nano=1, budgets=[budget]))
        # the window this transaction inserted is not committed: another admission that needs
        # it waits for this transaction, whatever locks it holds meanwhile
        assert not _window_created_elsewhere(budget.id, timeout=1.0)
    assert _window_created_elsewhere(budget.id, timeout=1.0)
