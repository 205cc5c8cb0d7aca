"""Hosted tools on the Responses API under a blocking cap: a `web_search` turn reserves what one
call that searches every allowed time can bill — (searches + 1) passes over the request, each
holding the results of the searches before it, plus the per-search price — and not a multiple
of it; the limit it relies on (`max_tool_calls`) is what the provider is sent. A model without
a search price, and the hosted tools the catalog cannot price, are refused before anything is
held, naming what is missing (README, "What a turn holds"). Slices on and off."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from gateway.admission import sizing
from ledger.models import UsageRecord
from tests.gateway.conftest import assert_nothing_held, wait_settled
from tests.gateway.test_billing import gpt, post  # noqa: F401  (fixtures)
from tests.gateway.test_responses import billed_response

PATH = "/v1/responses"
RESULT_TOKENS = 2_000  # the catalog's bound on what one search's results add to the context
BODY = {
    "model": "gpt-real",
    "input": "What changed in the release notes this week? " * 20,
    "max_output_tokens": 200,
    "tools": [{"type": "web_search"}],
}


@pytest.fixture
def searching(gpt, upstream, wired, slices_mode):  # noqa: F811
    gpt.web_search_usd_per_use = Decimal("0.01")
    gpt.server_tool_result_tokens = RESULT_TOKENS
    gpt.save()
    wired.budget(amount="5")
    return gpt


def test_a_web_search_turn_reserves_what_the_most_expensive_such_call_bills(gateway, searching, upstream):
    # given: the gateway's bound on the request's own input, learned from one call
    probe = post(gateway, BODY, path=PATH)
    assert probe.status_code == 200, probe.text
    per_pass = int(probe.headers["x-capgate-reserved-input-tokens"])
    allowed = upstream.last(PATH)["body"]["max_tool_calls"]
    assert allowed == 5  # capgate sent the default bound on uses upstream
    # when: the provider bills the most such a call can bill: the prompt at its bound, every
    # allowed search, each in its own pass and adding the largest result, and the whole output
    # ceiling
    upstream.control(prompt_tokens=per_pass, search_result_tokens=RESULT_TOKENS, completion_tokens="max")
    resp = post(gateway, BODY, path=PATH)
    assert resp.status_code == 200, resp.text
    wait_settled()
    rec = UsageRecord.objects.get(request_id=resp.headers["x-capgate-request-id"])
    billed = billed_response(searching, resp.json())
    # then: recorded at the bill, within the reservation, which is that bill and not a multiple
    assert sum(1 for i in resp.json()["output"] if i["type"] == "web_search_call") == allowed
    assert rec.cost_nano == billed
    assert billed <= rec.reserved_nano <= billed + 1  # the worst case rounds up by under 1 nano-USD
    # and a lower max_tool_calls holds less: each use is another pass and another result
    upstream.control(prompt_tokens=10, search_result_tokens=0, completion_tokens=5)
    one = post(gateway, {**BODY, "max_tool_calls": 1}, path=PATH)
    assert one.status_code == 200, one.text
    wait_settled()
    assert UsageRecord.objects.get(request_id=one.headers["x-capgate-request-id"]).reserved_nano < rec.reserved_nano / 2


@pytest.mark.parametrize(
    "dropped",
    [
        ("the results", lambda shape, rates: (shape, dataclasses.replace(rates, server_tool_result_tokens=0))),
        ("the passes", lambda shape, rates: (dataclasses.replace(shape, server_tool_uses=0), rates)),
    ],
    ids=lambda d: d[0],
)
def test_without_the_passes_or_their_results_the_provider_bills_past_the_reservation(
    gateway, searching, upstream, monkeypatch, dropped
):
    # given a bound that leaves out the searches' results, or the passes they start
    bound, drop = sizing._bound, dropped[1]

    def partial(shape, target, rates, out):
        shape, rates = drop(shape, rates)
        return bound(shape, target, rates, out)

    monkeypatch.setattr(sizing, "_bound", partial)
    upstream.control(prompt_tokens=100, search_result_tokens=RESULT_TOKENS, completion_tokens="max")
    # when the provider searches every allowed time
    resp = post(gateway, BODY, path=PATH)
    assert resp.status_code == 200, resp.text
    wait_settled()
    # then its bill passes what was reserved
    rec = UsageRecord.objects.get()
    assert rec.cost_nano == billed_response(searching, resp.json()) > rec.reserved_nano


def test_the_callers_max_tool_calls_is_sent_and_bounds_the_turn(gateway, searching, upstream):
    # given a caller that allows two searches
    upstream.control(prompt_tokens=100, search_result_tokens=RESULT_TOKENS, completion_tokens="max")
    # when the provider uses both
    resp = post(gateway, {**BODY, "max_tool_calls": 2}, path=PATH)
    # then the provider was told two, billed two, and the reservation covered the bill
    assert resp.status_code == 200, resp.text
    assert upstream.last(PATH)["body"]["max_tool_calls"] == 2
    assert sum(1 for i in resp.json()["output"] if i["type"] == "web_search_call") == 2
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.cost_nano == billed_response(searching, resp.json()) <= rec.reserved_nano
    assert rec.excess_nano == 0


@pytest.mark.parametrize(
    ("unset", "named"),
    [
        ("web_search_usd_per_use", "no catalog price for web search (web_search_usd_per_use"),
        ("server_tool_result_tokens", "no catalog price for web search results (server_tool_result_tokens"),
    ],
)
def test_a_model_without_a_search_price_is_refused_naming_the_model_and_the_price(
    gateway, searching, upstream, unset, named
):
    # given a model whose catalog entry lacks what bounds a search
    setattr(searching, unset, None)
    searching.save()
    before = upstream.stats()["requests"]
    # when a Codex-like turn offers the model web search under a blocking cap
    resp = post(gateway, BODY, path=PATH)
    # then it is refused in OpenAI's shape, naming the model and the missing field; nothing is
    # held and nothing reaches the provider
    assert resp.status_code == 402
    error = resp.json()["error"]
    assert error["code"] == "web_search_under_budget"
    assert "Model openai/gpt-real has " + named in error["message"]
    assert_nothing_held()
    assert upstream.stats()["requests"] == before


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "https://mcp.example.com"},
    ],
    ids=lambda t: t["type"],
)
def test_hosted_tools_the_catalog_cannot_price_are_refused_under_a_cap(gateway, searching, tool):
    resp = post(gateway, {"model": "gpt-real", "input": "x", "tools": [tool]}, path=PATH)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == f"{tool['type']}_under_budget"
    assert_nothing_held()
