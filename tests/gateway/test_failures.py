"""Every admitted request ends in exactly one usage record, whatever the upstream does."""

import asyncio
import json
import socket

import httpx
import pytest

from catalog.models import Connection
from ledger.models import Reservation, UsageRecord, Window
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


def post(gateway, body=CHAT, headers=None, path="/v1/chat/completions", **kw):
    return httpx.post(gateway.url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=30, **kw)


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: connecting is refused


def test_upstream_validation_error_releases_and_records_zero_cost(gateway, wired, upstream):
    budget = wired.budget(amount="1")
    r = post(gateway, headers={"x-upstream-fail": "400"})
    assert r.status_code == 400 and "error" in r.json()  # the provider's own message reaches the client
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("failed_upstream", 0)
    assert Window.objects.get(budget=budget).reserved_nano == 0


def test_failover_on_connect_refused_and_5xx_counts_once_at_the_billing_attempt(gateway, wired, upstream):
    dead = Connection.objects.create(
        organization=wired.org, name="dead", kind="openai", base_url=f"http://127.0.0.1:{_dead_port()}/v1"
    )
    flaky = Connection.objects.create(
        organization=wired.org,
        name="flaky",
        kind="openai",
        base_url=upstream.url,
        options={"forward_test_headers": True},
    )
    wired.route("gpt-test", dead, wired.openai)
    upstream.control(prompt_tokens=10, completion_tokens=10)
    assert post(gateway).status_code == 200
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id) == ("served", wired.openai.id)
    # a 5xx from the first upstream fails over too (the fake counts both calls)
    wired.route("gpt-test", flaky, wired.openai)
    upstream.reset()
    upstream.control(fail="503")
    r = post(gateway)
    assert r.status_code == 503  # both targets are the same failing upstream: the last error is relayed
    wait_settled()
    assert UsageRecord.objects.filter(status="failed_upstream").count() == 1
    assert upstream.stats()["requests"] == 2  # tried both targets, once each


def test_a_connection_failing_repeatedly_is_ejected_before_admission(gateway, wired, upstream):
    dead = Connection.objects.create(
        organization=wired.org, name="dead", kind="openai", base_url=f"http://127.0.0.1:{_dead_port()}/v1"
    )
    wired.route("gpt-test", dead)
    for _ in range(3):
        assert post(gateway).status_code == 502
    r = post(gateway)
    assert r.status_code == 503 and r.json()["error"]["code"] == "connection_unavailable"
    wait_settled()
    assert UsageRecord.objects.count() == 3  # the 4th was refused before admission: no record


def _stream_then_disconnect(url: str, body: dict, after_chunks: int = 1) -> list[bytes]:
    async def go():
        got = []
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", url, json=body, headers=AUTH) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        got.append(line)
                        if len(got) >= after_chunks:
                            break  # leaving the context closes the connection mid-stream
        return got

    return asyncio.run(go())


def test_client_disconnect_mid_stream_is_charged_at_worst_case(gateway, wired, upstream):
    budget = wired.budget(amount="1")
    upstream.control(chunks=50, chunk_delay_ms=50)
    _stream_then_disconnect(gateway.url + "/v1/chat/completions", {**CHAT, "stream": True})
    wait_settled(timeout=15)
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == rec.reserved_nano > 0
    assert "disconnect" in rec.error
    w = Window.objects.get(budget=budget)
    assert (w.spent_nano, w.reserved_nano) == (rec.reserved_nano, 0)
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("fault", ["no_usage", "drop_mid_stream"])
def test_stream_without_usage_is_charged_at_worst_case(gateway, wired, upstream, fault):
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={**AUTH, "x-upstream-fail": fault},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        list(resp.iter_lines())
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == rec.reserved_nano


def test_non_stream_timeout_after_sending_is_charged_not_forgiven(gateway, wired, upstream, settings):
    from gateway.upstream import transport as guarded

    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_READ_TIMEOUT": 0.5}
    guarded._clients.clear()  # the shared clients are rebuilt with the short timeout
    r = post(gateway, headers={"x-upstream-fail": "stall"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == rec.reserved_nano
    guarded._clients.clear()


def test_stream_is_ended_at_the_requests_hard_lifetime(gateway, wired, upstream, settings):
    from datetime import timedelta

    settings.CAPGATE = {**settings.CAPGATE, "MAX_REQUEST_LIFETIME": timedelta(seconds=1)}
    upstream.control(chunks=100, chunk_delay_ms=100)  # would take 10 s
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH, timeout=30
    ) as resp:
        lines = list(resp.iter_lines())
    assert 0 < len([x for x in lines if x.startswith("data:")]) < 100
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and "maximum lifetime" in rec.error


def test_anthropic_stream_usage_survives_a_client_leaving_after_message_delta(gateway, wired, upstream):
    upstream.control(prompt_tokens=7, completion_tokens=9)
    body = {"model": "claude-test", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream("POST", gateway.url + "/v1/messages", json=body, headers=AUTH, timeout=30) as resp:
        events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 7, 9)
