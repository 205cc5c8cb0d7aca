"""POST /v1/responses (the OpenAI Responses API) through the official SDK, and its stored
state: a continuation (previous_response_id) makes the provider bill the earlier context, which
the body does not show; capgate bounds it from what it relayed itself."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import openai
import pytest

from gateway.models import StoredResponse
from gateway.upstream import continuations as stored_state
from ledger.models import Reservation, UsageRecord, Window
from tests.conftest import make_tenant
from tests.gateway.conftest import KEY, wait_settled
from tests.gateway.test_billing import (  # noqa: F401  (fixtures)
    AUTH,
    NANO,
    assert_cap_holds,
    capped_at_ten,
    gpt,
    post,
)

PATH = "/v1/responses"


def billed_response(model, response: dict) -> int:
    """What OpenAI bills for a Response: tokens at the model's rates and tier, plus searches."""
    u = response["usage"]
    mult = {"priority": model.priority_multiplier, "flex": model.flex_multiplier}.get(response.get("service_tier"), 1)
    cost = (u["input_tokens"] * model.input_usd_per_mtok + u["output_tokens"] * model.output_usd_per_mtok) * Decimal(
        mult
    )
    searches = sum(1 for i in response["output"] if i["type"] == "web_search_call")
    return int((cost * NANO + searches * (model.web_search_usd_per_use or 0) * 10**9).to_integral_value())


def sse_final_response(text: str) -> dict:
    import json

    for line in text.splitlines():
        if line.startswith("data:") and '"response.completed"' in line:
            return json.loads(line[5:])["response"]
    raise AssertionError("no response.completed event")


def burst(gateway, body, n=30) -> list[httpx.Response]:
    async def go():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(*[client.post(gateway.url + PATH, json=body, headers=AUTH) for _ in range(n)])

    return asyncio.run(go())


def test_the_official_sdk_creates_a_response_at_the_targets_model(gateway, wired, upstream, gpt):  # noqa: F811
    wired.route("smart", wired.openai, model=gpt)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.responses.create(model="smart", input="Say hi", max_output_tokens=30)
    assert reply.status == "completed" and reply.output_text
    assert upstream.last(PATH)["body"]["model"] == "gpt-real"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "served" and rec.cost_nano == billed_response(gpt, reply.model_dump())
    assert StoredResponse.objects.get().response_id == reply.id
    # and streamed, with usage taken from response.completed
    with client.responses.stream(model="smart", input="Say hi", max_output_tokens=30) as stream:
        final = stream.get_final_response()
    assert final.usage.output_tokens > 0
    wait_settled()
    assert UsageRecord.objects.filter(status="served").count() == 2


@pytest.mark.parametrize("stream", [False, True])
def test_thirty_responses_at_a_cap_worth_ten_bill_within_it(gateway, wired, upstream, gpt, stream):  # noqa: F811
    upstream.control(prompt_tokens=40, completion_tokens="max")
    body = {"model": "gpt-real", "input": "Explain caps.", "max_output_tokens": 200, "stream": stream}
    budget, calibration = capped_at_ten(wired, gateway, body, path=PATH)
    upstream.control(delay_ms=1500)
    got = burst(gateway, body)
    ok = [r for r in got if r.status_code == 200]
    assert len(ok) == 10
    finals = [sse_final_response(r.text) if stream else r.json() for r in ok]
    assert_cap_holds(budget, sum(billed_response(gpt, f) for f in finals), calibration)


def _continuation_burst(wired, gateway, upstream, gpt):  # noqa: F811
    # an earlier response with a large context, relayed by capgate before any cap exists
    upstream.control(prompt_tokens=3000, completion_tokens=50)
    first = post(
        gateway, {"model": "gpt-real", "input": "Read this long document.", "max_output_tokens": 50}, path=PATH
    ).json()
    wait_settled()
    UsageRecord.objects.all().delete()  # the calibration below is the only spend
    upstream.control(prompt_tokens=20, completion_tokens="max")
    body = {"model": "gpt-real", "input": "And then?", "max_output_tokens": 50, "previous_response_id": first["id"]}
    budget, calibration = capped_at_ten(wired, gateway, body, path=PATH)
    upstream.control(delay_ms=1500)
    ok = [r for r in burst(gateway, body) if r.status_code == 200]
    return budget, calibration, ok


def test_continuations_are_bounded_by_the_context_capgate_relayed(gateway, wired, upstream, gpt):  # noqa: F811
    budget, calibration, ok = _continuation_burst(wired, gateway, upstream, gpt)
    assert len(ok) == 10
    assert all(r.json()["usage"]["input_tokens"] > 3000 for r in ok)  # the provider billed the earlier context
    assert_cap_holds(budget, sum(billed_response(gpt, r.json()) for r in ok), calibration)


def test_without_the_stored_context_in_the_bound_continuations_bill_past_the_cap(
    gateway,
    wired,
    upstream,
    gpt,  # noqa: F811
    monkeypatch,
):
    monkeypatch.setattr(stored_state, "context_tokens", lambda **kw: 0)
    budget, calibration, ok = _continuation_burst(wired, gateway, upstream, gpt)
    assert calibration + sum(billed_response(gpt, r.json()) for r in ok) > budget.amount_nano


def test_a_continuation_capgate_did_not_relay_is_refused_under_a_cap_only(gateway, wired, upstream, gpt):  # noqa: F811
    body = {"model": "gpt-real", "input": "go on", "max_output_tokens": 20, "previous_response_id": "resp_elsewhere"}
    wired.budget(amount="5", mode="alert")
    assert post(gateway, body, path=PATH).status_code == 200
    block = wired.budget(amount="5")
    resp = post(gateway, body, path=PATH)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "unknown_previous_response_id"
    conv = post(
        gateway,
        {**{k: v for k, v in body.items() if k != "previous_response_id"}, "conversation": "conv_unknown"},
        path=PATH,
    )
    assert conv.json()["error"]["code"] == "unknown_conversation"
    assert not Window.objects.filter(budget=block, reserved_nano__gt=0).exists()


def test_another_organizations_response_id_does_not_bound_a_continuation(gateway, wired, upstream, gpt):  # noqa: F811
    other = make_tenant("globex")
    StoredResponse.objects.create(organization=other.org, response_id="resp_theirs", context_tokens=10)
    wired.budget(amount="5")
    resp = post(
        gateway,
        {"model": "gpt-real", "input": "x", "max_output_tokens": 20, "previous_response_id": "resp_theirs"},
        path=PATH,
    )
    assert resp.status_code == 402


def test_web_search_is_priced_per_call_and_bounded_by_max_tool_calls(gateway, wired, upstream, gpt):  # noqa: F811
    gpt.web_search_usd_per_use = Decimal("0.01")
    gpt.server_tool_result_tokens = 100
    gpt.save()
    upstream.control(prompt_tokens=30, search_result_tokens=100, completion_tokens="max")
    wired.budget(amount="5")
    resp = post(
        gateway,
        {"model": "gpt-real", "input": "news?", "max_output_tokens": 40, "tools": [{"type": "web_search"}]},
        path=PATH,
    )
    assert resp.status_code == 200, resp.text
    assert upstream.last(PATH)["body"]["max_tool_calls"] == 5  # injected: the uses are bounded
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.cost_nano == billed_response(gpt, resp.json()) <= rec.reserved_nano
    # a hosted tool capgate cannot price is refused under the cap
    resp = post(
        gateway,
        {"model": "gpt-real", "input": "x", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
        path=PATH,
    )
    assert resp.json()["error"]["code"] == "code_interpreter_under_budget"
    # a background response is a provider job (jobs/): admitted like the foreground one, then held by the job
    resp = post(gateway, {"model": "gpt-real", "input": "x", "background": True, "max_output_tokens": 10}, path=PATH)
    assert resp.status_code == 200, resp.text
    assert Reservation.objects.get(job_id=resp.json()["id"]).owner_id is None


def test_stored_responses_are_reachable_by_their_owner_only(gateway, wired, upstream, gpt):  # noqa: F811
    created = post(gateway, {"model": "gpt-real", "input": "hi", "max_output_tokens": 10}, path=PATH).json()
    rid = created["id"]
    # the owner's GET and cancel are proxied to the connection that served it
    httpx.get(f"{gateway.url}{PATH}/{rid}", headers=AUTH, timeout=10)
    assert upstream.last(f"{PATH}/{rid}")["method"] == "GET"
    httpx.post(f"{gateway.url}{PATH}/{rid}/cancel", headers=AUTH, timeout=10)
    assert upstream.last(f"{PATH}/{rid}/cancel")["method"] == "POST"
    # another organization's key: 404, and nothing reaches the provider
    other = make_tenant("globex")
    from tenants.models import ApiKey, hash_key

    ApiKey.objects.filter(pk=other.key.pk).update(key_hash=hash_key("cg_other_key_0123456789"))
    before = upstream.stats()["requests"]
    resp = httpx.delete(
        f"{gateway.url}{PATH}/{rid}", headers={"Authorization": "Bearer cg_other_key_0123456789"}, timeout=10
    )
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert upstream.stats()["requests"] == before
    assert StoredResponse.objects.filter(response_id=rid).exists()


def test_the_echo_provider_answers_the_responses_api_streamed_or_not(gateway, wired):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.responses.create(model="echo-1", input="hello", max_output_tokens=20)
    assert reply.output_text == "echo" and reply.usage.output_tokens > 0
    with client.responses.stream(model="echo-1", input="hello", max_output_tokens=20) as stream:
        final = stream.get_final_response()
    assert final.output_text.startswith("echo")
    wait_settled()
    assert UsageRecord.objects.filter(status="served").count() == 2
