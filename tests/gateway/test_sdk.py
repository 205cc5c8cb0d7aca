"""Users keep the official SDKs and change base_url: the gateway must speak both dialects."""

import anthropic
import httpx
import openai
import pytest

from ledger.models import Reservation, UsageRecord, Window
from tests.conftest import usd
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)


def oa(gateway, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, **kw)


def test_openai_sdk_chat_through_capgate_to_an_openai_upstream(gateway, wired, upstream):
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    reply = oa(gateway).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}], max_tokens=300
    )
    assert reply.choices[0].message.content
    assert reply.usage.prompt_tokens == 1000
    wait_settled()
    rec = UsageRecord.objects.get()
    # 1000 in at $15/M + 200 out at $75/M
    assert (rec.status, rec.cost_nano, rec.connection_id) == ("served", 15_000_000 + 15_000_000, wired.openai.id)
    assert upstream.last("/v1/chat/completions")["headers"]["authorization"] == "Bearer sk-up"


def test_openai_sdk_stream_gets_usage_recorded_without_asking_for_it(gateway, wired, upstream):
    upstream.control(prompt_tokens=10, completion_tokens=20)
    stream = oa(gateway).chat.completions.create(
        model="gpt-test", stream=True, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert all(c.usage is None for c in chunks)  # the client did not ask for the usage chunk
    forwarded = upstream.last("/v1/chat/completions")["body"]
    assert forwarded["stream_options"] == {"include_usage": True}
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 10, 20)


def test_openai_stream_that_asked_for_usage_still_gets_it(gateway, wired, upstream):
    upstream.control(prompt_tokens=10, completion_tokens=20)
    chunks = list(
        oa(gateway).chat.completions.create(
            model="gpt-test",
            stream=True,
            max_tokens=50,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "hi"}],
        )
    )
    assert chunks[-1].usage.completion_tokens == 20


def test_anthropic_sdk_messages_and_stream(gateway, wired, upstream):
    upstream.control(prompt_tokens=100, completion_tokens=40)
    client = anthropic.Anthropic(base_url=gateway.url, api_key=KEY)
    msg = client.messages.create(model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert msg.usage.output_tokens == 40
    assert upstream.last("/v1/messages")["headers"]["x-api-key"] == "sk-ant-up"
    with client.messages.stream(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 40
    wait_settled()
    assert sorted(UsageRecord.objects.values_list("status", "output_tokens")) == [("served", 40), ("served", 40)]
    assert all(r.cost_nano == 100 * 15_000 + 40 * 75_000 for r in UsageRecord.objects.all())


def test_echo_route_embeddings_and_models(gateway, wired):
    client = oa(gateway)
    assert (
        client.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": "x"}], max_tokens=5)
        .choices[0]
        .message.content
        == "echo"
    )
    wired.route("embed", wired.echo)
    emb = client.embeddings.create(model="embed", input=["a", "b"])
    assert len(emb.data) == 2
    assert sorted(m.id for m in client.models.list()) == ["claude-test", "echo-1", "embed", "gpt-test"]
    wait_settled()
    assert UsageRecord.objects.filter(status="served").count() == 2


def test_a_budget_refusal_is_a_402_the_sdk_does_not_retry(gateway, wired):
    wired.budget(amount="0.000001")
    sent = []
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(r)]})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=3, http_client=http)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    assert err.value.status_code == 402
    assert len(sent) == 1  # not retried
    body = err.value.body
    assert (body["type"], body["code"]) == ("budget_exceeded", "organization_budget")
    headers = err.value.response.headers
    assert headers["x-capgate-budget-code"] == "organization_budget"
    assert headers["x-capgate-budget-remaining-usd"] == "0.000001000"
    assert headers["x-capgate-request-id"].startswith("req_")
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()
    # Anthropic shape on /v1/messages
    r = httpx.post(
        gateway.url + "/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "echo-1", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 402
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "budget_exceeded"


def test_output_ceiling_is_what_the_budget_affords_and_is_sent_upstream(gateway, wired, upstream):
    # given: a $0.05 cap and no max_tokens: 0.05 USD at $75/M output affords ~666 tokens
    budget = wired.budget(amount="0.05")
    upstream.control(completion_tokens="max")
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text
    sent = upstream.last("/v1/chat/completions")["body"]["max_completion_tokens"]
    assert 600 < sent < 667
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.output_tokens == sent and rec.excess_nano == 0
    assert Window.objects.get(budget=budget).spent_nano <= usd("0.05")
    # when the remaining room affords less than the floor (256 tokens), it refuses
    budget.amount_nano = rec.cost_nano + 256 * 75_000 - 1
    budget.save()
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 402 and r.json()["error"]["code"] == "organization_budget"
