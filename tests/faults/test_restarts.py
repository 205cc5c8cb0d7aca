"""PostgreSQL restarts under traffic, on a private cluster (the shared one serves other runs):
nothing is charged twice, nothing is lost, live gateways stay alive, admission resumes at once.

Each run checks the fake provider's bill against the recorded spend, no served request without
its row, no slice charged while its process lives, no refusal for budget while real spend is
under the cap, and no 503 for a request sent more than a second after the database is back.
CAPGATE_TEST_RESTART_SECONDS (e.g. "2,6,20") picks the outages of the mid-burst run.
"""

from __future__ import annotations

import os
import time

import pytest

import capcheck
from ledger.models import GatewayInstance
from tests.faults.conftest import Renewer, gateway_process
from tests.faults.restarts import (
    Load,
    Outcome,
    beat_settings,
    bill_through_fake_provider,
    gateway_env,
    restart,
    settle_and_measure,
)

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGES = [float(s) for s in os.environ.get("CAPGATE_TEST_RESTART_SECONDS", "2,20").split(",")]
RATE = 4.0  # requests per second
CAP_NANO = 2_000_000_000  # $2: the run's real spend stays well under it


def _plan(url: str) -> capcheck.Plan:
    return capcheck.Plan(url=url, cap_nano=CAP_NANO, delay_ms=0)


def _check(o: Outcome, gw) -> None:
    print(o.summary())  # the numbers, for the record (pytest -s)
    try:
        _holds(o)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ngateway log:\n{gw.tail()}") from None


def _holds(o: Outcome) -> None:
    assert o.first_after is not None and o.first_after.status == 200, o.summary()
    assert not o.late_503, o.summary()
    assert set(o.statuses) <= {200, 503}, o.summary()  # never 402 under the cap, never 500
    assert o.bill_nano < CAP_NANO
    assert o.slices_charged == 0 and o.estimated == 0, o.summary()
    assert not o.unrecorded_served and o.left_behind == 0, o.summary()
    assert o.recorded_nano == o.spent_nano == o.bill_nano, o.summary()


@pytest.mark.parametrize("slices", [True, False], ids=["slices", "no-slices"])
@pytest.mark.parametrize("down", OUTAGES, ids=[f"{s:g}s" for s in OUTAGES])
def test_a_restart_mid_burst_charges_nothing_twice_and_admits_again_at_once(
    private_postgres, upstream, settings, tmp_path, slices, down
):
    # given: a gateway under steady traffic (4 per second, 300 ms at the provider), beat
    # renewing and expiring every 0.25 s with the gateway's 3 s grace
    pg = private_postgres
    beat_settings(settings)
    env = gateway_env(slices=slices)
    with gateway_process(database=pg.url, data_dir=tmp_path / "gw", env=env) as gw, pg.as_default():
        setup = capcheck.create_run(plan=_plan(gw.url), scenario="basic", concurrency=0)
        bill_through_fake_provider(setup, upstream, delay_ms=300)
        renewer = Renewer().start()
        load = Load(urls=[gw.url], setup=setup, rate=RATE)
        try:
            load.start()
            time.sleep(3)
            # when: PostgreSQL restarts mid-burst, down for `down` seconds
            recovered_at = restart(pg, down_seconds=down)
            time.sleep(6)  # traffic goes on after recovery
            shots = load.stop()
            outcome = settle_and_measure(setup=setup, upstream=upstream, shots=shots, recovered_at=recovered_at)
            registrations = GatewayInstance.objects.count()
        finally:
            load.stop()
            renewer.stop()
    # then: the one gateway process was never taken for dead (it never had to register again)
    _check(outcome, gw)
    assert registrations == 1, gw.tail()


@pytest.mark.parametrize("slices", [True, False], ids=["slices", "no-slices"])
def test_traffic_only_after_a_restart_is_admitted_at_once_and_charged_once(
    private_postgres, upstream, settings, tmp_path, slices
):
    # given: an idle gateway (its database threads hold connections) through a 6 s restart
    pg = private_postgres
    beat_settings(settings)
    env = gateway_env(slices=slices)
    with gateway_process(database=pg.url, data_dir=tmp_path / "gw", env=env) as gw, pg.as_default():
        setup = capcheck.create_run(plan=_plan(gw.url), scenario="basic", concurrency=0)
        bill_through_fake_provider(setup, upstream, delay_ms=300)
        renewer = Renewer().start()
        try:
            recovered_at = restart(pg, down_seconds=6)
            # when: traffic starts only once the database is back
            load = Load(urls=[gw.url], setup=setup, rate=RATE)
            load.start()
            time.sleep(6)
            shots = load.stop()
            outcome = settle_and_measure(setup=setup, upstream=upstream, shots=shots, recovered_at=recovered_at)
        finally:
            renewer.stop()
    # then: every request is admitted, the first one included
    _check(outcome, gw)
    assert outcome.statuses == {200: len(outcome.shots)}, outcome.summary()


@pytest.mark.parametrize("slices", [True, False], ids=["slices", "no-slices"])
def test_a_restart_with_the_spool_unwritable_answers_and_records_every_billed_call(
    private_postgres, upstream, settings, tmp_path, slices
):
    # given: a gateway whose spool cannot be written (a file where its directory should be),
    # and calls that take 2.5 s at the provider, so several finish while the database is down
    pg = private_postgres
    beat_settings(settings)
    data = tmp_path / "gw"
    data.mkdir()
    (data / "spool").write_text("not a directory")
    with gateway_process(database=pg.url, data_dir=data, env=gateway_env(slices=slices)) as gw, pg.as_default():
        setup = capcheck.create_run(plan=_plan(gw.url), scenario="basic", concurrency=0)
        bill_through_fake_provider(setup, upstream, delay_ms=2500)
        renewer = Renewer().start()
        load = Load(urls=[gw.url], setup=setup, rate=RATE)
        try:
            load.start()
            time.sleep(3)
            # when: PostgreSQL restarts, down for 6 s
            recovered_at = restart(pg, down_seconds=6)
            time.sleep(4)
            shots = load.stop()
            outcome = settle_and_measure(setup=setup, upstream=upstream, shots=shots, recovered_at=recovered_at)
        finally:
            load.stop()
            renewer.stop()
    # then: every call the provider billed was answered 200 and has its row, at its true cost
    _check(outcome, gw)
    assert outcome.statuses[200] == outcome.bill_nano // setup.tokens.actual_nano, outcome.summary()
    assert "kept in memory only" in gw.log.read_text(), "no record finished during the outage"
