"""`manage.py capcheck` against a live server: every scenario passes, and with the admission
lock removed the basic run fails (the guard-removal test)."""

from __future__ import annotations

import json
import os
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger import admission
from ledger.models import Reservation, UsageRecord, Window
from tenants.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
SMALL = "30"


def capcheck(gateway, *args: str) -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("capcheck", "--url", gateway.url, "--settle-timeout", "20", "--timeout", "30", *args, stdout=out)
    except CommandError as exc:
        print(out.getvalue())  # shown by pytest on failure, and with -s
        return out.getvalue(), exc
    print(out.getvalue())
    return out.getvalue(), None


@pytest.mark.parametrize("scenario", ["basic", "stream", "multi", "failures"])
def test_every_scenario_holds_the_four_properties(gateway, scenario):
    # when
    out, error = capcheck(gateway, "--scenario", scenario, "--concurrency", SMALL)
    # then: exit 0, and the table says why
    assert error is None, out
    assert f"{scenario} · {SMALL} concurrent" in out
    assert "properties      1 ok  2 ok  3 ok  4 ok  -> PASS" in out
    assert "1 of 1 runs hold all four properties" in out
    assert not Reservation.objects.exists()
    assert not UsageRecord.objects.filter(applied=False).exists()
    # the run's keys no longer work; its rows stay as the record
    assert not ApiKey.objects.filter(revoked_at__isnull=True).exists()
    assert UsageRecord.objects.exists()


def test_json_report_counts_what_the_database_holds(gateway):
    out, error = capcheck(gateway, "--scenario", "basic,multi", "--concurrency", "20", "--json")
    assert error is None, out
    report = json.loads(out)
    assert report["ok"] is True
    basic, multi = report["runs"]
    # basic: 20 * $0.037 worst > $1, so some were refused; every served one has its row
    assert basic["served"] == basic["served_with_row"] == basic["records"]["served"]
    assert basic["served"] + sum(basic["refused"].values()) == 20
    assert set(basic["refused"]) <= {"organization_budget"}
    org = basic["ceilings"][0]
    assert org["label"] == "organization" and org["amount_nano"] == 1_000_000_000
    assert org["booked_nano"] == org["spent_nano"] == basic["served"] * basic["actual_nano"]
    assert org["peak_nano"] <= org["amount_nano"]
    # multi: three ceilings, each checked
    assert sorted(c["label"] for c in multi["ceilings"]) == ["key (day)", "organization", "project"]
    assert set(multi["refused"]) <= {"key_budget", "project_budget", "organization_budget"}


def test_refusals_name_each_stacked_ceiling(gateway):
    # given: key A's cap holds 2 worst cases, the project's (keys A and B) 13, the organization's
    # (A, B and C) 270; 60 requests at once, 20 per key, answered after 1.5 s
    out, error = capcheck(
        gateway,
        "--scenario",
        "multi",
        "--concurrency",
        "60",
        "--delay-ms",
        "1500",
        "--key-cap-usd",
        "0.08",
        "--cap-usd",
        "10",
        "--json",
    )
    assert error is None, out
    run = json.loads(out)["runs"][0]
    # then: key A's third request is refused by its key, B's by the project; C is never refused
    # (a slow machine may admit a few more once the first answers free room)
    assert set(run["refused"]) == {"key_budget", "project_budget"}
    assert run["served"] >= 2 + 11 + 20, run


@pytest.mark.parametrize("locked", [True, False], ids=["with-lock", "without-lock"])
def test_without_the_admission_lock_capcheck_fails(gateway, monkeypatch, locked):
    """The guard-removal test. Echo bills $0.036 of each $0.037005 worst case, so 27 fit in $1.
    Without the lock, ceilings are read unlocked and the gap between read and write widened:
    racing admissions all see the same room and the cap is passed, in holds and in spend.
    CAPCHECK_GUARD_CONCURRENCY=200 runs it at the issue's 200 concurrent."""
    if not locked:
        monkeypatch.setattr(admission, "LOCK_CLAUSE", "")
        monkeypatch.setattr(admission, "RACE_DELAY_SECONDS", 0.05)
    n = os.environ.get("CAPCHECK_GUARD_CONCURRENCY", "40")
    # when
    out, error = capcheck(
        gateway, "--scenario", "basic", "--concurrency", n, "--actual-usd", "0.036", "--delay-ms", "500", "--json"
    )
    run = json.loads(out)["runs"][0]
    org = run["ceilings"][0]
    assert Window.objects.get(id=org["window_id"]).reserved_nano == 0  # it settles either way
    if locked:
        assert error is None and run["ok"] is True
        assert org["booked_nano"] <= org["peak_nano"] <= org["amount_nano"]
        return
    # then: capcheck exits non-zero, and says property 1 failed: recorded + reserved went over
    # the cap, and so did recorded spend alone
    assert error is not None and "a property failed" in str(error)
    assert run["properties"] == {"1": False, "2": True, "3": True, "4": True}
    assert org["peak_nano"] > org["amount_nano"]
    assert org["booked_nano"] == org["spent_nano"] > org["amount_nano"]
    assert any(p.startswith("P1: organization") for p in run["problems"])


def test_a_run_that_reaches_nothing_is_not_a_proof():
    from tests.faults.conftest import free_port

    out = StringIO()
    with pytest.raises(CommandError, match="proved nothing"):
        call_command(
            "capcheck",
            "--url",
            f"http://127.0.0.1:{free_port()}",
            "--scenario",
            "basic",
            "--concurrency",
            "3",
            stdout=out,
        )
    assert "inconclusive: no request got a response (ConnectError 3)" in out.getvalue()


@pytest.mark.django_db
def test_requests_are_shaped_so_the_gateway_reserves_the_planned_worst_case():
    from capcheck import CapcheckError, Plan, Tokens
    from gateway.admission.bounds import shape_chat

    tokens = Tokens.for_plan(Plan(url=""))
    # $0.037 worst case: 497 input tokens at $15 + 394 output tokens at $75 per 1M
    assert (tokens.input_bound, tokens.max_tokens, tokens.worst_nano) == (497, 394, 37_005_000)
    # $0.012 billed: echo reports 400 prompt + 80 completion tokens
    assert (tokens.prompt, tokens.completion, tokens.actual_nano) == (400, 80, 12_000_000)
    for stream in (False, True):
        assert shape_chat(tokens.body("capcheck-echo", stream=stream)).text_tokens == 497
    with pytest.raises(CapcheckError):
        Tokens.for_plan(Plan(url="", worst_nano=1_000_000, actual_nano=2_000_000))
    with pytest.raises(CapcheckError, match="cannot cover"):
        Tokens.for_plan(Plan(url="", worst_nano=1_000_000, actual_nano=500_000)).body("m", stream=False)
