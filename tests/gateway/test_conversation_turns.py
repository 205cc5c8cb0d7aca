"""Turns of one Responses `conversation` under a blocking budget: the provider bills a turn for
every item the conversation holds when the turn runs, including the items of turns that finished
after this one was bounded, so capgate runs one turn of a conversation at a time
(gateway/upstream/continuations.py)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from gateway.models import ConversationTurn, StoredResponse
from gateway.upstream import continuations
from ledger.models import GatewayInstance, UsageRecord
from tests.gateway.conftest import wait_settled
from tests.gateway.test_billing import AUTH, gpt, post  # noqa: F401  (fixtures)

PATH = "/v1/responses"
# The first turn runs at once; the others after it finished (as a provider that took them later).
DELAYS_MS = [400, 2500, 2500]


def _start_conversation(gateway, upstream) -> str:
    """A new conversation with a 3,050-token context, relayed by capgate before any cap exists."""
    conv = f"conv_{uuid.uuid4().hex}"
    upstream.control(prompt_tokens=3000, completion_tokens=50)
    first = post(
        gateway, {"model": "gpt-real", "input": "Read.", "max_output_tokens": 50, "conversation": conv}, path=PATH
    )
    assert first.status_code == 200, first.text
    wait_settled()
    UsageRecord.objects.all().delete()
    assert StoredResponse.objects.get(conversation_id=conv).context_tokens == 3050
    return conv


def _concurrent_turns(gateway, upstream, conv: str) -> list[httpx.Response]:
    """Three turns of the conversation sent at once (released by a barrier), each 2,000 output tokens."""
    upstream.control(prompt_tokens=20, completion_tokens="max")
    body = {"model": "gpt-real", "input": "And then?", "max_output_tokens": 2000, "conversation": {"id": conv}}
    barrier = threading.Barrier(len(DELAYS_MS))
    got: list[httpx.Response | None] = [None] * len(DELAYS_MS)

    def turn(i: int) -> None:
        barrier.wait()
        got[i] = httpx.post(
            gateway.url + PATH, json=body, headers={**AUTH, "X-Upstream-Delay-Ms": str(DELAYS_MS[i])}, timeout=30
        )

    threads = [threading.Thread(target=turn, args=(i,)) for i in range(len(DELAYS_MS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    wait_settled()
    assert all(r is not None for r in got)
    return [r for r in got if r is not None]


def _under_reserved() -> list[tuple[int, int]]:
    """(reserved, billed) of every record billed above what it reserved."""
    return [(r.reserved_nano, r.cost_nano) for r in UsageRecord.objects.all() if r.cost_nano > r.reserved_nano]


def test_concurrent_turns_of_a_conversation_run_one_at_a_time_within_their_bound(
    gateway,
    wired,
    upstream,
    gpt,  # noqa: F811
    slices_mode,
):
    # given: a conversation capgate relayed, and a blocking cap with room for every turn
    conv = _start_conversation(gateway, upstream)
    wired.budget(amount="5")
    # when: three turns are sent at once
    got = _concurrent_turns(gateway, upstream, conv)
    # then: one runs; the others are told the conversation is busy, before anything is reserved
    assert sorted(r.status_code for r in got) == [200, 409, 409]
    locked = [r.json()["error"] for r in got if r.status_code == 409]
    assert {(e["code"], e["param"]) for e in locked} == {("conversation_locked", "conversation")}
    rec = UsageRecord.objects.get()
    assert rec.status == "served" and rec.cost_nano <= rec.reserved_nano
    assert not ConversationTurn.objects.exists()
    # and the next turn, sent once it ended, is bounded by the context that turn left
    resp = post(
        gateway, {"model": "gpt-real", "input": "More.", "max_output_tokens": 2000, "conversation": conv}, path=PATH
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["input_tokens"] == 3050 + 20 + 2000 + 20
    wait_settled()
    assert _under_reserved() == []


def test_without_one_turn_at_a_time_a_turn_bills_past_its_reservation(
    gateway,
    wired,
    upstream,
    gpt,  # noqa: F811
    slices_mode,
    monkeypatch,
):
    monkeypatch.setattr(continuations.GUARDS, "one_turn_per_conversation", False)
    conv = _start_conversation(gateway, upstream)
    wired.budget(amount="5")
    got = _concurrent_turns(gateway, upstream, conv)
    assert [r.status_code for r in got] == [200, 200, 200]
    # the later turns read the first turn's 2,020 tokens that their bound did not hold
    assert len(_under_reserved()) == 2


def test_a_turn_that_ends_without_its_response_leaves_its_bound_as_the_context(
    gateway,
    wired,
    upstream,
    gpt,  # noqa: F811
):
    conv = _start_conversation(gateway, upstream)
    wired.budget(amount="5")
    # a turn whose outcome capgate never learns (the provider hangs up mid-answer)
    upstream.control(prompt_tokens=20, completion_tokens="max", fail="drop_mid_stream")
    body = {"model": "gpt-real", "input": "And then?", "max_output_tokens": 2000, "conversation": conv}
    assert post(gateway, body, path=PATH).status_code >= 500
    wait_settled()
    latest = StoredResponse.objects.filter(conversation_id=conv).order_by("-id").first()
    assert latest is not None and latest.connection_id is None and latest.context_tokens >= 3050 + 2000
    assert not ConversationTurn.objects.exists()


@pytest.mark.parametrize("state", ["expired", "owner_stopped"])
def test_a_dead_turns_hold_is_taken_over_and_its_bound_kept(gateway, wired, upstream, gpt, state):  # noqa: F811
    conv = _start_conversation(gateway, upstream)
    wired.budget(amount="5")
    now = timezone.now()
    owner = GatewayInstance.objects.create(
        name="gone", heartbeat_at=now, stopped_at=now if state == "owner_stopped" else None
    )
    ConversationTurn.objects.create(
        organization=wired.org,
        conversation_id=conv,
        request_id="req_dead",
        owner=owner,
        bound_tokens=9000,
        expires_at=now - timedelta(seconds=1) if state == "expired" else now + timedelta(hours=1),
    )
    upstream.control(prompt_tokens=20, completion_tokens=10)
    resp = post(gateway, {"model": "gpt-real", "input": "x", "max_output_tokens": 10, "conversation": conv}, path=PATH)
    assert resp.status_code == 200, resp.text
    assert int(resp.headers["x-capgate-reserved-input-tokens"]) >= 9000  # the dead turn's bound
    assert StoredResponse.objects.filter(response_id="req_dead", context_tokens=9000).exists()


def test_a_background_turn_of_a_conversation_is_refused_under_a_cap_only(gateway, wired, upstream, gpt):  # noqa: F811
    conv = _start_conversation(gateway, upstream)
    body = {"model": "gpt-real", "input": "x", "max_output_tokens": 10, "conversation": conv, "background": True}
    block = wired.budget(amount="5")
    sent = upstream.stats()["requests"]
    resp = post(gateway, body, path=PATH)
    assert resp.status_code == 402, resp.text
    assert (resp.json()["error"]["code"], resp.json()["error"]["param"]) == (
        "background_conversation_under_budget",
        "conversation",
    )
    assert upstream.stats()["requests"] == sent  # nothing reached the provider
    wait_settled()
    assert UsageRecord.objects.get().status == "failed_upstream"
    assert not ConversationTurn.objects.exists()
    # without a blocking budget the provider's job runs as it would without capgate
    block.delete()
    assert post(gateway, body, path=PATH).status_code == 200
