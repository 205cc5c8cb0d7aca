"""A Bedrock connection speaking the Converse API (`options.api: "converse"`, for Llama, Mistral,
Nova and the other Bedrock models) serves both client formats: the official OpenAI SDK (chat,
streamed and not, with tools and an image) and the official Anthropic SDK (messages, streamed
and not, with tools), through a live capgate. The fake speaks Converse as boto3 reads it
(tests/upstream/test_converse.py) and verifies each call's SigV4 signature; what it received is
checked, and each request is recorded at the model's prices, cache reads and writes included."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from catalog.models import Connection
from catalog.services import create_connection
from core.errors import InvalidChange
from core.money import usd_to_nano
from gateway.admission.bounds import shape_messages
from gateway.translate import translate_request
from ledger.models import Reservation, UsageRecord
from tenants.audit import APPLY
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.bedrock import ACCESS_KEY, SECRET_KEY
from tests.upstream.server import TOOL_ARGUMENTS, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

MODEL_ID = "meta.llama3-3-70b-instruct-v1:0"
CONVERSE = f"/model/{MODEL_ID}/converse"
STREAM = f"/model/{MODEL_ID}/converse-stream"
KEYS = json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY})
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}}},
}
# The model (echo-1): $15 in, $75 out, $1.50 cache reads, $18.75 cache writes per 1M tokens,
# i.e. 15,000 / 75,000 / 1,500 / 18,750 nano-USD per token.
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "cached_tokens": 300, "cache_write_tokens": 100}
COST = 1000 * 15_000 + 200 * 75_000 + 300 * 1_500 + 100 * 18_750


def _converse_connection(wired, url: str, name: str = "brc") -> Connection:
    return create_connection(
        organization=wired.org,
        actor=APPLY,
        name=name,
        kind="bedrock",
        base_url=url,
        secret=KEYS,
        options={
            "region": "us-east-1",
            "api": "converse",
            "model_ids": {"echo-1": MODEL_ID},
            "forward_test_headers": True,
        },
    )


@pytest.fixture
def converse(wired, upstream) -> Connection:
    """`llama` routes to echo-1 on a Converse connection of the fake."""
    conn = _converse_connection(wired, upstream.url)
    wired.route("llama", conn)
    return conn


def _openai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def _anthropic(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def _chat_request() -> dict:
    return {
        "model": "llama",
        "max_tokens": 300,
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather where this photo was taken?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
        ],
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
        "stop": "END",
    }


def _recorded(connection: Connection) -> UsageRecord:
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id) == ("served", connection.id), rec.error
    assert (rec.input_tokens, rec.output_tokens, rec.cache_read_tokens, rec.cache_write_tokens) == (1000, 200, 300, 100)
    assert rec.cost_nano == COST
    return rec


def _sent_chat_body(body: dict) -> None:
    """What a Converse target gets for _chat_request()."""
    assert "model" not in body and "stream" not in body  # the path says both
    assert body["system"] == [{"text": "Answer briefly."}]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"text": "What is the weather where this photo was taken?"},
                {"image": {"format": "png", "source": {"bytes": PNG}}},
            ],
        }
    ]
    assert body["inferenceConfig"] == {"maxTokens": 300, "temperature": 0.2, "stopSequences": ["END"]}
    spec = {
        "name": "get_weather",
        "inputSchema": {"json": WEATHER["parameters"]},
        "description": WEATHER["description"],
    }
    assert body["toolConfig"] == {"tools": [{"toolSpec": spec}], "toolChoice": {"any": {}}}


def test_openai_sdk_is_served_by_a_converse_target(gateway, wired, upstream, converse):
    upstream.control(**USAGE, tool_call=True)
    # when
    reply = _openai(gateway).chat.completions.create(**_chat_request())
    # then: a chat completion with the tool call and the usage (the prompt counts cached tokens)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content.startswith("The quick")
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1400, 200)
    assert reply.usage.prompt_tokens_details.cached_tokens == 300
    # and the fake got a signed Converse request (it verified the signature and the service model)
    sent = upstream.last(CONVERSE)
    assert sent["headers"]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    _sent_chat_body(sent["body"])
    _recorded(converse)


def test_openai_sdk_stream_is_served_by_a_converse_target(gateway, wired, upstream, converse):
    upstream.control(**USAGE, tool_call=True)
    chunks = list(
        _openai(gateway).chat.completions.create(**_chat_request(), stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The quick brown fox")
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == TOOL_ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (1400, 200)
    _sent_chat_body(upstream.last(STREAM)["body"])
    _recorded(converse)


def _messages_request() -> dict:
    return {
        "model": "llama",
        "max_tokens": 300,
        "system": [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "text", "text": "And now?"},
                ],
            },
        ],
        "tools": [
            {"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
        ],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "stop_sequences": ["END"],
    }


def _sent_messages_body(body: dict) -> None:
    assert body["system"] == [{"text": "Answer briefly."}, {"cachePoint": {"type": "default"}}]
    assert body["messages"] == [
        {"role": "user", "content": [{"text": "What is the weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}}],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "toolu_1", "content": [{"text": "sunny"}]}},
                {"image": {"format": "png", "source": {"bytes": PNG}}},
                {"text": "And now?"},
            ],
        },
    ]
    assert body["inferenceConfig"] == {"maxTokens": 300, "stopSequences": ["END"]}
    assert body["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}


def test_anthropic_sdk_is_served_by_a_converse_target(gateway, wired, upstream, converse):
    upstream.control(**USAGE, tool_call=True)
    reply = _anthropic(gateway).messages.create(**_messages_request())
    assert reply.stop_reason == "tool_use"
    assert reply.content[0].type == "text" and reply.content[0].text.startswith("The quick")
    use = reply.content[1]
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", TOOL_ARGUMENTS)
    usage = reply.usage
    assert (usage.input_tokens, usage.output_tokens) == (1000, 200)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (300, 100)
    _sent_messages_body(upstream.last(CONVERSE)["body"])
    _recorded(converse)


def test_anthropic_sdk_stream_is_served_by_a_converse_target(gateway, wired, upstream, converse):
    upstream.control(**USAGE, tool_call=True)
    with _anthropic(gateway).messages.stream(**_messages_request()) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert final.content[0].text.startswith("The quick brown fox")
    assert (final.content[1].name, final.content[1].input) == ("get_weather", TOOL_ARGUMENTS)
    assert (final.usage.output_tokens, final.usage.cache_read_input_tokens) == (200, 300)
    _sent_messages_body(upstream.last(STREAM)["body"])
    _recorded(converse)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_exhausted_blocking_cap_refuses_before_bedrock_sees_it(gateway, wired, upstream, converse, stream):
    wired.budget(amount="0.01")  # 300 output tokens at $75/M alone is $0.0225
    with pytest.raises(openai.APIStatusError) as refused:
        _openai(gateway).chat.completions.create(**_chat_request(), stream=stream)
    assert refused.value.status_code == 402 and "organization_budget" in str(refused.value.body)
    with pytest.raises(anthropic.APIStatusError) as also:
        _anthropic(gateway).messages.create(**{**_messages_request(), "stream": stream})
    assert also.value.status_code == 402
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists()


def test_the_bound_is_the_converse_body_with_max_tokens_injected(gateway, wired, upstream, converse):
    # given: a cap, and a request that names no output ceiling
    wired.budget(amount="5")
    upstream.control(prompt_tokens=10, completion_tokens=5)
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "llama", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    # then: the ceiling the worst case assumed was sent in inferenceConfig.maxTokens
    config = upstream.last(CONVERSE)["body"]["inferenceConfig"]
    assert isinstance(config["maxTokens"], int) and 0 < config["maxTokens"] <= 4096
    reserved = r.headers["x-capgate-reserved-usd"]
    wait_settled()
    assert UsageRecord.objects.get().cost_nano == 10 * 15_000 + 5 * 75_000
    assert float(reserved) >= config["maxTokens"] * 75 / 1_000_000


@pytest.fixture
def broken():
    handle = run_in_thread()
    handle.control(fail="503")
    yield handle
    handle.stop()


@pytest.mark.parametrize("kind", ["chat", "messages"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("failure", ["503", "429"], ids=["ServiceUnavailable", "Throttling"])
def test_failover_from_a_failing_converse_target_is_counted_once(
    gateway, wired, upstream, broken, slices_mode, kind, stream, failure
):
    # given: a cap; the first target, a Converse connection, answers ServiceUnavailableException
    # or ThrottlingException (both retryable); the second is the endpoint's own format
    broken.control(fail=failure)
    budget = wired.budget(amount="5")
    failing = _converse_connection(wired, broken.url, name="broken-converse")
    healthy = wired.openai if kind == "chat" else wired.anthropic
    route = wired.route("cross", failing)
    route.targets.create(connection=healthy, model=wired.model, position=1)
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    path, auth = ("/v1/chat/completions", "authorization") if kind == "chat" else ("/v1/messages", "x-api-key")
    body = {"model": "cross", "max_tokens": 300, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    value = f"Bearer {KEY}" if kind == "chat" else KEY
    r = httpx.post(gateway.url + path, headers={auth: value}, json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert broken.stats()["requests"] == 1  # the Converse target was tried once
    wait_settled()
    rec = UsageRecord.objects.get()  # one record, at the target that served it
    assert (rec.status, rec.connection_id, rec.cost_nano) == ("served", healthy.id, 1000 * 15_000 + 200 * 75_000)
    assert window_of(budget).spent_nano == rec.cost_nano and window_of(budget).reserved_nano == 0


@pytest.mark.parametrize(
    ("kind", "extra", "field"),
    [
        ("chat", {"seed": 7}, "seed"),
        ("chat", {"tool_choice": "none", "tools": [{"type": "function", "function": WEATHER}]}, "tool_choice"),
        ("chat", {"temperature": 1.5}, "temperature"),
        ("messages", {"top_k": 5}, "top_k"),
        ("messages", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ("chat", {"reasoning_effort": "minimal"}, "reasoning_effort"),
    ],
)
def test_an_untranslatable_field_is_refused_naming_it(gateway, wired, upstream, converse, kind, extra, field):
    path, headers = (
        ("/v1/chat/completions", {"authorization": f"Bearer {KEY}"})
        if kind == "chat"
        else ("/v1/messages", {"x-api-key": KEY})
    )
    body = {"model": "llama", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = httpx.post(gateway.url + path, headers=headers, json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if kind == "chat":
        assert (error["code"], error["param"]) == ("untranslatable_field", field)
    else:
        assert error["type"] == "invalid_request_error" and f"'{field}'" in error["message"]
    assert "Bedrock Converse" in error["message"]
    assert upstream.stats()["requests"] == 0


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_a_converse_validation_error_is_answered_in_the_endpoints_shape(gateway, wired, upstream, converse, kind):
    upstream.control(fail="400")
    if kind == "chat":
        with pytest.raises(openai.BadRequestError) as bad:
            _openai(gateway).chat.completions.create(
                model="llama", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        assert bad.value.body["message"] == "fake upstream 400" and bad.value.body["type"] == "invalid_request_error"
    else:
        with pytest.raises(anthropic.BadRequestError) as refused:
            _anthropic(gateway).messages.create(
                model="llama", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.body["error"] == {"type": "invalid_request_error", "message": "fake upstream 400"}
    wait_settled()
    assert UsageRecord.objects.get().status == "failed_upstream"


def test_the_api_option_is_checked(wired, upstream):
    with pytest.raises(InvalidChange) as wrong:
        create_connection(
            organization=wired.org,
            actor=APPLY,
            name="x",
            kind="bedrock",
            base_url=upstream.url,
            secret=KEYS,
            options={"region": "us-east-1", "api": "invoke-model"},
        )
    assert "options.api" in str(wrong.value)


def test_an_image_by_url_is_refused_for_converse(gateway, wired, upstream, converse):
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "llama", "max_tokens": 10, "messages": [{"role": "user", "content": content}]},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]"
    assert upstream.stats()["requests"] == 0


@pytest.mark.parametrize("guarded", [True, False], ids=["metadata-usage", "removed"])
def test_a_converse_stream_is_billed_from_its_metadata_event(gateway, wired, upstream, converse, monkeypatch, guarded):
    if not guarded:  # the removal: the stream followed by the base tracker, which knows no Converse event
        from gateway.providers import bedrock_converse
        from gateway.providers.usage import StreamUsage

        monkeypatch.setattr(
            bedrock_converse.BedrockConverse, "stream_usage", lambda self, endpoint: StreamUsage(endpoint)
        )
    wired.budget(amount="5")
    upstream.control(**USAGE)
    chunks = list(
        _openai(gateway).chat.completions.create(
            model="llama", max_tokens=300, stream=True, messages=[{"role": "user", "content": "hi"}]
        )
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    wait_settled()
    rec = UsageRecord.objects.get()
    if not guarded:  # without it the usage is never read: charged at the worst case, not the cost
        assert rec.status == "estimated" and rec.cost_nano != COST
        return
    assert (rec.status, rec.cost_nano) == ("served", COST)


def test_a_converse_stream_without_its_metadata_is_charged_at_the_worst_case(gateway, wired, upstream, converse):
    wired.budget(amount="5")
    upstream.control(fail="no_usage")
    r = httpx.post(
        gateway.url + "/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "llama", "max_tokens": 300, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    # the stream stopped (messageStop) but never said what it used: closed for the client,
    # charged at what was reserved
    assert r.status_code == 200 and "event: message_stop" in r.text
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == usd_to_nano(r.headers["x-capgate-reserved-usd"])


@pytest.mark.parametrize("guarded", [True, False], ids=["bound-on-converse", "removed"])
def test_the_worst_case_is_the_converse_body(gateway, wired, upstream, converse, slices_mode, monkeypatch, guarded):
    # given: a messages request whose Converse translation is bigger than the client's body
    # (each tool result's content becomes a list of text blocks, each tool a toolSpec)
    if not guarded:  # the removal: Converse targets bounded on the client's own body
        from gateway.admission import sizing

        def client_shape_only(shape, targets, translation):
            translation("converse")
            return {}, targets

        monkeypatch.setattr(sizing, "_translate", client_shape_only)
    wired.budget(amount="5")
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"} for i in range(40)]
    uses = [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}} for i in range(40)]
    body = {
        "model": "llama",
        "max_tokens": 100,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ],
    }
    own = shape_messages(body).text_tokens
    translated = translate_request(kind="messages", body=body, headers={}, target="converse").shape.text_tokens
    assert translated > own  # the case the bound must follow
    r = httpx.post(gateway.url + "/v1/messages", headers={"x-api-key": KEY}, json=body, timeout=30)
    assert r.status_code == 200, r.text
    if not guarded:  # without the guard, the reservation falls short of the body that was sent
        assert int(r.headers["x-capgate-reserved-input-tokens"]) == own < translated
        return
    assert int(r.headers["x-capgate-reserved-input-tokens"]) == translated
