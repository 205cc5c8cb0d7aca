"""`manage.py capcheck --kind`: the core scenarios hold the four properties through each kind's
adapter (Bedrock's SigV4 and event stream, Vertex's token and endpoints, an OpenAI-compatible
preset), against the fake provider billing what each run asks."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("kind", ["bedrock", "bedrock-converse", "vertex", "groq"])
def test_the_core_scenarios_hold_on_each_kind(gateway, upstream, monkeypatch, kind):
    # when: every core scenario (the default on a kind other than echo)
    out, error = capcheck(gateway, "--concurrency", "20", *kind_args(kind, upstream, monkeypatch))
    # then
    assert error is None, out
    assert "4 of 4 runs hold all four properties" in out
    assert not Reservation.objects.exists()
    # served through the kind's own path on the fake
    paths = upstream.stats()["by_path"]
    own = {"bedrock": "/v1/messages", "bedrock-converse": "/converse"}.get(kind, "/v1/chat/completions")
    assert paths.get(own, 0) > 0 and sum(paths.values()) == paths[own]
    assert UsageRecord.objects.filter(status="served").exists()


def test_a_kind_run_names_what_it_lacks(gateway):
    out, error = capcheck(gateway, "--kind", "bedrock")
    assert error is not None and "--upstream-url" in str(error)
    out, error = capcheck(gateway, "--kind", "groq", "--upstream-url", "http://127.0.0.1:1/v1", "--scenario", "jobs")
    assert error is not None and "only the core scenarios" in str(error)
