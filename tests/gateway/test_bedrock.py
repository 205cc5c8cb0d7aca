"""A Bedrock connection: capgate signs each call with SigV4 (the fake verifies the signature with
botocore), sends Claude's Messages body to InvokeModel with the model id in the path, relays the
AWS event stream to the client as Anthropic SSE, records each request at its cost, and refuses it
at the cap before Bedrock sees it. The fake is checked with boto3 and AnthropicBedrock in
tests/upstream/test_bedrock.py."""

from __future__ import annotations

import json

import anthropic
import pytest

from catalog.models import Connection
from catalog.services import create_connection
from core.errors import InvalidChange
from gateway.providers.bedrock import BedrockStreamUsage
from ledger.models import UsageRecord
from tenants.audit import APPLY
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.bedrock import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.django_db(transaction=True)

MODEL_ID = "anthropic.claude-sonnet-4-5-20250929-v1:0"
INVOKE = f"/model/{MODEL_ID}/invoke"
STREAM = f"/model/{MODEL_ID}/invoke-with-response-stream"
KEYS = json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY})


@pytest.fixture
def bedrock(wired, upstream) -> Connection:
    """`claude-bedrock` routes to the catalog model echo-1 ($15 / $75 per 1M), called on Bedrock
    by its in-region model id for Claude Sonnet 4.5: billed 10% above the global price, $16.50 /
    $82.50."""
    conn = create_connection(
        organization=wired.org,
        actor=APPLY,
        name="br",
        kind="bedrock",
        base_url=upstream.url,
        secret=KEYS,
        options={"region": "us-east-1", "model_ids": {"echo-1": MODEL_ID}, "forward_test_headers": True},
    )
    wired.route("claude-bedrock", conn)
    return conn


def client(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def test_a_request_is_signed_sent_to_invoke_model_and_recorded_at_its_cost(gateway, bedrock, upstream, slices_mode):
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    reply = client(gateway).messages.create(
        model="claude-bedrock", max_tokens=300, messages=[{"role": "user", "content": "hi"}]
    )

    assert reply.content[0].text and reply.usage.input_tokens == 1000
    seen = upstream.last(INVOKE)  # the fake verified the SigV4 signature before answering
    assert seen["headers"]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    assert "/us-east-1/bedrock/aws4_request" in seen["headers"]["authorization"]
    assert seen["body"]["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in seen["body"] and "stream" not in seen["body"]
    wait_settled()
    rec = UsageRecord.objects.get()
    # 1000 in at $16.50/M + 200 out at $82.50/M
    assert (rec.status, rec.cost_nano, rec.connection_id) == ("served", 16_500_000 + 16_500_000, bedrock.id)


def test_the_event_stream_is_relayed_as_anthropic_sse_and_recorded(gateway, bedrock, upstream, slices_mode):
    upstream.control(prompt_tokens=10, completion_tokens=20)

    with client(gateway).messages.stream(
        model="claude-bedrock", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()

    assert text and final.usage.output_tokens == 20
    assert "stream" not in upstream.last(STREAM)["body"]
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 10, 20)
    assert rec.cost_nano == 10 * 16_500 + 20 * 82_500


def test_betas_go_in_the_body_as_bedrock_takes_them(gateway, bedrock, upstream):
    client(gateway).messages.create(
        model="claude-bedrock",
        max_tokens=10,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"anthropic-beta": "context-1m-2025-08-07"},
    )
    assert upstream.last(INVOKE)["body"]["anthropic_beta"] == ["context-1m-2025-08-07"]


def test_a_request_over_the_cap_is_refused_before_bedrock_sees_it(gateway, wired, bedrock, upstream, slices_mode):
    wired.budget(amount="0.01")  # 300 output tokens at $75/M alone is $0.0225
    before = upstream.stats()["requests"]

    with pytest.raises(anthropic.APIStatusError) as refused:
        client(gateway).messages.create(
            model="claude-bedrock", max_tokens=300, messages=[{"role": "user", "content": "hi"}]
        )

    assert refused.value.status_code == 402 and "organization_budget" in str(refused.value.body)
    assert upstream.stats()["requests"] == before
    assert not UsageRecord.objects.exists()


def test_a_signature_bedrock_refuses_is_not_billed(gateway, bedrock, upstream):
    # given: keys Bedrock does not accept
    Connection.objects.filter(pk=bedrock.pk).update(
        secret=json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": "wrong"})
    )

    with pytest.raises(anthropic.APIStatusError):
        client(gateway).messages.create(
            model="claude-bedrock", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )

    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.cost_nano) == ("failed_upstream", 0)


def test_a_stream_without_usage_events_is_priced_from_the_invocation_metrics():
    tracker = BedrockStreamUsage("messages")
    tracker.feed(json.dumps({"type": "message_start", "message": {"model": MODEL_ID}}).encode())
    stop = {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 7, "outputTokenCount": 3}}
    tracker.feed(json.dumps(stop).encode())
    assert tracker.usage is not None
    assert (tracker.usage.input_tokens, tracker.usage.output_tokens) == (7, 3)


@pytest.mark.parametrize(
    "options, secret, fragment",
    [
        ({}, KEYS, "options.region"),
        ({"region": "us-east-1/../x"}, KEYS, "options.region"),
        ({"region": "us-east-1"}, '{"access_key_id": "AKID"}', "secret_access_key"),
        # a model id goes into the URL's path
        ({"region": "us-east-1", "model_ids": {"echo-1": "../../admin"}}, KEYS, "options.model_ids"),
        # The gateway's own AWS credentials are the operator's: not lent unless allowed.
        ({"region": "us-east-1"}, "", "does not lend its own AWS credentials"),
    ],
)
def test_bad_bedrock_options_or_keys_are_refused_and_nothing_is_created(wired, options, secret, fragment):
    with pytest.raises(InvalidChange, match=fragment):
        create_connection(
            organization=wired.org, actor=APPLY, name="bad", kind="bedrock", options=options, secret=secret
        )
    assert not Connection.objects.filter(name="bad").exists()


def test_the_credential_chain_is_used_where_the_operator_allows_it(wired, settings, monkeypatch):
    import asyncio

    from gateway.admission.routing import Target
    from gateway.providers import bedrock as adapter

    settings.CAPGATE = {**settings.CAPGATE, "BEDROCK_AMBIENT_CREDENTIALS": True}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMTHECHAIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "chain-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    adapter._chain.cache_clear()
    conn = create_connection(
        organization=wired.org, actor=APPLY, name="chain", kind="bedrock", options={"region": "eu-west-1"}
    )
    up = asyncio.run(
        adapter.Bedrock().request(Target(connection=conn, model=wired.model), "messages", {}, {}, stream=False)
    )
    adapter._chain.cache_clear()
    assert "Credential=AKIDFROMTHECHAIN/" in up.headers["Authorization"]
    assert up.url == "https://bedrock-runtime.eu-west-1.amazonaws.com/model/echo-1/invoke"


def test_a_stored_connection_without_keys_is_not_signed_with_the_gateways_credentials(wired, monkeypatch):
    import asyncio

    from gateway.admission.routing import Target
    from gateway.providers import bedrock as adapter

    # given: the gateway has AWS credentials in its environment, and a connection saved without keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDOFTHEOPERATOR")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    adapter._chain.cache_clear()
    conn = Connection(organization=wired.org, kind="bedrock", secret="", options={"region": "us-east-1"})
    # when / then: nothing is signed or sent (a connect error: not billed, the next target is tried)
    with pytest.raises(adapter.CredentialsMissing):
        asyncio.run(
            adapter.Bedrock().request(Target(connection=conn, model=wired.model), "messages", {}, {}, stream=False)
        )
    adapter._chain.cache_clear()


@pytest.fixture
def keyless(wired, upstream, monkeypatch) -> str:
    """A tenant's Bedrock connection stored without keys (saved while this deployment lent its
    credentials, or written past the save check), on a gateway whose environment holds the
    operator's AWS keys (the fake accepts them: they are the operator's account). Lending is off."""
    from gateway.providers import bedrock as adapter

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    adapter._chain.cache_clear()
    conn = Connection.objects.create(
        organization=wired.org,
        name="keyless",
        kind="bedrock",
        base_url=upstream.url,
        secret="",
        options={"region": "us-east-1", "model_ids": {"echo-1": MODEL_ID}, "forward_test_headers": True},
    )
    wired.route("claude-keyless", conn)
    yield "claude-keyless"
    adapter._chain.cache_clear()


def test_a_keyless_connection_is_not_served_on_the_operators_credentials(gateway, keyless, upstream, settings):
    assert settings.CAPGATE["BEDROCK_AMBIENT_CREDENTIALS"] is False

    with pytest.raises(anthropic.APIStatusError) as failed:
        client(gateway).messages.create(model=keyless, max_tokens=20, messages=[{"role": "user", "content": "hi"}])

    # then: nothing was signed or sent to Bedrock, and the request is not billed
    assert failed.value.status_code == 502
    assert upstream.stats()["requests"] == 0
    wait_settled()
    assert list(UsageRecord.objects.values_list("status", "cost_nano")) == [("failed_upstream", 0)]


def test_ambient_guard_removed_signs_a_tenants_connection_with_the_operators_credentials(
    gateway, keyless, upstream, monkeypatch
):
    # The removal test of the one above: with lending off in settings but the check gone, the
    # tenant's connection falls through to botocore's chain and Bedrock serves it on the
    # operator's account.
    from gateway.providers import bedrock as adapter

    monkeypatch.setattr(adapter.GUARDS, "lend_only_where_allowed", False)
    upstream.control(prompt_tokens=10, completion_tokens=5)

    reply = client(gateway).messages.create(model=keyless, max_tokens=20, messages=[{"role": "user", "content": "hi"}])

    assert reply.content[0].text
    seen = upstream.last(INVOKE)  # the fake verified the signature: the operator's key signed it
    assert seen["headers"]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    wait_settled()
    assert UsageRecord.objects.get().status == "served"


@pytest.mark.parametrize("premium", [True, False], ids=["priced", "premium-guard-removed"])
def test_a_geographic_profile_is_recorded_at_the_regional_price_and_global_at_the_global_one(
    gateway, wired, upstream, monkeypatch, premium
):
    # given: echo-1 ($15 / $75 per 1M, a global price) called by the us. and the global. profile
    # ids of Claude Sonnet 4.5; AWS bills the us. one 10% above the global one
    from catalog import pricing

    monkeypatch.setattr(pricing.GUARDS, "price_regional_premium", premium)
    for geo in ("us", "global"):
        conn = create_connection(
            organization=wired.org,
            actor=APPLY,
            name=f"br-{geo}",
            kind="bedrock",
            base_url=upstream.url,
            secret=KEYS,
            options={"region": "us-east-1", "model_ids": {"echo-1": f"{geo}.{MODEL_ID}"}, "forward_test_headers": True},
        )
        wired.route(f"sonnet-{geo}", conn)
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    # when
    for geo in ("us", "global"):
        client(gateway).messages.create(
            model=f"sonnet-{geo}", max_tokens=300, messages=[{"role": "user", "content": "hi"}]
        )

    # then: the global profile at the global price either way; the us. one at AWS's regional price,
    # and below it (under-recorded, under-reserved) without the premium
    wait_settled()
    cost = dict(UsageRecord.objects.values_list("model", "cost_nano"))
    assert cost["sonnet-global"] == 15_000_000 + 15_000_000
    aws_bill = 16_500_000 + 16_500_000
    assert (cost["sonnet-us"] == aws_bill) is premium and cost["sonnet-us"] <= aws_bill
