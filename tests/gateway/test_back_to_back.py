"""A finished call's hold is gone before its client can send the next call: a run's next call,
sent the moment the previous response ended, is never refused while the true remaining (the run's
budget less its recorded spend and the holds of calls still in flight) covers its worst case.

Each case sizes the run's budget between the two: room for the second call once the first
call's cost replaces its hold, none while its hold is still counted. The background drain is
slowed to a second, so only a hold still counted at admission could refuse the second call."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from core.money import format_usd, format_usd_brief
from ledger import admission
from ledger.models import Budget, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "word " * 2000  # a worst case well above what the fake upstream bills (10 + 5 tokens)
CASES = {
    "chat": (
        "/v1/chat/completions",
        {"model": "gpt-test", "max_tokens": 1000, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "chat-stream": (
        "/v1/chat/completions",
        {"model": "gpt-test", "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "messages": (
        "/v1/messages",
        {"model": "claude-test", "max_tokens": 1000, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "messages-stream": (
        "/v1/messages",
        {"model": "claude-test", "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "responses": ("/v1/responses", {"model": "gpt-test", "max_output_tokens": 1000, "input": PROMPT}),
    "responses-stream": (
        "/v1/responses",
        {"model": "gpt-test", "max_output_tokens": 1000, "stream": True, "input": PROMPT},
    ),
    "embeddings": ("/v1/embeddings", {"model": "gpt-test", "input": PROMPT}),
}
PAIRS = 4


@pytest.fixture
def slow_drain(gateway, settings):
    """The gateway's own drain runs a second after each response, not ~50 ms: a hold that only
    the drain takes out would still be counted when the next call arrives."""
    from gateway.upstream import runtime

    assert runtime.background is not None
    runtime.background.drain_interval = 1.0
    return gateway


def _call(client: httpx.Client, url: str, body: dict, run: str, budget: Decimal | None) -> httpx.Response:
    headers = {**AUTH, "X-Capgate-Run": run}
    if budget is not None:
        headers["X-Capgate-Run-Budget-Usd"] = str(budget)
    resp = client.post(url, json=body, headers=headers)
    resp.read()  # the whole body, a stream's to its end
    return resp


def _probe(client: httpx.Client, url: str, body: dict) -> tuple[int, int]:
    """One call's worst case and cost (nano-USD), from its record."""
    assert _call(client, url, body, "probe", Decimal("100")).status_code == 200
    rec = UsageRecord.objects.get(run_id="probe")
    return rec.reserved_nano, rec.cost_nano


def back_to_back(gateway, case: str) -> list[int]:
    """PAIRS runs of two calls each, the second sent as the first's response ends; the statuses
    of the second calls."""
    path, body = CASES[case]
    url = gateway.url + path
    statuses = []
    with httpx.Client(timeout=30) as client:
        worst, cost = _probe(client, url, body)
        assert cost < worst
        # The second call fits once the first one's cost replaces its hold, not before.
        budget = Decimal(worst + cost + (worst - cost) // 2) / 10**9
        for i in range(PAIRS):
            run = f"run-{case}-{i}"
            assert _call(client, url, body, run, budget).status_code == 200
            second = _call(client, url, body, run, budget)
            statuses.append(second.status_code)
            if second.status_code == 402:
                assert second.headers["x-capgate-budget-code"] == "run_budget"
    return statuses


@pytest.mark.parametrize("case", list(CASES))
def test_the_next_call_sent_at_once_is_served_while_the_true_remaining_covers_it(slow_drain, wired, slices_mode, case):
    assert back_to_back(slow_drain, case) == [200] * PAIRS
    wait_settled()
    for budget in Budget.objects.filter(scope="run").exclude(run_id="probe"):
        spent = sum(UsageRecord.objects.filter(run_id=budget.run_id).values_list("cost_nano", flat=True))
        assert spent <= budget.amount_nano


@pytest.mark.parametrize("case", ["chat", "messages-stream"])
def test_without_settling_finished_calls_the_next_call_is_refused(slow_drain, wired, slices_mode, monkeypatch, case):
    """Guard removal: with the admission counting a finished call's hold until the drain
    applies its record, the second call is refused for room that is free."""
    monkeypatch.setattr(admission.GUARDS, "settle_finished", False)
    assert back_to_back(slow_drain, case) == [402] * PAIRS


def test_a_third_call_that_does_not_fit_is_still_refused(slow_drain, wired, slices_mode):
    """Settling finished calls frees only their holds: a call the recorded spend leaves no room
    for is refused, and the refusal states the true remaining in dollars."""
    path, body = CASES["chat"]
    url = slow_drain.url + path
    with httpx.Client(timeout=30) as client:
        worst, cost = _probe(client, url, body)
        budget = Decimal(worst + cost + cost // 2) / 10**9  # room for two calls' costs and one worst case
        for _ in range(2):
            assert _call(client, url, body, "run-3", budget).status_code == 200
        refused = _call(client, url, body, "run-3", budget)
    assert refused.status_code == 402
    remaining = int(budget * 10**9) - 2 * cost
    assert Decimal(refused.headers["x-capgate-budget-remaining-usd"]) * 10**9 == remaining
    assert Decimal(refused.headers["x-capgate-budget-worst-case-usd"]) * 10**9 == worst
    assert refused.json()["error"]["message"] == (
        f"Refused by run budget: the request's worst case {format_usd_brief(worst, up=True)} exceeds the "
        f"{format_usd_brief(remaining)} remaining of {format_usd(int(budget * 10**9))}."
    )


def _output_ceilings(gateway, upstream, *, settle_between: bool) -> list[int | None]:
    """The output ceiling the gateway sent upstream for each of a run's two calls without
    max_tokens (None: refused), the second sent as the first's response ends (or once it was
    drained). The run's $0.20 affords fewer output tokens than the catalog's 4,096 at $75 per 1M,
    and the first call holds all it affords."""
    url = gateway.url + "/v1/chat/completions"
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    run = f"sized-{settle_between}"
    sent: list[int | None] = []
    with httpx.Client(timeout=30) as client:
        for i in range(2):
            resp = _call(client, url, body, run, Decimal("0.2"))
            forwarded = upstream.last("/v1/chat/completions")["body"]
            sent.append(
                forwarded.get("max_completion_tokens") or forwarded["max_tokens"] if resp.status_code == 200 else None
            )
            if settle_between and i == 0:
                wait_settled()
    return sent


def test_a_finished_calls_hold_does_not_shrink_the_next_calls_output_ceiling(slow_drain, wired, upstream, slices_mode):
    at_once = _output_ceilings(slow_drain, upstream, settle_between=False)
    drained = _output_ceilings(slow_drain, upstream, settle_between=True)
    assert at_once == drained
    assert at_once[1] is not None and at_once[1] < 4096


def test_without_settling_a_finished_calls_hold_refuses_the_next_call_its_output(
    slow_drain, wired, upstream, slices_mode, monkeypatch
):
    monkeypatch.setattr(admission.GUARDS, "settle_finished", False)
    at_once = _output_ceilings(slow_drain, upstream, settle_between=False)
    drained = _output_ceilings(slow_drain, upstream, settle_between=True)
    assert at_once[1] is None and drained[1] is not None
