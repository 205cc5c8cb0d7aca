"""`manage.py capcheck --kind`: the core scenarios hold the four properties at 200 concurrent
through every kind's adapter (OpenAI, Anthropic, Azure's deployments and api-key, Bedrock's SigV4
and event stream, Vertex's token and endpoints, Gemini's OpenAI-compatible endpoint, an
OpenAI-compatible preset), against the fake provider billing what each run asks."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger.models import Reservation, UsageRecord
from tests.upstream.bedrock import ACCESS_KEY, SECRET_KEY
from tests.upstream.vertex import new_service_account

pytestmark = pytest.mark.django_db(transaction=True)


def kind_args(kind: str, upstream, monkeypatch) -> list[str]:
    """The --kind options that reach the fake provider as that kind."""
    secret, options, url = "", {}, upstream.url
    if kind in ("bedrock", "bedrock-converse"):
        secret = json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY})
        options = {"region": "us-east-1", **({"api": "converse"} if kind == "bedrock-converse" else {})}
        kind = "bedrock"
    elif kind == "vertex":
        secret = json.dumps(new_service_account(upstream.url + "/token"))
        options = {"project": "capgate-test", "region": "us-east5"}
    elif kind == "azure_openai":
        secret = "azure-fake-key"
        options = {"api_version": "2024-10-21"}
    elif kind == "gemini":
        url += "/v1beta/openai/"
        secret = "gemini-fake-key"
    elif kind == "anthropic":
        secret = "sk-ant-fake"
    else:
        url += "/v1"
        secret = "sk-fake"
    monkeypatch.setenv("CAPCHECK_CONNECTION_SECRET", secret)
    return [
        "--kind",
        kind,
        "--upstream-url",
        url,
        "--connection-secret-env",
        "CAPCHECK_CONNECTION_SECRET",
        "--connection-options",
        json.dumps(options),
    ]


def capcheck(gateway, *args: str) -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("capcheck", "--url", gateway.url, "--settle-timeout", "20", "--timeout", "30", *args, stdout=out)
    except CommandError as exc:
        print(out.getvalue())
        return out.getvalue(), exc
    print(out.getvalue())
    return out.getvalue(), None


# Every kind, one preset standing for the others (they differ only in catalog/presets.py's row).
KINDS = ("openai", "anthropic", "azure_openai", "bedrock", "bedrock-converse", "vertex", "gemini", "groq")
# What differs by kind, each run at the full 200 concurrent: a stream's usage on every kind; a
# plain answer's too where the kind has its own wire (Anthropic's, Bedrock's event stream and
# SigV4, Vertex's token: the others read OpenAI's usage, as echo's runs in test_capcheck.py do);
# the provider's own 500 (failed upstream, not billed) on the two kinds that sign or fetch a
# token per call. `multi` checks budget scopes, which no kind changes (test_capcheck.py runs it
# on echo). Twelve runs keep the test near a minute on a loaded 2-core machine.
SCENARIOS = (
    dict.fromkeys(KINDS, "stream")
    | {"anthropic": "basic,stream"}
    | dict.fromkeys(("bedrock", "vertex"), "basic,stream,failures")
)


def test_the_core_scenarios_hold_on_every_kind_at_200_concurrent(gateway, upstream, monkeypatch):
    # given: one live gateway for every kind (each run makes its own organization and connection)
    held, seconds = {}, {}
    for kind in KINDS:
        upstream.reset()
        started = time.monotonic()
        # when: each scenario's 200 requests at once, through a connection of this kind
        runs = SCENARIOS[kind]
        out, error = capcheck(
            gateway, "--concurrency", "200", "--scenario", runs, *kind_args(kind, upstream, monkeypatch)
        )
        seconds[kind] = round(time.monotonic() - started, 1)
        paths = upstream.stats()["by_path"]
        served_path = {"anthropic": "/v1/messages", "bedrock": "/v1/messages", "bedrock-converse": "/converse"}.get(
            kind, "/v1/chat/completions"
        )
        n = runs.count(",") + 1
        held[kind] = (
            error is None and f"{n} of {n} runs hold all four properties" in out,
            paths.get(served_path, 0) > 0,
        )
        if error is not None:
            print(kind, error)
    print("seconds per kind", seconds)

    # then: the four properties held on every kind, served through the kind's own path on the fake
    assert held == dict.fromkeys(KINDS, (True, True)), held
    assert not Reservation.objects.exists()
    assert UsageRecord.objects.filter(status="served").count() >= len(KINDS) * 2


def test_a_kind_run_names_what_it_lacks(gateway):
    out, error = capcheck(gateway, "--kind", "bedrock")
    assert error is not None and "--upstream-url" in str(error)
    out, error = capcheck(gateway, "--kind", "groq", "--upstream-url", "http://127.0.0.1:1/v1", "--scenario", "jobs")
    assert error is not None and "only the core scenarios" in str(error)
