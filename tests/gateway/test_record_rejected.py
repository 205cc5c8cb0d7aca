"""A usage record the database refuses for good (never spooled: a replay would be refused
forever) leaves its reservation to expiry. The process disowns it, so it lapses with its lease
and is charged at worst case then, instead of being renewed until its hard deadline."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from gateway.upstream import proxy
from gateway.upstream.recorder import Recorder
from ledger.admission import disown, renew
from ledger.instances import register
from ledger.models import Reservation, UsageRecord
from ledger.recording import RecordRejected, expire
from tests.conftest import usd
from tests.gateway.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


async def _refused(self, *, reservation, outcome):
    raise RecordRejected("refused for good (test)")


def _send(gateway) -> httpx.Response:
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )


def test_a_refused_record_leaves_its_reservation_to_lapse_with_its_lease(gateway, wired, monkeypatch):
    monkeypatch.setattr(Recorder, "record", _refused)
    # when: a served request whose record the database refuses
    assert _send(gateway).status_code == 200
    # then: its reservation has no owner to renew it
    (held,) = Reservation.objects.all()
    assert held.owner_id is None
    assert not UsageRecord.objects.exists()


def test_removal_without_disowning_the_live_process_keeps_renewing_it(gateway, wired, monkeypatch):
    monkeypatch.setattr(Recorder, "record", _refused)
    monkeypatch.setattr(proxy.GUARDS, "disown_rejected", False)
    assert _send(gateway).status_code == 200
    (held,) = Reservation.objects.all()
    assert held.owner_id is not None  # renewed by beat while this process lives, up to its deadline


def test_a_disowned_reservation_is_charged_when_its_lease_lapses(acme):
    acme.budget(amount="1")
    owner = register().id
    held = acme.admit(worst_nano=usd("0.1"), owner_id=owner).reservation
    assert disown(request_id=held.request_id)
    later = held.expires_at + timedelta(seconds=1)
    assert renew(owner_ids=[owner], now=later) == 0
    assert expire(now=later) == 1
    rec = UsageRecord.objects.get()
    assert (rec.request_id, rec.status, rec.cost_nano) == (held.request_id, "estimated", usd("0.1"))
    assert held.deadline_at - timezone.now() > timedelta(minutes=30)  # long before its deadline
