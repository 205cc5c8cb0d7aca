"""A Vertex AI connection: capgate gets an OAuth token for the connection's service account (once,
cached; the fake's token endpoint verifies the key's signature), calls Claude through rawPredict /
streamRawPredict and Gemini through the OpenAI-compatible endpoint, records each request at its
cost (thinking and cached tokens included), and refuses it at the cap before Vertex sees it. The
fake is checked with AnthropicVertex and the openai SDK in tests/upstream/test_vertex.py."""

from __future__ import annotations

import json
from decimal import Decimal

import anthropic
import openai
import pytest

from catalog.models import Connection, Model, Provider
from catalog.services import create_connection
from core.errors import InvalidChange
from ledger.models import UsageRecord
from tenants.audit import APPLY
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.vertex import new_service_account

pytestmark = pytest.mark.django_db(transaction=True)

PROJECT, REGION = "capgate-test", "us-east5"
LOCATION = f"/v1/projects/{PROJECT}/locations/{REGION}"
CLAUDE_ID = "claude-sonnet-4-5@20250929"
RAW = f"{LOCATION}/publishers/anthropic/models/{CLAUDE_ID}:rawPredict"
STREAM = f"{LOCATION}/publishers/anthropic/models/{CLAUDE_ID}:streamRawPredict"
OPENAPI = f"{LOCATION}/endpoints/openapi/chat/completions"


@pytest.fixture
def vertex(wired, upstream) -> Connection:
    """`claude-vertex` routes to echo-1 ($15 / $75 per 1M) as Vertex's Claude Sonnet 4.5 in
    us-east5 (a regional endpoint: $16.50 / $82.50 with Google's 10% premium); `flash-vertex` to
    gemini-2.5-flash ($0.30 in, $2.50 out, $0.03 cached per 1M, no premium) through the
    OpenAI-compatible endpoint."""
    key = new_service_account(upstream.url + "/token", project=PROJECT)
    conn = create_connection(
        organization=wired.org,
        actor=APPLY,
        name="vx",
        kind="vertex",
        base_url=upstream.url,
        secret=json.dumps(key),
        options={
            "project": PROJECT,
            "region": REGION,
            "model_ids": {"echo-1": CLAUDE_ID},
            "forward_test_headers": True,
        },
    )
    google, _ = Provider.objects.get_or_create(slug="google", defaults={"name": "Google"})
    flash = Model.objects.create(
        provider=google,
        name="gemini-2.5-flash",
        input_usd_per_mtok=Decimal("0.3"),
        output_usd_per_mtok=Decimal("2.5"),
        cache_read_usd_per_mtok=Decimal("0.03"),
        max_output_tokens=65536,
    )
    wired.route("claude-vertex", conn)
    wired.route("flash-vertex", conn, model=flash)
    return conn


def claude(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def gpt(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def test_claude_is_served_through_raw_predict_with_one_cached_token(gateway, vertex, upstream, slices_mode):
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    for _ in range(3):
        reply = claude(gateway).messages.create(
            model="claude-vertex", max_tokens=300, messages=[{"role": "user", "content": "hi"}]
        )

    assert reply.content[0].text and reply.usage.input_tokens == 1000
    seen = upstream.last(RAW)
    assert seen["headers"]["authorization"].startswith("Bearer ya29.fake-")
    assert seen["body"]["anthropic_version"] == "vertex-2023-10-16" and "model" not in seen["body"]
    assert upstream.stats()["token_grants"] == 1  # the token is cached per connection
    wait_settled()
    costs = sorted(UsageRecord.objects.values_list("status", "cost_nano"))
    assert costs == [("served", 16_500_000 + 16_500_000)] * 3


def test_a_claude_stream_is_relayed_and_recorded(gateway, vertex, upstream, slices_mode):
    upstream.control(prompt_tokens=10, completion_tokens=20)

    with claude(gateway).messages.stream(
        model="claude-vertex", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert "".join(stream.text_stream)

    assert upstream.last(STREAM)["body"]["stream"] is True
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("served", 10 * 16_500 + 20 * 82_500)


def test_gemini_bills_thinking_as_output_and_cached_tokens_at_the_cache_rate(gateway, vertex, upstream, slices_mode):
    # given: 1000 prompt tokens of which 400 cached, 200 completion + 800 thinking (in the total only)
    upstream.control(prompt_tokens=1000, completion_tokens=200, thoughts_tokens=800, cached_tokens=400)

    gpt(gateway).chat.completions.create(
        model="flash-vertex", messages=[{"role": "user", "content": "think"}], max_tokens=2000
    )

    seen = upstream.last(OPENAPI)
    assert seen["body"]["model"] == "google/gemini-2.5-flash"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.input_tokens, rec.cache_read_tokens, rec.output_tokens) == (600, 400, 1000)
    assert rec.cost_nano == 600 * 300 + 400 * 30 + 1000 * 2_500


def test_a_gemini_stream_is_recorded_from_its_usage_chunk(gateway, vertex, upstream):
    upstream.control(prompt_tokens=10, completion_tokens=20, thoughts_tokens=30)

    chunks = list(
        gpt(gateway).chat.completions.create(
            model="flash-vertex", stream=True, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
    )

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    wait_settled()
    assert UsageRecord.objects.get().cost_nano == 10 * 300 + 50 * 2_500


def test_requests_over_the_cap_are_refused_before_vertex_sees_them(gateway, wired, vertex, upstream, slices_mode):
    wired.budget(amount="0.001")
    before = upstream.stats()["requests"]

    with pytest.raises(anthropic.APIStatusError) as refused:
        claude(gateway).messages.create(
            model="claude-vertex", max_tokens=300, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.APIStatusError) as refused_chat:
        gpt(gateway).chat.completions.create(
            model="flash-vertex", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
        )

    assert refused.value.status_code == refused_chat.value.status_code == 402
    assert upstream.stats()["requests"] == before and upstream.stats()["token_grants"] == 0
    assert not UsageRecord.objects.exists()


# --- Google's regional premium: Claude off the global endpoint is billed 10% above it ------------

# Google's prices for Claude Sonnet 5.5 per 1M tokens (tests/catalog/data/published_prices.json):
# $2 / $10 on the global endpoint, the catalog's price; $2.20 / $11 on a regional one.
SONNET_55 = "claude-sonnet-5-5"


def _sonnet_on(wired, upstream, *, region: str, route: str = "sonnet") -> str:
    """A Vertex connection in `region` and a route `route` to google/claude-sonnet-5-5."""
    google, _ = Provider.objects.get_or_create(slug="google", defaults={"name": "Google"})
    sonnet, _ = Model.objects.get_or_create(
        provider=google,
        name=SONNET_55,
        defaults={"input_usd_per_mtok": Decimal(2), "output_usd_per_mtok": Decimal(10), "max_output_tokens": 64000},
    )
    conn = create_connection(
        organization=wired.org,
        actor=APPLY,
        name=f"vx-{region}",
        kind="vertex",
        base_url=upstream.url,
        secret=json.dumps(new_service_account(upstream.url + "/token", project=PROJECT)),
        options={"project": PROJECT, "region": region, "forward_test_headers": True},
    )
    wired.route(route, conn, model=sonnet)
    return route


def test_a_regional_connection_reserves_and_records_claude_with_googles_premium(gateway, wired, upstream, slices_mode):
    # given: the same Claude model through us-east5 and through the global endpoint
    # (route names of one length: the same body, so the same token bound)
    _sonnet_on(wired, upstream, region=REGION, route="sonnet-r")
    _sonnet_on(wired, upstream, region="global", route="sonnet-g")
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    # when
    for route in ("sonnet-r", "sonnet-g"):
        claude(gateway).messages.create(model=route, max_tokens=300, messages=[{"role": "user", "content": "hi"}])

    # then: each went to its own location, recorded at that location's price
    for region in (REGION, "global"):
        path = f"/v1/projects/{PROJECT}/locations/{region}/publishers/anthropic/models/{SONNET_55}:rawPredict"
        assert upstream.last(path)
    wait_settled()
    regional, global_ = (UsageRecord.objects.get(model=route) for route in ("sonnet-r", "sonnet-g"))
    assert regional.cost_nano == 1000 * 2_200 + 200 * 11_000  # $2.20 and $11 per 1M
    assert global_.cost_nano == 1000 * 2_000 + 200 * 10_000  # $2 and $10 per 1M
    # and the reservation carries the premium too
    assert regional.reserved_nano == -(-global_.reserved_nano * 11 // 10)


def _over_a_cap_the_premium_decides(wired, upstream):
    """A $0.105 cap and a request that may write 10,000 output tokens: at most $0.10 and a little
    for "hi" at the global price, fitting the cap; $0.11 and a little at us-east5's, not fitting
    it. Vertex answers with 10 input and all 10,000 output tokens."""
    route = _sonnet_on(wired, upstream, region=REGION)
    wired.budget(amount="0.105")
    upstream.control(prompt_tokens=10, completion_tokens=10_000)
    return route


def test_a_blocking_cap_refuses_a_regional_request_whose_worst_case_with_the_premium_exceeds_it(
    gateway, wired, upstream
):
    route = _over_a_cap_the_premium_decides(wired, upstream)

    with pytest.raises(anthropic.APIStatusError) as refused:
        claude(gateway).messages.create(model=route, max_tokens=10_000, messages=[{"role": "user", "content": "hi"}])

    assert refused.value.status_code == 402
    assert upstream.stats()["requests"] == 0  # Vertex billed nothing: the cap holds
    assert not UsageRecord.objects.exists()


def test_premium_guard_removed_lets_google_bill_a_blocking_cap_over(gateway, wired, upstream, monkeypatch):
    # The removal test of the one above: priced at the global rate, the request's worst case fits
    # the cap and is admitted, and Google bills what the regional endpoint costs.
    from catalog import pricing

    monkeypatch.setattr(pricing.GUARDS, "price_regional_premium", False)
    route = _over_a_cap_the_premium_decides(wired, upstream)
    cap = 105_000_000

    claude(gateway).messages.create(model=route, max_tokens=10_000, messages=[{"role": "user", "content": "hi"}])

    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.reserved_nano <= cap and rec.cost_nano == 10 * 2_000 + 10_000 * 10_000  # the books: within the cap
    googles_bill = 10 * 2_200 + 10_000 * 11_000  # $2.20 and $11 per 1M, us-east5
    assert googles_bill > cap  # what the organization pays: over its blocking cap
    assert rec.reserved_nano < googles_bill  # the reservation itself fell short


def test_a_key_google_refuses_to_exchange_is_not_billed(gateway, vertex, upstream):
    # given: a well-formed key Google does not know (its public half was never registered)
    unknown = new_service_account(upstream.url + "/token", project=PROJECT)
    unknown["private_key_id"] = "0" * 40
    Connection.objects.filter(pk=vertex.pk).update(secret=json.dumps(unknown))

    with pytest.raises(anthropic.APIStatusError) as failed:
        claude(gateway).messages.create(
            model="claude-vertex", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )

    assert failed.value.status_code == 502
    assert upstream.stats()["requests"] == 0
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("failed_upstream", 0)


@pytest.mark.parametrize(
    "options, secret, fragment",
    [
        ({"region": REGION}, "{}", "options.project"),
        ({"project": PROJECT, "region": "us east"}, "{}", "options.region"),
        ({"project": PROJECT, "region": REGION}, '{"type": "authorized_user"}', "service account"),
        ({"project": PROJECT, "region": REGION}, '{"type": "service_account"}', "not a usable service account key"),
    ],
)
def test_bad_vertex_options_or_keys_are_refused_and_nothing_is_created(wired, options, secret, fragment):
    with pytest.raises(InvalidChange, match=fragment):
        create_connection(
            organization=wired.org, actor=APPLY, name="bad", kind="vertex", options=options, secret=secret
        )
    assert not Connection.objects.filter(name="bad").exists()


def _fetch_token(target) -> str:
    """One token fetch on a fresh event loop, leaving no upstream client bound to it."""
    import asyncio

    from gateway.providers.vertex import tokens
    from gateway.upstream import transport

    async def fetch() -> str:
        try:
            return await tokens.token(target)
        finally:
            await transport.close_client()

    return asyncio.run(fetch())


def test_the_token_request_is_held_to_the_destination_rules(wired, upstream, settings):
    from gateway.admission.routing import Target
    from gateway.providers.vertex import TokenUnavailable

    # given: a key whose token_uri names a loopback address, on a deployment that allows none
    upstream.reset()
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    conn = Connection(
        id=10_001,
        organization=wired.org,
        kind="vertex",
        secret=json.dumps(new_service_account(upstream.url + "/token")),
        options={"project": PROJECT, "region": REGION},
    )
    # when / then: refused before any request is sent (not billed: the next target is tried)
    with pytest.raises(TokenUnavailable, match="not allowed"):
        _fetch_token(Target(connection=conn, model=wired.model))
    assert upstream.stats()["token_grants"] == 0


def test_token_guard_removed_lets_a_tenant_key_reach_an_internal_address(wired, upstream, settings, monkeypatch):
    # The removal test of the one above: google-auth's own requests transport dials the key's
    # token_uri wherever it points, and the loopback fake hands out a token.
    import google.auth.transport.requests

    from gateway.admission.routing import Target
    from gateway.providers import vertex_auth

    upstream.reset()
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    monkeypatch.setattr(vertex_auth, "LoopRequest", lambda loop: google.auth.transport.requests.Request())
    conn = Connection(
        id=10_002,
        organization=wired.org,
        kind="vertex",
        secret=json.dumps(new_service_account(upstream.url + "/token")),
        options={"project": PROJECT, "region": REGION},
    )
    assert _fetch_token(Target(connection=conn, model=wired.model)).startswith("ya29.fake-")
    assert upstream.stats()["token_grants"] == 1
