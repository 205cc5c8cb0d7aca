"""Deleting an end customer while the gateway admits a request for it. Django's foreign keys
are checked at commit, and its delete collects the rows to SET NULL before it deletes: an
admission that commits in between leaves a reservation naming a deleted customer, and the
deletion fails (capcheck's admin-actions scenario hit this at 200 concurrent). The interleaving
is forced: just before the customer's DELETE statement, the admission is told to commit."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.admission import AdmissionRequest, Subject, admit
from ledger.models import Reservation
from tenants import deletion, services
from tenants.audit import Actor
from tenants.models import EndCustomer

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN = Actor(label="test")


def _race(acme, customer) -> dict:
    admitted, commit_now, committed = threading.Event(), threading.Event(), threading.Event()
    result: dict = {}

    def admission() -> None:
        try:
            with transaction.atomic():
                admit(
                    request=AdmissionRequest(
                        subject=Subject(
                            organization_id=acme.org.id,
                            project_id=acme.project.id,
                            api_key_id=acme.key.id,
                            end_customer_id=customer.id,
                        ),
                        request_id="in-flight",
                        worst_nano=1000,
                    )
                )
                admitted.set()
                commit_now.wait(10)
            result["admission"] = "committed"
        except IntegrityError:
            result["admission"] = "refused at commit"  # the customer was gone: nothing reserved
        finally:
            committed.set()
            connection.close()

    def before_delete(execute, sql, params, many, context):  # after collection, before the DELETE
        if sql.startswith('DELETE FROM "tenants_endcustomer"') and not commit_now.is_set():
            commit_now.set()
            committed.wait(1.5)  # with the subject locked the commit waits for us: go on
        return execute(sql, params, many, context)

    def deletion() -> None:
        try:
            with connection.execute_wrapper(before_delete):
                services.delete_end_customer(customer=EndCustomer.objects.get(pk=customer.pk), actor=ADMIN)
            result["deletion"] = "done"
        except IntegrityError:
            result["deletion"] = "failed"
        finally:
            connection.close()

    a = threading.Thread(target=admission)
    a.start()
    assert admitted.wait(10)
    d = threading.Thread(target=deletion)
    d.start()
    d.join(20)
    a.join(20)
    return result


def test_deleting_a_customer_while_its_request_is_admitted_never_fails_or_leaves_a_dangling_hold(acme):
    customer = EndCustomer.objects.create(project=acme.project, external_id="c1")
    result = _race(acme, customer)
    assert result == {"deletion": "done", "admission": "refused at commit"}
    assert not EndCustomer.objects.filter(pk=customer.pk).exists()
    assert not Reservation.objects.exists()  # refused before any provider call: nothing to charge


def test_without_the_subject_lock_the_deletion_fails_on_the_in_flight_reservation(acme, monkeypatch):
    monkeypatch.setattr(deletion.GUARDS, "lock_subjects_for_delete", False)
    monkeypatch.setattr(deletion, "DELETE_ATTEMPTS", 1)
    customer = EndCustomer.objects.create(project=acme.project, external_id="c1")
    result = _race(acme, customer)
    assert result == {"deletion": "failed", "admission": "committed"}
    assert EndCustomer.objects.filter(pk=customer.pk).exists()
