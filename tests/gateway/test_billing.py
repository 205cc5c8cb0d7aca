"""Every billable path inside the bound (docs/billing.md), through HTTP against a real fake
upstream that bills each feature the way its provider documents it.

Each priced feature is checked the same way: a blocking cap worth 10 worst cases, 30 requests at
once, and afterwards what the upstream billed (computed here, independently, from the usage it
reported to the clients) is within the cap and equals what capgate recorded. Each has a
guard-removal twin: drop the feature from the worst case and the upstream bills past the cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal

import httpx
import pytest

from catalog.models import Connection, Model, Provider, RouteTarget
from gateway.admission import service, sizing
from ledger.models import Budget, UsageRecord, Window
from tenants.models import AuditLogEntry
from tests.conftest import usd
from tests.gateway.conftest import KEY, wait_settled

AUTH = {"Authorization": f"Bearer {KEY}"}
NANO = Decimal(1000)  # nano-USD per token per USD-per-1M-tokens


def post(gateway, body, path="/v1/chat/completions", headers=None):
    return httpx.post(gateway.url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=30)


def burst(gateway, body, *, n=30, path="/v1/chat/completions", headers=None) -> list[httpx.Response]:
    async def go():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *[client.post(gateway.url + path, json=body, headers={**AUTH, **(headers or {})}) for _ in range(n)]
            )

    return asyncio.run(go())


@pytest.fixture
def claude(wired):
    """An Anthropic model with web search and 1-hour cache prices, routed as `claude-real`."""
    provider = Provider.objects.create(slug="anthropic", name="Anthropic")
    model = Model.objects.create(
        provider=provider,
        name="claude-real",
        input_usd_per_mtok=Decimal("3"),
        output_usd_per_mtok=Decimal("15"),
        cache_read_usd_per_mtok=Decimal("0.30"),
        cache_write_usd_per_mtok=Decimal("3.75"),
        cache_write_1h_usd_per_mtok=Decimal("6"),
        web_search_usd_per_use=Decimal("0.01"),
        server_tool_result_tokens=100,
        priority_multiplier=Decimal("1.5"),
        max_output_tokens=8192,
    )
    wired.route("claude-real", wired.anthropic, model=model)
    return model


@pytest.fixture
def gpt(wired):
    """An OpenAI model with a priority tier at twice the price, routed as `gpt-real`."""
    provider = Provider.objects.create(slug="openai", name="OpenAI")
    model = Model.objects.create(
        provider=provider,
        name="gpt-real",
        input_usd_per_mtok=Decimal("2"),
        output_usd_per_mtok=Decimal("8"),
        cache_read_usd_per_mtok=Decimal("0.5"),
        priority_multiplier=Decimal("2"),
        flex_multiplier=Decimal("0.5"),
        max_output_tokens=16384,
    )
    wired.route("gpt-real", wired.openai, model=model)
    return model


def billed_anthropic(model: Model, usage: dict) -> int:
    """What Anthropic bills for a reported usage, from its documented fields."""
    tier = Decimal(model.priority_multiplier) if usage.get("service_tier") == "priority" else Decimal(1)
    one_hour = usage.get("cache_creation", {}).get("ephemeral_1h_input_tokens", 0)
    tokens = (
        (
            usage["input_tokens"] * model.input_usd_per_mtok
            + usage["output_tokens"] * model.output_usd_per_mtok
            + usage.get("cache_read_input_tokens", 0) * model.cache_read_usd_per_mtok
            + (usage.get("cache_creation_input_tokens", 0) - one_hour) * model.cache_write_usd_per_mtok
            + one_hour * (model.cache_write_1h_usd_per_mtok or 0)
        )
        * tier
        * NANO
    )
    searches = usage.get("server_tool_use", {}).get("web_search_requests", 0) * model.web_search_usd_per_use * 10**9
    return int((tokens + searches).to_integral_value())


def billed_openai(model: Model, body: dict) -> int:
    mult = {"priority": model.priority_multiplier, "flex": model.flex_multiplier}.get(body.get("service_tier"), 1)
    u = body["usage"]
    cost = u["prompt_tokens"] * model.input_usd_per_mtok + u["completion_tokens"] * model.output_usd_per_mtok
    return int((cost * Decimal(mult) * NANO).to_integral_value())


def capped_at_ten(wired, gateway, body, *, path, headers=None) -> tuple[Budget, int]:
    """A blocking month cap worth exactly 10 worst cases of `body`, learned from one request
    made before the cap exists; returns the budget and the calibration request's cost."""
    first = post(gateway, body, path=path, headers=headers)
    assert first.status_code == 200, first.text
    wait_settled()
    rec = UsageRecord.objects.get()
    budget = wired.budget(amount="1")
    budget.amount_nano = rec.cost_nano + 10 * rec.reserved_nano
    budget.save()
    return budget, rec.cost_nano


def assert_cap_holds(budget: Budget, billed: int, calibration: int) -> None:
    wait_settled(timeout=30)
    recorded = sum(UsageRecord.objects.values_list("cost_nano", flat=True))
    assert recorded == calibration + billed, "capgate's books must match the provider's bill"
    assert calibration + billed <= budget.amount_nano, "the provider billed past the cap"
    assert Window.objects.get(budget=budget).spent_nano == recorded


# --- routes ---------------------------------------------------------------------------------


def test_a_route_alias_sends_the_targets_model_id_and_reports_what_was_served(gateway, wired, upstream, gpt):
    wired.route("fast", wired.openai, model=gpt)
    resp = post(gateway, {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    assert resp.status_code == 200, resp.text
    assert upstream.last("/v1/chat/completions")["body"]["model"] == "gpt-real"
    assert resp.json()["model"] == "gpt-real"  # the provider's answer, as the SDKs expect it
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.model, rec.provider_model) == ("fast", "gpt-real")


def test_failover_across_models_prices_each_attempt_at_the_model_called(gateway, wired, upstream, gpt):
    # given: a route whose first target (a pricier model) cannot be reached
    pricey = Model.objects.create(
        provider=gpt.provider,
        name="gpt-pricey",
        input_usd_per_mtok=Decimal("20"),
        output_usd_per_mtok=Decimal("80"),
        max_output_tokens=16384,
    )
    dead = Connection.objects.create(
        organization=wired.org, name="dead", kind="openai", base_url="http://127.0.0.1:9/v1", secret="x"
    )
    route = wired.route("mixed", dead, model=pricey)
    RouteTarget.objects.create(route=route, connection=wired.openai, model=gpt, position=1)
    wired.budget(amount="5")
    # when
    resp = post(gateway, {"model": "mixed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50})
    # then: served by the second target, under its own model id and price
    assert resp.status_code == 200, resp.text
    assert upstream.last("/v1/chat/completions")["body"]["model"] == "gpt-real"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.connection_id == wired.openai.id
    assert rec.cost_nano == billed_openai(gpt, resp.json())
    # the worst case was reserved at the priciest target that could have been tried
    assert rec.reserved_nano > 50 * 80 * 1000
    assert resp.headers["x-capgate-reserved-usd"] == f"{Decimal(rec.reserved_nano) / 10**9:.9f}"


# --- priced per use ------------------------------------------------------------------------

SEARCH = {
    "model": "claude-real",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "What happened in the news today?"}],
    "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
}


def _search_burst(wired, gateway, upstream, claude):
    upstream.control(prompt_tokens=50, search_result_tokens=100, completion_tokens="max")
    budget, calibration = capped_at_ten(wired, gateway, SEARCH, path="/v1/messages")
    upstream.control(delay_ms=1500)
    responses = burst(gateway, SEARCH, path="/v1/messages")
    ok = [r for r in responses if r.status_code == 200]
    billed = sum(billed_anthropic(claude, r.json()["usage"]) for r in ok)
    return budget, calibration, responses, billed


def test_web_search_under_a_cap_worth_ten_bills_within_it_and_is_recorded(gateway, wired, upstream, claude):
    budget, calibration, responses, billed = _search_burst(wired, gateway, upstream, claude)
    codes = [r.status_code for r in responses]
    assert codes.count(200) == 10 and codes.count(402) == 20
    assert all(
        r.json()["usage"]["server_tool_use"]["web_search_requests"] == 5 for r in responses if r.status_code == 200
    )
    assert_cap_holds(budget, billed, calibration)


def test_without_web_search_in_the_worst_case_the_provider_bills_past_the_cap(
    gateway, wired, upstream, claude, monkeypatch
):
    bound = sizing._bound
    monkeypatch.setattr(
        sizing, "_bound", lambda shape, *a: bound(dataclasses.replace(shape, web_searches=0, server_tool_uses=0), *a)
    )
    budget, calibration, _, billed = _search_burst(wired, gateway, upstream, claude)
    assert calibration + billed > budget.amount_nano


def test_web_search_without_max_uses_gets_the_default_sent_upstream(gateway, wired, upstream, claude, settings):
    settings.CAPGATE = {**settings.CAPGATE, "DEFAULT_SERVER_TOOL_MAX_USES": 3}
    body = {**SEARCH, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    assert post(gateway, body, path="/v1/messages").status_code == 200
    assert upstream.last("/v1/messages")["body"]["tools"][0]["max_uses"] == 3


PRIORITY = {
    "model": "gpt-real",
    "max_tokens": 200,
    "service_tier": "priority",
    "messages": [{"role": "user", "content": "Answer fast."}],
}


def _priority_burst(wired, gateway, upstream, gpt):
    upstream.control(completion_tokens="max")
    budget, calibration = capped_at_ten(wired, gateway, PRIORITY, path="/v1/chat/completions")
    upstream.control(delay_ms=1500)
    responses = burst(gateway, PRIORITY)
    billed = sum(billed_openai(gpt, r.json()) for r in responses if r.status_code == 200)
    return budget, calibration, responses, billed


def test_priority_tier_under_a_cap_worth_ten_bills_within_it_and_is_recorded(gateway, wired, upstream, gpt):
    budget, calibration, responses, billed = _priority_burst(wired, gateway, upstream, gpt)
    assert [r.status_code for r in responses].count(200) == 10
    assert all(r.json()["service_tier"] == "priority" for r in responses if r.status_code == 200)
    assert_cap_holds(budget, billed, calibration)


def test_without_the_tier_in_the_worst_case_the_provider_bills_past_the_cap(gateway, wired, upstream, gpt, monkeypatch):
    monkeypatch.setattr(service.Target, "tier", lambda self, requested: None)
    budget, calibration, _, billed = _priority_burst(wired, gateway, upstream, gpt)
    assert calibration + billed > budget.amount_nano


def test_auto_tier_is_priced_at_the_tier_the_connection_declares(gateway, wired, upstream, gpt):
    # given: a provider project whose default tier is priority (so "auto" and no tier bill it)
    wired.openai.options = {**wired.openai.options, "service_tier": "priority"}
    wired.openai.save()
    upstream.control(tier="priority", completion_tokens="max")
    wired.budget(amount="5")
    resp = post(gateway, {"model": "gpt-real", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 200
    wait_settled()
    rec = UsageRecord.objects.get()
    assert resp.json()["service_tier"] == "priority"
    assert rec.cost_nano == billed_openai(gpt, resp.json())
    assert rec.reserved_nano >= 100 * 8 * 2 * 1000  # the output ceiling at the priority price


def test_a_tier_without_a_price_is_refused_under_a_cap_and_allowed_under_alerts(gateway, wired, upstream, gpt):
    body = {**PRIORITY, "service_tier": "scale"}
    wired.budget(amount="5", mode="alert")
    assert post(gateway, body).status_code == 200
    block = wired.budget(amount="5")
    resp = post(gateway, body)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "service_tier_under_budget"
    assert not Window.objects.filter(budget=block, reserved_nano__gt=0).exists()


def test_one_hour_cache_writes_are_reserved_and_billed_at_the_one_hour_price(gateway, wired, upstream, claude):
    upstream.control(prompt_tokens=40, cache_write_1h_tokens=30, completion_tokens="max")
    wired.budget(amount="5")
    body = {
        "model": "claude-real",
        "max_tokens": 50,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "a long shared prefix",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            }
        ],
    }
    resp = post(gateway, body, path="/v1/messages", headers={"anthropic-beta": "extended-cache-ttl-2025-04-11"})
    assert resp.status_code == 200, resp.text
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.cost_nano == billed_anthropic(claude, resp.json()["usage"])
    # every input token of the bound at the 1-hour write price ($6/M), above the 5-minute one
    assert rec.reserved_nano >= 50 * 15 * 1000 + 40 * 6 * 1000
    # without a 1-hour price, a blocking cap refuses it
    Model.objects.filter(pk=claude.pk).update(cache_write_1h_usd_per_mtok=None)
    resp = post(gateway, body, path="/v1/messages")
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == "cache_control_under_budget"


# --- refused under a blocking cap, and unknown -------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "headers", "code"),
    [
        (
            "/v1/chat/completions",
            {"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]},
            {},
            "audio_under_budget",
        ),
        ("/v1/chat/completions", {"web_search_options": {}}, {}, "web_search_options_under_budget"),
        (
            "/v1/messages",
            {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
            {},
            "code_execution_under_budget",
        ),
        (
            "/v1/messages",
            {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]},
            {},
            "mcp_servers_under_budget",
        ),
        ("/v1/messages", {}, {"anthropic-beta": "files-api-2025-04-14"}, "anthropic_beta_under_budget"),
        ("/v1/messages", {"inference_geo": "us"}, {}, "inference_geo_under_budget"),
    ],
)
def test_fields_the_cap_cannot_bound_are_refused_under_it_and_name_the_field(
    gateway, wired, upstream, path, body, headers, code
):
    model = "gpt-test" if path.endswith("completions") else "claude-test"
    full = {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    wired.budget(amount="5", mode="alert")
    assert post(gateway, full, path=path, headers=headers).status_code == 200  # alert-only: allowed
    wired.budget(amount="5")
    resp = post(gateway, full, path=path, headers=headers)
    assert resp.status_code == 402
    assert resp.json()["error"]["code"] == code
    if path == "/v1/messages":
        assert resp.json()["type"] == "error"  # Anthropic's shape on its endpoint


@pytest.mark.parametrize(
    ("path", "body", "headers", "code"),
    [
        ("/v1/chat/completions", {"tools": [{"type": "web_search"}]}, {}, "unsupported_tool"),
        ("/v1/messages", {"tools": [{"type": "future_tool_20991231", "name": "x"}]}, {}, "unsupported_tool"),
        ("/v1/messages", {}, {"anthropic-beta": "something-new-2099-01-01"}, "unsupported_beta"),
        ("/v1/chat/completions", {"brand_new_paid_option": True}, {}, "unsupported_parameter"),
        ("/v1/chat/completions", {}, {"openai-beta": "assistants=v2"}, "unsupported_header"),
        ("/v1/messages", {}, {"anthropic-priority-lane": "yes"}, "unsupported_header"),
    ],
)
def test_unknown_fields_tools_and_betas_are_refused_with_400_under_a_cap_and_nothing_is_reserved(
    gateway, wired, path, body, headers, code
):
    # (with no blocking budget they pass, counted: tests/gateway/test_unclassified.py)
    wired.budget(amount="5")
    model = "gpt-test" if path.endswith("completions") else "claude-test"
    full = {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    resp = post(gateway, full, path=path, headers=headers)
    assert resp.status_code == 400
    assert code in resp.text
    assert "/api/classifications/" in resp.text  # where to classify it
    assert not UsageRecord.objects.exists()


def test_a_paid_usage_field_capgate_cannot_price_is_charged_at_worst_case_and_flagged(gateway, wired, upstream, gpt):
    upstream.control(audio_tokens=500)
    wired.budget(amount="5")
    resp = post(gateway, {"model": "gpt-real", "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 200
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.cost_nano == rec.reserved_nano > billed_openai(gpt, resp.json())
    assert "completion_tokens_details.audio_tokens=500" in rec.error


# --- tighter bounds -------------------------------------------------------------------------


def test_default_output_ceiling_is_the_tighter_of_key_and_route_and_sent_upstream(gateway, wired, upstream, gpt):
    route = wired.route("gpt-real", wired.openai, model=gpt)
    route.default_max_output_tokens = 300
    route.save()
    body = {"model": "gpt-real", "messages": [{"role": "user", "content": "Hello"}]}
    post(gateway, body)
    assert upstream.last("/v1/chat/completions")["body"]["max_completion_tokens"] == 300
    wired.key.default_max_output_tokens = 120
    wired.key.save()
    resp = post(gateway, body)
    assert upstream.last("/v1/chat/completions")["body"]["max_completion_tokens"] == 120
    wait_settled()
    first, second = UsageRecord.objects.order_by("id")
    assert second.reserved_nano == first.reserved_nano - (300 - 120) * 8 * 1000
    assert "x-capgate-reserved-usd" in resp.headers


def test_every_admitted_response_carries_its_reserved_worst_case_and_the_room_left(gateway, wired, upstream, gpt):
    budget = wired.budget(amount="1")
    resp = post(gateway, {"model": "gpt-real", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]})
    wait_settled()
    rec = UsageRecord.objects.get()
    assert Decimal(resp.headers["x-capgate-reserved-usd"]) * 10**9 == rec.reserved_nano
    assert Decimal(resp.headers["x-capgate-budget-remaining-usd"]) * 10**9 == budget.amount_nano - rec.reserved_nano
    stream = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers=AUTH,
        timeout=30,
        json={"model": "gpt-real", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "x"}]},
    )
    assert "x-capgate-reserved-usd" in stream.headers and "x-capgate-budget-remaining-usd" in stream.headers


def test_the_reservation_api_sizes_a_chat_body_as_the_proxy_does(gateway, wired, upstream, gpt):
    # given: a provider project billing at priority by default, under a blocking cap
    wired.openai.options = {**wired.openai.options, "service_tier": "priority"}
    wired.openai.save()
    upstream.control(tier="priority")
    wired.budget(amount="5")
    body = {"model": "gpt-real", "max_tokens": 100, "messages": [{"role": "user", "content": "Size me."}]}
    # when: the proxy calls it, then the reservation API reserves the same body
    assert post(gateway, body).status_code == 200
    wait_settled()
    reserved = post(gateway, body, path="/v1/reservations")
    # then: one sizing, at the tier the connection bills (the reservation API once sized at none)
    assert reserved.status_code == 201, reserved.text
    assert reserved.json()["amount_nano"] == UsageRecord.objects.get().reserved_nano


# --- issue 15: unpriced fallbacks and run budgets ---------------------------------------------


def test_an_unpriced_fallback_is_not_tried_under_a_cap_and_the_priced_target_is_counted(gateway, wired, upstream, gpt):
    # given: an org that allows unpriced traffic, and a route [priced gpt-real, unpriced fallback]
    wired.org.allow_unpriced = True
    wired.org.save()
    free = Model.objects.create(provider=gpt.provider, name="gpt-unpriced")
    route = wired.route("gpt-real", wired.openai, model=gpt)
    RouteTarget.objects.create(route=route, connection=wired.echo, model=free, position=1)
    upstream.control(completion_tokens="max")
    budget, calibration = capped_at_ten(wired, gateway, PRIORITY, path="/v1/chat/completions")
    upstream.control(delay_ms=1500)
    responses = burst(gateway, PRIORITY)
    billed = sum(billed_openai(gpt, r.json()) for r in responses if r.status_code == 200)
    assert [r.status_code for r in responses].count(200) == 10
    assert_cap_holds(budget, billed, calibration)


def test_with_the_unpriced_target_governing_the_route_the_cap_stops_counting(
    gateway, wired, upstream, gpt, monkeypatch
):
    # the guard removed: one unpriced target makes the whole route ungoverned again
    real = sizing._price_targets

    def old(shape, targets):
        priced, no_model, no_feature = real(shape, targets)
        if len(priced) < len(targets):
            return [], no_model, no_feature
        return priced, no_model, no_feature

    monkeypatch.setattr(sizing, "_price_targets", old)
    wired.org.allow_unpriced = True
    wired.org.save()
    free = Model.objects.create(provider=gpt.provider, name="gpt-unpriced")
    route = wired.route("gpt-real", wired.openai, model=gpt)
    RouteTarget.objects.create(route=route, connection=wired.echo, model=free, position=1)
    upstream.control(completion_tokens="max")
    wired.budget(amount="0.01")
    upstream.control(delay_ms=500)
    responses = burst(gateway, PRIORITY)
    assert [r.status_code for r in responses].count(200) == 30  # past a cap worth less than one


def test_a_refused_first_call_of_a_run_leaves_no_run_budget(gateway, wired, upstream):
    wired.budget(amount="0.000001")
    resp = post(
        gateway,
        {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
        headers={"X-Capgate-Run": "run-1", "X-Capgate-Run-Budget-Usd": "1"},
    )
    assert resp.status_code == 402
    assert not Budget.objects.filter(scope="run").exists()
    Budget.objects.filter(organization=wired.org).update(amount_nano=usd("5"))
    resp = post(
        gateway,
        {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
        headers={"X-Capgate-Run": "run-1", "X-Capgate-Run-Budget-Usd": "1"},
    )
    assert resp.status_code == 200
    assert Budget.objects.get(scope="run").amount_nano == usd("1")


def test_a_run_budget_is_created_through_create_budget_with_the_key_as_actor(gateway, wired, upstream):
    body = {"model": "gpt-test", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    for _ in range(2):  # the second call finds the budget: created (and audited) once
        assert (
            post(gateway, body, headers={"X-Capgate-Run": "run-a", "X-Capgate-Run-Budget-Usd": "1"}).status_code == 200
        )
    budget = Budget.objects.get(scope="run")
    entry = AuditLogEntry.objects.get(object_type="budget", object_id=str(budget.pk))
    assert entry.action == "create" and entry.actor == f"key {wired.key.name} ({wired.key.prefix}…)"
    assert entry.changes["amount_nano"] == [None, usd("1")]
