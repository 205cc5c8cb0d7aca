"""Back-to-back calls of one run, each sent the moment the previous response ended (0 ms gap), are
served for as long as the true remaining (the run's budget less its recorded spend; no call of the
run is in flight) covers the next call's worst case, with headroom slices on and off: a finished
call's unused room (its worst case less its cost) serves the next call of the same process at once.

The calls are small (a worst case about twice their cost) and the budget a dozen worst cases, so
slices form (ledger/slices.py) and run out while the run still has room. The background drain is
slowed to a second, so only what the admission itself settles counts."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from ledger.models import Budget, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "hi"}]
CASES = {
    "chat": ("/v1/chat/completions", {"model": "gpt-test", "max_tokens": 16, "messages": MSG}),
    "chat-stream": ("/v1/chat/completions", {"model": "gpt-test", "max_tokens": 16, "stream": True, "messages": MSG}),
    "messages": ("/v1/messages", {"model": "claude-test", "max_tokens": 16, "messages": MSG}),
    "messages-stream": ("/v1/messages", {"model": "claude-test", "max_tokens": 16, "stream": True, "messages": MSG}),
    "responses": ("/v1/responses", {"model": "gpt-test", "max_output_tokens": 16, "input": "hi"}),
    "responses-stream": (
        "/v1/responses",
        {"model": "gpt-test", "max_output_tokens": 16, "stream": True, "input": "hi"},
    ),
}
WORST_CASES = 12  # the run's budget, in worst cases
MAX_CALLS = 80


@pytest.fixture
def slow_drain(gateway):
    from gateway.upstream import runtime

    assert runtime.background is not None
    runtime.background.drain_interval = 1.0
    return gateway


def _call(client: httpx.Client, url: str, body: dict, run: str, budget: Decimal) -> httpx.Response:
    headers = {**AUTH, "X-Capgate-Run": run, "X-Capgate-Run-Budget-Usd": str(budget)}
    resp = client.post(url, json=body, headers=headers)
    resp.read()
    return resp


def _spent(run: str) -> int:
    return sum(UsageRecord.objects.filter(run_id=run).values_list("cost_nano", flat=True))


def run_until_refused(gateway, case: str) -> list[tuple[int, int, int]]:
    """(status, true remaining before the call, worst case) of each call of one run, sent back to
    back until the first refusal."""
    path, body = CASES[case]
    url = gateway.url + path
    with httpx.Client(timeout=30) as client:
        assert _call(client, url, body, "probe", Decimal("100")).status_code == 200
        worst = UsageRecord.objects.get(run_id="probe").reserved_nano
        limit = WORST_CASES * worst
        budget = Decimal(limit) / 10**9
        calls = []
        for _ in range(MAX_CALLS):
            remaining = limit - _spent(f"b2b-{case}")  # every earlier call has finished: none in flight
            status = _call(client, url, body, f"b2b-{case}", budget).status_code
            calls.append((status, remaining, worst))
            if status != 200:
                break
    return calls


@pytest.mark.parametrize("case", list(CASES))
def test_back_to_back_calls_are_served_while_the_true_remaining_covers_them(slow_drain, wired, slices_mode, case):
    calls = run_until_refused(slow_drain, case)
    refused = [(i, remaining, worst) for i, (status, remaining, worst) in enumerate(calls) if status != 200]
    falsely = [(i, remaining, worst) for i, remaining, worst in refused if remaining >= worst]
    assert not falsely, (falsely, len(calls))
    assert refused and calls[-1][0] == 402, calls  # the run did reach its cap
    assert all(remaining >= worst for status, remaining, worst in calls if status == 200)
    wait_settled()
    budget = Budget.objects.get(run_id=f"b2b-{case}")
    assert _spent(f"b2b-{case}") <= budget.amount_nano
