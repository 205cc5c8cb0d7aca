"""A burst on a blocking cap worth 100 calls billed by o200k_base: with the prompt counted exactly
on every governed request whose tokenizer is known, the burst spends at least 95 % of the cap
and never more than it; with the rule that counted only past a share of the tightest room, the
first requests of the burst hold byte-bound reservations and the burst ends with less spent.
Slices on and off; real threads released by a barrier, read from the database."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
from django.db import connection

from catalog.models import Model, Provider
from ledger.models import Budget, UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream import chatml

CALLS = 100  # the cap is worth exactly this many true calls
N = 150  # requests released together
PRICE_IN, PRICE_OUT = 2_500, 10_000  # nano-USD per token: gpt-4o's $2.50 and $10 per 1M
MAX_TOKENS = 100  # billed in full, so a reservation fitted to the prompt is exactly a true call
# English prose: o200k_base bills about one token per 5 bytes, so a byte-bound call holds the
# room of ~2.3 true calls, and its worst case is under 5 % of the cap until half of it is used.
TEXT = (
    "Every reservation covers the worst case the provider may bill for the prompt and the reply. "
    "When the response arrives, the actual cost replaces the reservation and the rest returns. "
    "Bursts are the hard case: many calls arrive at once and each must see the others' holds. "
) * 3
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": TEXT}], "max_tokens": MAX_TOKENS}
TRUE_PROMPT = chatml.prompt_tokens(BODY, "o200k_base")
TRUE_NANO = TRUE_PROMPT * PRICE_IN + MAX_TOKENS * PRICE_OUT
CAP_NANO = CALLS * TRUE_NANO


@pytest.fixture
def capped(wired):
    """gpt-test on a model with o200k_base; the fake upstream bills prompts as OpenAI counts them
    and every reply at its max_tokens, so a fitted reservation is exactly a true call."""
    model = Model.objects.create(
        provider=Provider.objects.create(slug="openai", name="OpenAI"),
        name="gpt-counted",
        input_usd_per_mtok=Decimal(PRICE_IN) / 1000,
        output_usd_per_mtok=Decimal(PRICE_OUT) / 1000,
        max_output_tokens=4096,
        tokenizer="o200k_base",
    )
    wired.route("gpt-test", wired.openai, model=model)
    return Budget.objects.create(
        organization=wired.org, scope="organization", mode="block", period="month", amount_nano=CAP_NANO
    )


def _burst(gateway) -> list[httpx.Response]:
    barrier = threading.Barrier(N)
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-Upstream-count_prompt": "o200k_base",
        "X-Upstream-completion_tokens": "max",
        # Every admitted call is still in flight when the last request is sized, even one that waited
        # for a slice to be recalled (ledger/slices.py: a burst of 150 is admitted within ~15 s).
        "X-Upstream-delay_ms": "20000",
    }

    def call(_: int) -> httpx.Response:
        barrier.wait()
        try:
            return httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=60)
        finally:
            connection.close()

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(call, range(N)))


def _spent_share(gateway, budget: Budget) -> float:
    """The burst's recorded spend as a share of the cap, after checking it is within the cap and
    that every request was served and recorded or refused before the provider call."""
    responses = _burst(gateway)
    wait_settled(timeout=30)
    assert {r.status_code for r in responses} <= {200, 402}, {r.status_code for r in responses}
    records = list(UsageRecord.objects.filter(status="served"))
    assert len(records) == sum(r.status_code == 200 for r in responses)
    assert all(r.input_tokens == TRUE_PROMPT for r in records)
    window = window_of(budget)
    assert window.reserved_nano == 0
    assert window.spent_nano == sum(r.cost_nano for r in records)
    assert window.spent_nano <= CAP_NANO, "overshoot"
    return window.spent_nano / CAP_NANO


def test_a_byte_bound_holds_several_true_calls():
    # the premise: a byte-bound reservation holds the room of two true calls or more, and until
    # half the cap is used its worst case is under the old rule's 5 % of the room
    from gateway.admission.bounds import shape_chat

    byte_worst = shape_chat(BODY).text_tokens * PRICE_IN + MAX_TOKENS * PRICE_OUT
    assert byte_worst >= 2 * TRUE_NANO
    assert byte_worst <= 0.05 * CAP_NANO / 2


def test_burst_spends_the_cap_with_exact_counts(gateway, capped, slices_mode):
    # when 150 calls arrive together on a cap worth 100
    share = _spent_share(gateway, capped)
    # then every admitted call reserved its exact prompt, and the cap is spent, never passed
    assert share >= 0.95, f"{share:.1%} of the cap spent"
    assert set(UsageRecord.objects.values_list("input_bound", flat=True)) == {"exact"}


def test_guard_removal_counting_only_past_a_share_of_the_room_leaves_the_cap_unspent(
    gateway, capped, slices_mode, settings
):
    # given the old rule: count only when the byte bound takes more than 5 % of the tightest room
    settings.CAPGATE = {**settings.CAPGATE, "EXACT_COUNT_MAX_BYTES": 0, "EXACT_COUNT_SHARE": 0.05}
    # when the same burst arrives
    share = _spent_share(gateway, capped)
    # then byte-bound reservations held room that true calls could have used
    assert share < 0.95, f"{share:.1%} of the cap spent"
    assert "bytes" in set(UsageRecord.objects.values_list("input_bound", flat=True))
