"""Leases under faults: a stream longer than several leases stays counted while its gateway
heartbeats; a gateway killed with SIGKILL mid-stream has its reservations charged at worst case
once its heartbeat is past the grace, and nothing is left behind."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

import capcheck
from ledger.models import GatewayInstance, Reservation, SliceClaim, UsageRecord, Window
from tests.faults.conftest import (
    Renewer,
    database_url,
    fire_in_background,
    gateway_process,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def short_leases(settings):
    """Leases of 2 s, heartbeats every 0.5 s, presumed dead 3 s after the last one (a busy test
    machine can delay a heartbeat by a second or two). Requested before `gateway`, so the
    server's heartbeat loop starts with these."""
    settings.CAPGATE = {
        **settings.CAPGATE,
        "LEASE": timedelta(seconds=2),
        "HEARTBEAT_INTERVAL": timedelta(seconds=0.5),
        "HEARTBEAT_GRACE": timedelta(seconds=3),
    }
    return settings.CAPGATE


def test_a_stream_longer_than_four_leases_stays_counted_and_settles_at_its_true_cost(short_leases, gateway):
    # given: a stream of 16 chunks 0.5 s apart (8 s, four 2 s leases) and beat renewing
    plan = capcheck.Plan(url=gateway.url, chunk_delay_ms=500, chunks=16, delay_ms=0)
    setup = capcheck.create_run(plan=plan, scenario="stream", concurrency=1)
    sent = [capcheck.Sent(index=0, key="A", mode="stream")]
    renewer = Renewer().start()
    try:
        load = fire_in_background(setup, plan, sent)
        reservation = wait_until(
            lambda: Reservation.objects.filter(organization=setup.organization).first(),
            timeout=10,
            what="the stream's admission",
        )
        window = Window.objects.get(budget__organization=setup.organization)
        leases = {reservation.expires_at}
        # when: the stream outlives its first lease several times over
        while load.is_alive():
            live = Reservation.objects.filter(pk=reservation.pk).first()
            rec = UsageRecord.objects.filter(request_id=reservation.request_id).first()
            if live is None or rec is not None:
                # the stream has ended (its true usage is recorded) — unless it was expired
                assert rec is None or rec.status == "served", "charged at worst case before the stream ended"
                break
            # then: while it runs, it is held at its worst case
            window.refresh_from_db()
            assert window.reserved_nano == reservation.amount_nano
            leases.add(live.expires_at)
            time.sleep(0.2)
        load.join(timeout=30)
    finally:
        renewer.stop()
    assert not renewer.errors, renewer.errors
    elapsed_leases = (max(leases) - reservation.created_at) / short_leases["LEASE"]
    assert elapsed_leases >= 3, f"only {len(leases)} renewals seen"
    assert renewer.expired == 0 and renewer.renewed >= 10
    # and it settles with its true usage, not the worst case
    assert sent[0].status == 200 and not sent[0].error
    wait_until(
        lambda: not Reservation.objects.exists() and not UsageRecord.objects.filter(applied=False).exists(),
        timeout=10,
        what="the drain",
    )
    rec = UsageRecord.objects.get(request_id=reservation.request_id)
    assert (rec.status, rec.cost_nano) == ("served", setup.tokens.actual_nano)
    window.refresh_from_db()
    assert (window.spent_nano, window.reserved_nano) == (setup.tokens.actual_nano, 0)


def test_kill_9_mid_stream_charges_its_reservations_at_worst_case_within_the_grace(settings, tmp_path):
    # given: a gateway process with 2 s leases, heartbeating every second, presumed dead 3 s
    # after its last heartbeat; beat (here: this test) renewing with the same settings
    settings.CAPGATE = {**settings.CAPGATE, "LEASE": timedelta(seconds=2), "HEARTBEAT_GRACE": timedelta(seconds=3)}
    env = {"CAPGATE_LEASE_SECONDS": "2", "CAPGATE_HEARTBEAT_SECONDS": "1", "CAPGATE_HEARTBEAT_GRACE_SECONDS": "3"}
    with gateway_process(database=database_url(), data_dir=tmp_path / "gw", env=env) as gw:
        plan = capcheck.Plan(url=gw.url, delay_ms=0, chunk_delay_ms=1000, chunks=30)  # 30 s streams
        setup = capcheck.create_run(plan=plan, scenario="stream", concurrency=6)
        sent = [capcheck.Sent(index=i, key="A", mode="stream") for i in range(6)]
        renewer = Renewer().start()
        try:
            load = fire_in_background(setup, plan, sent)
            wait_until(
                lambda: Reservation.objects.filter(organization=setup.organization).count() == 6,
                timeout=15,
                what="six streams admitted",
            )
            held = {r.request_id: r.amount_nano for r in Reservation.objects.filter(organization=setup.organization)}
            time.sleep(2.5)  # mid-stream, past a lease: they are being renewed
            assert Reservation.objects.filter(organization=setup.organization).count() == 6
            assert renewer.renewed > 0 and renewer.expired == 0
            # when: the process is killed without a chance to record anything
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait(10)
            killed_at = time.monotonic()
            load.join(timeout=30)
            # then: within heartbeat grace + a lease (+ beat's interval), every one is charged
            wait_until(
                lambda: (
                    not Reservation.objects.filter(organization=setup.organization).exists()
                    and not UsageRecord.objects.filter(organization=setup.organization, applied=False).exists()
                ),
                timeout=15,
                what="the dead process's reservations to be expired",
            )
            settled_after = time.monotonic() - killed_at
        finally:
            renewer.stop()
    assert not renewer.errors, renewer.errors
    # last heartbeat (<= 1 s before the kill) + grace 3 s + a lease renewed up to then 2 s, + slack
    assert settled_after < 1 + 3 + 2 + 3, f"settled {settled_after:.1f}s after the kill"
    assert all(s.status == 200 and s.error for s in sent), "every stream was cut by the kill"
    records = {r.request_id: r for r in UsageRecord.objects.filter(organization=setup.organization)}
    assert set(records) == set(held)
    assert {(r.status, r.cost_nano) for r in records.values()} == {("estimated", setup.tokens.worst_nano)}
    window = Window.objects.get(budget__organization=setup.organization)
    assert (window.spent_nano, window.reserved_nano) == (6 * setup.tokens.worst_nano, 0)
    assert GatewayInstance.objects.filter(stopped_at__isnull=True).count() == 1  # the dead one, never stopped
    report = capcheck.check_organization(organization_id=setup.organization.id, sent=sent)
    assert report.ok, report.problems


def test_kill_9_with_headroom_slices_charges_only_the_calls_in_flight_and_leaves_nothing(settings, tmp_path):
    # given: the same crash with headroom slices on: six streams, the first admitted alone (its
    # key's room unknown), the other five from one slice
    settings.CAPGATE = {**settings.CAPGATE, "LEASE": timedelta(seconds=2), "HEARTBEAT_GRACE": timedelta(seconds=3)}
    env = {
        "CAPGATE_LEASE_SECONDS": "2",
        "CAPGATE_HEARTBEAT_SECONDS": "1",
        "CAPGATE_HEARTBEAT_GRACE_SECONDS": "3",
        "CAPGATE_SLICES": "true",
        "CAPGATE_SLICE_SECONDS": "60",
    }
    with gateway_process(database=database_url(), data_dir=tmp_path / "gw", env=env) as gw:
        plan = capcheck.Plan(url=gw.url, delay_ms=0, chunk_delay_ms=1000, chunks=30)  # 30 s streams
        setup = capcheck.create_run(plan=plan, scenario="stream", concurrency=6)
        sent = [capcheck.Sent(index=i, key="A", mode="stream") for i in range(6)]
        renewer = Renewer().start()
        try:
            load = fire_in_background(setup, plan, sent)
            mine = Reservation.objects.filter(organization=setup.organization)
            wait_until(
                lambda: mine.filter(origin="slice").exists() and mine.count() == 2,
                timeout=15,
                what="one request admitted alone and a slice",
            )
            time.sleep(2.5)  # the streams run on, past a lease: the slice is renewed
            slice_row = mine.get(origin="slice")
            assert renewer.expired == 0
            # when: the process is killed before any stream finished
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait(10)
            load.join(timeout=30)
            wait_until(
                lambda: (
                    not mine.exists()
                    and not UsageRecord.objects.filter(organization=setup.organization, applied=False).exists()
                ),
                timeout=15,
                what="the dead process's reservations and slice to be expired",
            )
        finally:
            renewer.stop()
    assert not renewer.errors, renewer.errors
    assert all(s.status == 200 and s.error for s in sent), "every stream was cut by the kill"
    worst = setup.tokens.worst_nano
    records = list(UsageRecord.objects.filter(organization=setup.organization))
    # then: each of the six streams in flight is charged its worst case under its own id (the
    # five from the slice by their claims); the slice's unused room went back, nothing else charged
    assert slice_row.amount_nano > 5 * worst  # the slice held unused room when the process died
    assert not [r for r in records if r.request_id.startswith("slice-")]
    assert len(records) == 6 and {(r.status, r.cost_nano) for r in records} == {("estimated", worst)}
    window = Window.objects.get(budget__organization=setup.organization)
    assert (window.spent_nano, window.reserved_nano) == (6 * worst, 0)
    # and the room the slice did not use admits requests again (under the whole-slice charge, the
    # slice's unused part stayed spent)
    assert window.budget.amount_nano - window.spent_nano >= slice_row.amount_nano - 5 * worst + worst
    assert not SliceClaim.objects.exists()
    report = capcheck.check_organization(organization_id=setup.organization.id, sent=sent)
    assert report.ok, report.problems
