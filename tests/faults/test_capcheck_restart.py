"""`manage.py capcheck --restart-db-cluster DIR`: PostgreSQL restarted mid-burst against a real
gateway process, on a private cluster; the four properties hold, admission is back within a
second, no live process's slice is charged. Without the flag the scenario never runs."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.faults.conftest import Renewer, gateway_process
from tests.faults.restarts import beat_settings, gateway_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_db_restart_is_refused_without_the_flag_naming_the_cluster(db):
    with pytest.raises(CommandError, match="--restart-db-cluster"):
        call_command("capcheck", "--url", "http://127.0.0.1:9", "--scenario", "db-restart", stdout=StringIO())
    with pytest.raises(CommandError, match="not a scripts/pg-cluster.sh cluster"):
        call_command("capcheck", "--url", "http://127.0.0.1:9", "--restart-db-cluster", "/nonexistent")


@pytest.mark.parametrize("slices", [True, False], ids=["slices", "no-slices"])
def test_capcheck_restarts_the_database_mid_burst_and_the_four_properties_hold(
    private_postgres, settings, tmp_path, slices
):
    pg = private_postgres
    beat_settings(settings)
    env = gateway_env(slices=slices)
    with gateway_process(database=pg.url, data_dir=tmp_path / "gw", env=env) as gw, pg.as_default():
        renewer = Renewer().start()
        out = StringIO()
        try:
            # when: 10 requests at once, 2 s at echo; the database down for 4 s while they are
            # in flight; then 10 more, one every 0.2 s
            call_command(
                "capcheck",
                "--url",
                gw.url,
                "--restart-db-cluster",
                str(pg.dir),
                "--restart-seconds",
                "4",
                "--concurrency",
                "20",
                "--delay-ms",
                "2000",
                "--settle-timeout",
                "60",
                "--json",
                stdout=out,
            )
        except CommandError as exc:
            raise AssertionError(f"{exc}\n{out.getvalue()}\n{gw.tail()}") from None
        finally:
            renewer.stop()
    (run,) = json.loads(out.getvalue())["runs"]
    print(json.dumps(run, indent=1))
    # then: the ones in flight were answered and recorded (spooled or kept in memory) once
    assert run["scenario"] == "db-restart" and run["served"] >= 15, run
    assert run["properties"] == {"1": True, "2": True, "3": True, "4": True}, run["problems"]
