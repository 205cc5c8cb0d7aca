"""Gemini's native generateContent as a target: the official OpenAI SDK (chat, streamed and not,
with tools and an image) and the official Anthropic SDK (messages, streamed and not, with
tools) served by a `gemini` connection with `options.api: "native"` through a live capgate, each
call recorded at the model's prices (thinking tokens as output, cached tokens at the cache-read
rate); refused 402 under an exhausted cap; failover between a native Gemini target and an
OpenAI target both ways; untranslatable fields refused with 400. The fake speaks Gemini's wire
format (tests/upstream/gemini_native.py, checked with google-genai); what it received is
checked too."""

from __future__ import annotations

import json
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest

from catalog.models import Connection, Model
from gateway.admission.bounds import shape_chat
from gateway.billing.translation import CHAT_TO_GEMINI, DROPPED, FIELDS, REFUSED
from gateway.translate import Untranslatable, translate_request
from gateway.translate.gemini import SKIP_SIGNATURE
from ledger.models import Reservation, UsageRecord
from tests.conftest import usd, window_of
from tests.gateway.conftest import KEY, assert_nothing_held, wait_settled
from tests.translate.test_sdks import PNG, WEATHER
from tests.upstream.server import TOOL_ARGUMENTS, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

MODEL_ID = "gemini-test-flash"
GENERATE = f"/v1beta/models/{MODEL_ID}:generateContent"
STREAM = f"/v1beta/models/{MODEL_ID}:streamGenerateContent"
# 1000 prompt tokens of which 400 cached, 200 output tokens and 50 thinking tokens, at $1.25 in,
# $0.125 cached and $10 out per 1M tokens.
KNOBS = {"prompt_tokens": 1000, "cached_tokens": 400, "completion_tokens": 200, "thoughts_tokens": 50}
COST = 600 * 1250 + 400 * 125 + (200 + 50) * 10_000


@pytest.fixture
def gemini(wired, upstream):
    """A native Gemini connection to the fake, and its model's route `gemini-native`."""
    model = Model.objects.create(
        provider=wired.model.provider,
        name=MODEL_ID,
        input_usd_per_mtok=Decimal("1.25"),
        output_usd_per_mtok=Decimal("10"),
        cache_read_usd_per_mtok=Decimal("0.125"),
        max_output_tokens=8192,
        max_image_tokens=1290,
    )
    connection = _native(wired, upstream.url)
    wired.route("gemini-native", connection, model=model)
    return connection, model


def _native(wired, url: str) -> Connection:
    return Connection.objects.create(
        organization=wired.org,
        name=f"gemini-{url[-5:]}",
        kind="gemini",
        base_url=url,
        secret="gemini-key",
        options={"api": "native", "forward_test_headers": True},
    )


def _openai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def _anthropic(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0)


def _recorded(connection, cost: int = COST) -> UsageRecord:
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id, rec.provider_model) == ("served", connection.id, MODEL_ID)
    assert (rec.input_tokens, rec.cache_read_tokens, rec.output_tokens) == (600, 400, 250)
    assert rec.cost_nano == cost
    return rec


def _chat_request() -> dict:
    return {
        "model": "gemini-native",
        "max_tokens": 300,
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
        "temperature": 0.3,
    }


def _check_generate_sent(sent: dict, *, image: bool = True) -> None:
    """What Gemini got: its own body, nothing of the gateway's fields, the key in its header."""
    assert sent["headers"]["x-goog-api-key"] == "gemini-key"
    assert "authorization" not in sent["headers"]
    body = sent["body"]
    assert set(body) == {"contents", "systemInstruction", "generationConfig", "tools", "toolConfig"}
    assert body["systemInstruction"] == {"parts": [{"text": "Answer briefly."}]}
    parts = body["contents"][0]["parts"]
    assert body["contents"][0]["role"] == "user" and parts[0]["text"].startswith("What is the weather")
    if image:
        assert parts[1] == {"inlineData": {"mimeType": "image/png", "data": PNG}}
    declaration = {
        "name": "get_weather",
        "description": WEATHER["description"],
        "parametersJsonSchema": WEATHER["parameters"],
    }
    assert body["tools"] == [{"functionDeclarations": [declaration]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert body["generationConfig"]["maxOutputTokens"] == 300
    assert body["generationConfig"]["stopSequences"] == ["END"]


def test_openai_sdk_is_served_by_native_gemini(gateway, wired, upstream, gemini):
    # given: a route whose only target speaks Gemini's native format, a model that calls the tool
    connection, _ = gemini
    upstream.control(**KNOBS, tool_call=True)
    # when
    reply = _openai(gateway).chat.completions.create(**_chat_request())
    # then: a chat completion with the tool call, and Gemini's usage as OpenAI's
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1000, 250)
    assert reply.usage.prompt_tokens_details.cached_tokens == 400
    assert reply.usage.completion_tokens_details.reasoning_tokens == 50
    sent = upstream.last(GENERATE)
    _check_generate_sent(sent)
    assert sent["body"]["generationConfig"]["temperature"] == 0.3
    _recorded(connection)


def test_openai_sdk_stream_is_served_by_native_gemini(gateway, wired, upstream, gemini):
    connection, _ = gemini
    upstream.control(**KNOBS)
    # when
    chunks = list(
        _openai(gateway).chat.completions.create(**_chat_request(), stream=True, stream_options={"include_usage": True})
    )
    # then: chat.completion.chunk events with the text, the finish and the usage chunk last
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The quick brown fox")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (1000, 250)
    sent = upstream.last(STREAM)
    assert sent["query"] == {"alt": "sse"}
    _check_generate_sent(sent)
    _recorded(connection)


def test_openai_sdk_stream_with_a_tool_call(gateway, wired, upstream, gemini):
    connection, _ = gemini
    upstream.control(**KNOBS, tool_call=True)
    chunks = list(_openai(gateway).chat.completions.create(**_chat_request(), stream=True))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == TOOL_ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert all(c.usage is None for c in chunks)  # not asked for: no usage chunk
    _recorded(connection)  # billed from Gemini's own usage all the same


def _messages_request() -> dict:
    return {
        "model": "gemini-native",
        "max_tokens": 300,
        "system": "Answer briefly.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather where this photo was taken?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            }
        ],
        "tools": [
            {"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
        ],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["END"],
    }


def test_anthropic_sdk_is_served_by_native_gemini(gateway, wired, upstream, gemini):
    connection, _ = gemini
    upstream.control(**KNOBS, tool_call=True)
    # when
    msg = _anthropic(gateway).messages.create(**_messages_request())
    # then: an Anthropic message with the tool use, Gemini's usage as Anthropic's
    assert (msg.type, msg.stop_reason) == ("message", "tool_use")
    use = [b for b in msg.content if b.type == "tool_use"][0]
    assert (use.name, use.input) == ("get_weather", TOOL_ARGUMENTS)
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (600, 400, 250)
    _check_generate_sent(upstream.last(GENERATE))
    _recorded(connection)


def test_anthropic_sdk_stream_is_served_by_native_gemini(gateway, wired, upstream, gemini):
    connection, _ = gemini
    upstream.control(**KNOBS, tool_call=True)
    # when
    with _anthropic(gateway).messages.stream(**_messages_request()) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    # then: Anthropic's own event sequence, the text and the tool use accumulated from it
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    assert final.content[0].type == "text" and final.content[0].text.startswith("The quick brown fox")
    use = final.content[1]
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", TOOL_ARGUMENTS)
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("tool_use", 600, 250)
    _check_generate_sent(upstream.last(STREAM))
    _recorded(connection)


def test_a_tool_loop_is_carried_to_gemini(gateway, wired, upstream, gemini):
    # given: the second turn of a tool loop, in each client format
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    _openai(gateway).chat.completions.create(
        model="gemini-native",
        max_tokens=50,
        tools=[{"type": "function", "function": WEATHER}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
        ],
    )
    # then: a model turn with the function call (signed as Google documents for a replayed
    # call), and a user turn with the function response named after it
    contents = upstream.last(GENERATE)["body"]["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": SKIP_SIGNATURE}
        ],
    }
    assert contents[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "get_weather", "response": {"result": "18C and sunny"}}}],
    }
    _anthropic(gateway).messages.create(
        model="gemini-native",
        max_tokens=50,
        tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C and sunny"}],
            },
        ],
    )
    assert upstream.last(GENERATE)["body"]["contents"][1:] == contents[1:]


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_an_exhausted_cap_refuses_before_gemini_is_called(gateway, wired, upstream, gemini, kind):
    # given: a blocking cap with nothing left
    budget = wired.budget(amount="0.000001")
    # when
    if kind == "chat":
        with pytest.raises(openai.APIStatusError) as err:
            _openai(gateway).chat.completions.create(**_chat_request())
        assert err.value.body["code"] == "organization_budget"  # OpenAI's shape
    else:
        with pytest.raises(anthropic.APIStatusError) as err:
            _anthropic(gateway).messages.create(**_messages_request())
        assert err.value.body["type"] == "error"  # Anthropic's shape
    # then: 402 naming the ceiling; nothing sent, nothing held
    assert err.value.status_code == 402
    assert err.value.response.headers["x-capgate-budget-code"] == "organization_budget"
    assert upstream.stats()["requests"] == 0
    assert window_of(budget).spent_nano == 0
    assert_nothing_held()


def _post(gateway, kind: str, body: dict, headers: dict | None = None) -> httpx.Response:
    path, auth = (
        ("/v1/chat/completions", {"authorization": f"Bearer {KEY}"})
        if kind == "chat"
        else ("/v1/messages", {"x-api-key": KEY})
    )
    return httpx.post(gateway.url + path, headers={**auth, **(headers or {})}, json=body, timeout=30)


@pytest.fixture
def broken():
    """A second fake provider that answers every call with 503 (in each format's own shape)."""
    handle = run_in_thread()
    handle.control(fail="503")
    yield handle
    handle.stop()


@pytest.mark.parametrize("kind", ["chat", "messages"])
@pytest.mark.parametrize("first", ["gemini", "openai"], ids=["gemini-fails", "openai-fails"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_failover_between_native_gemini_and_openai(gateway, wired, upstream, broken, gemini, kind, first, stream):
    # given: a blocking cap; the first target fails with 503, the second (the other format) is healthy
    budget = wired.budget(amount="5")
    healthy_gemini, model = gemini
    if first == "gemini":
        failing = _native(wired, broken.url)
        healthy = Connection.objects.get(pk=wired.openai.pk)
    else:
        failing = Connection.objects.create(
            organization=wired.org,
            name="oa-broken",
            kind="openai",
            base_url=broken.url + "/v1",
            secret="sk-x",
            options={"forward_test_headers": True},
        )
        healthy = healthy_gemini
    route = wired.route("cross", failing, model=model)
    route.targets.create(connection=healthy, model=model, position=1)
    upstream.control(**KNOBS)
    body = {"model": "cross", "max_tokens": 300, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    # when
    r = _post(gateway, kind, body)
    # then: served by the healthy target in the endpoint's own format; the failing one tried once
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]") if kind == "chat" else "event: message_stop" in r.text
    else:
        assert ("choices" in r.json()) if kind == "chat" else (r.json()["type"] == "message")
    assert broken.stats()["requests"] == 1
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id) == ("served", healthy.id)
    if healthy == healthy_gemini:
        assert rec.cost_nano == COST
    else:  # OpenAI's usage: 1000 prompt tokens of which 400 cached, 200 completion + 50 thinking in the total
        assert rec.cost_nano == 600 * 1250 + 400 * 125 + 250 * 10_000
    assert window_of(budget).spent_nano == rec.cost_nano and window_of(budget).reserved_nano == 0
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(
    ("kind", "field", "extra"),
    [
        ("chat", "logprobs", {"logprobs": True}),
        ("chat", "web_search_options", {"web_search_options": {}}),
        (
            "chat",
            "messages[0].content[0]",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
                    }
                ]
            },
        ),
        (
            "chat",
            "parallel_tool_calls",
            {"tools": [{"type": "function", "function": WEATHER}], "parallel_tool_calls": False},
        ),
        ("messages", "container", {"container": "cntr_1"}),
        ("messages", "tools[0].type", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    ],
)
def test_a_field_without_a_faithful_translation_to_gemini_is_refused(
    gateway, wired, upstream, gemini, kind, field, extra
):
    # given: a route whose only target speaks Gemini's native format
    body = {"model": "gemini-native", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **extra}
    # when
    r = _post(gateway, kind, body)
    # then: 400 in the endpoint's shape, naming the field; nothing sent, nothing held
    assert r.status_code == 400, r.text
    if kind == "chat":
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("untranslatable_field", field)
    else:
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert f"'{field}'" in r.json()["error"]["message"] and "Gemini generateContent" in r.json()["error"]["message"]
    assert upstream.stats()["requests"] == 0
    assert_nothing_held()


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_a_gemini_error_reaches_the_client_in_the_endpoints_shape(gateway, wired, upstream, gemini, kind):
    body = {"model": "gemini-native", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    # when: Gemini refuses the request (Google's {code, message, status})
    r = _post(gateway, kind, body, headers={"x-upstream-fail": "400"})
    # then
    assert r.status_code == 400
    if kind == "chat":
        assert r.json()["error"] == {
            "message": "fake upstream 400",
            "type": "invalid_request_error",
            "code": "invalid_argument",
            "param": None,
        }
    else:
        assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "fake upstream 400"}}
    wait_settled()
    assert UsageRecord.objects.get().status == "failed_upstream"


@pytest.mark.parametrize("guarded", [True, False], ids=["bound-on-translation", "removed"])
def test_the_worst_case_is_the_generate_content_body_with_its_ceiling_injected(
    gateway, wired, upstream, gemini, monkeypatch, guarded
):
    # given: a chat request naming no output ceiling under a cap, whose generateContent body is
    # bigger than the client's (each tool call's function response repeats the function's name)
    if not guarded:  # the removal: the Gemini target bounded on the client's own body
        from gateway.admission import sizing

        def client_shape_only(shape, targets, translation):
            translation("gemini")  # still made (the proxy sends it), but not what the bound is taken from
            return {}, targets

        monkeypatch.setattr(sizing, "_translate", client_shape_only)
    wired.budget(amount="5")
    name = "a_function_with_a_long_name_" * 4
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}} for i in range(30)]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in range(30)]
    body = {
        "model": "gemini-native",
        "tools": [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": calls}, *results],
    }
    own = shape_chat(body).text_tokens
    translated = translate_request(kind="chat", body=body, headers={}, target="gemini").shape.text_tokens
    assert translated > own  # the case the bound must follow
    # when
    r = _post(gateway, "chat", body)
    # then: Gemini was sent the output ceiling the reservation assumed, in its own parameter
    assert r.status_code == 200, r.text
    if not guarded:
        assert int(r.headers["x-capgate-reserved-input-tokens"]) == own < translated
        return
    assert int(r.headers["x-capgate-reserved-input-tokens"]) == translated
    sent = upstream.last(GENERATE)["body"]
    ceiling = sent["generationConfig"]["maxOutputTokens"]
    assert ceiling == 8192 and "maxOutputTokens" not in sent
    # the translated body at the input rate plus the injected ceiling at the output rate
    assert usd(r.headers["x-capgate-reserved-usd"]) == translated * 1250 + ceiling * 10_000


def test_a_gemini_stream_cut_before_it_finished_is_charged_its_worst_case(gateway, wired, upstream, gemini):
    # given: a Gemini stream that drops after two partial answers, under a cap
    budget = wired.budget(amount="5")
    upstream.control(chunk_delay_ms=50, **KNOBS)
    body = {
        "model": "gemini-native",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    # when
    r = _post(gateway, "chat", body, headers={"x-upstream-fail": "drop_mid_stream"})
    # then: the client never sees [DONE]; the partial usage is not taken as the bill
    assert "[DONE]" not in r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano == usd(r.headers["x-capgate-reserved-usd"])
    assert window_of(budget).spent_nano == rec.cost_nano


# --- the table (no gateway) -----------------------------------------------------------------

BASE = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
REFUSED_VALUES = {
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "verbosity": "low",
    "prediction": {"type": "content", "content": "x"},
    "audio": {"voice": "alloy", "format": "mp3"},
    "web_search_options": {},
    "moderation": {"type": "auto"},
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
}
DROPPED_VALUES = {
    "user": "u",
    "safety_identifier": "s",
    "metadata": {"a": "b"},
    "store": True,
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {},
}


def test_every_chat_field_has_a_gemini_rule():
    from gateway import billing

    assert set(FIELDS[CHAT_TO_GEMINI]) == set(billing.FIELDS["chat"])


def test_every_refused_chat_field_is_refused_naming_it(settings):
    refused = {name for name, rule in FIELDS[CHAT_TO_GEMINI].items() if rule.how == REFUSED}
    assert refused == set(REFUSED_VALUES)
    for name, value in REFUSED_VALUES.items():
        with pytest.raises(Untranslatable) as err:
            translate_request(kind="chat", body={**BASE, name: value}, headers={}, target="gemini")
        assert err.value.param == name and err.value.status == 400


def test_every_dropped_chat_field_is_left_out(settings):
    dropped = {name for name, rule in FIELDS[CHAT_TO_GEMINI].items() if rule.how == DROPPED}
    assert dropped == set(DROPPED_VALUES)
    out = translate_request(kind="chat", body={**BASE, **DROPPED_VALUES}, headers={}, target="gemini").body
    assert not dropped & set(out) and not dropped & set(out.get("generationConfig") or {})


def test_top_k_and_a_thinking_budget_reach_gemini_directly_from_messages(settings):
    body = {**BASE, "max_tokens": 4000, "top_k": 40, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    out = translate_request(kind="messages", body=body, headers={}, target="gemini").body
    assert out["generationConfig"] == {"maxOutputTokens": 4000, "topK": 40, "thinkingConfig": {"thinkingBudget": 2048}}
    adaptive = translate_request(
        kind="messages", body={**BASE, "thinking": {"type": "adaptive"}}, headers={}, target="gemini"
    )
    assert adaptive.body["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH"}
    with pytest.raises(Untranslatable) as err:  # the chat route still refuses a budget
        translate_request(kind="messages", body={**BASE, "thinking": body["thinking"]}, headers={}, target="chat")
    assert err.value.param == "thinking"


def test_sampling_format_and_thinking_map_to_generation_config(settings):
    body = {
        **BASE,
        "n": 2,
        "seed": 7,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    }
    config = translate_request(kind="chat", body=body, headers={}, target="gemini").body["generationConfig"]
    assert config == {
        "maxOutputTokens": 10,
        "candidateCount": 2,
        "seed": 7,
        "topP": 0.9,
        "presencePenalty": 0.5,
        "frequencyPenalty": 0.25,
        "thinkingConfig": {"thinkingLevel": "LOW"},
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
    }
    none = translate_request(kind="chat", body={**BASE, "reasoning_effort": "none"}, headers={}, target="gemini")
    assert none.body["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}


def test_the_api_option_is_checked_when_a_connection_is_saved(wired):
    from catalog.services import create_connection
    from core.errors import InvalidChange
    from tenants.audit import APPLY

    with pytest.raises(InvalidChange, match="options.api"):
        create_connection(
            organization=wired.org, actor=APPLY, name="bad", kind="gemini", options={"api": "grpc"}, secret="k"
        )
    assert not Connection.objects.filter(name="bad").exists()
    made = create_connection(
        organization=wired.org, actor=APPLY, name="good", kind="gemini", options={"api": "native"}, secret="k"
    )
    assert made.options["api"] == "native"


@pytest.mark.parametrize(
    ("base_url", "stream", "url"),
    [
        ("", False, "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"),
        (
            "",
            True,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
        # the API's own base URLs are accepted, a stored query never reaches the path
        (
            "https://proxy.example/v1beta/?x=1",
            False,
            "https://proxy.example/v1beta/models/gemini-2.5-flash:generateContent",
        ),
        (
            "https://proxy.example/v1beta/openai/",
            False,
            "https://proxy.example/v1beta/models/gemini-2.5-flash:generateContent",
        ),
    ],
)
def test_the_native_url(wired, base_url, stream, url):
    from gateway import providers
    from gateway.admission.routing import Target

    model = Model(provider=wired.model.provider, name="gemini-2.5-flash")
    connection = Connection(organization=wired.org, kind="gemini", base_url=base_url, options={"api": "native"})
    target = Target(connection=connection, model=model)
    assert providers.formats(connection) == {"gemini"}
    assert providers.adapter(target).url(target, "gemini", stream=stream) == url
    # without the option the kind speaks the OpenAI-compatible endpoint, as before
    compatible = Connection(organization=wired.org, kind="gemini", options={})
    assert providers.formats(compatible) == {"chat", "embeddings"}


def test_system_messages_between_turns_join_the_system_instruction(settings):
    body = {
        **BASE,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "developer", "content": "Now answer in French."},
            {"role": "user", "content": "and now?"},
        ],
    }
    out = translate_request(kind="chat", body=body, headers={}, target="gemini").body
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief.\n\nNow answer in French."}]}
    assert [c["role"] for c in out["contents"]] == ["user", "model", "user"]


def test_a_route_of_three_formats_translates_once_per_format_and_fails_over(gateway, wired, upstream, broken, gemini):
    # given: a chat route whose first target speaks Anthropic's format and fails, then native Gemini
    budget = wired.budget(amount="5")
    connection, model = gemini
    failing = Connection.objects.create(
        organization=wired.org,
        name="an-broken",
        kind="anthropic",
        base_url=broken.url,
        secret="sk-ant-x",
        options={"forward_test_headers": True},
    )
    route = wired.route("three", failing, model=model)
    route.targets.create(connection=connection, model=model, position=1)
    upstream.control(**KNOBS)
    body = {"model": "three", "max_tokens": 300, "messages": [{"role": "user", "content": "hi"}]}
    # when
    r = _post(gateway, "chat", body)
    # then: the Anthropic target was tried once with its translation, Gemini served with its own
    assert r.status_code == 200, r.text
    assert broken.stats()["by_path"] == {"/v1/messages": 1}
    assert upstream.last(GENERATE)["body"]["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    _recorded(connection)
    assert window_of(budget).spent_nano == COST


def test_a_field_one_format_refuses_leaves_only_that_formats_targets_out(gateway, wired, upstream, gemini):
    # given: a chat route of an Anthropic target then a native Gemini one, and a seed, which
    # Anthropic has no equivalent for and Gemini takes
    connection, model = gemini
    route = wired.route("two", wired.anthropic, model=model)
    route.targets.create(connection=connection, model=model, position=1)
    upstream.control(**KNOBS)
    body = {"model": "two", "max_tokens": 300, "seed": 7, "messages": [{"role": "user", "content": "hi"}]}
    # when
    r = _post(gateway, "chat", body)
    # then: the Anthropic target was left out; Gemini served it with the seed
    assert r.status_code == 200, r.text
    assert upstream.stats()["by_path"] == {"/v1beta/models/{model}:generateContent": 1}
    assert upstream.last(GENERATE)["body"]["generationConfig"]["seed"] == 7
    _recorded(connection)


def test_gemini_usage_is_billed_with_tool_prompts_as_input_and_odd_modalities_flagged():
    from gateway.providers.gemini_native import usage_gemini

    usage = usage_gemini(
        {
            "promptTokenCount": 1000,
            "cachedContentTokenCount": 300,
            "toolUsePromptTokenCount": 50,
            "candidatesTokenCount": 20,
            "thoughtsTokenCount": 80,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 900}, {"modality": "AUDIO", "tokenCount": 100}],
        }
    )
    assert usage is not None
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (750, 300, 100)
    assert usage.unpriced == ("usageMetadata.promptTokensDetails.AUDIO=100",)


def test_a_stream_is_billed_only_once_a_candidate_finished():
    from gateway.providers.gemini_native import GeminiStreamUsage

    tracker = GeminiStreamUsage()
    partial = {"candidates": [{"content": {"parts": [{"text": "a"}]}}], "usageMetadata": {"promptTokenCount": 9}}
    tracker.feed(json.dumps(partial).encode())
    assert tracker.usage is None  # a cut here is charged at the worst case
    last = {
        "candidates": [{"content": {"parts": [{"text": "b"}]}, "finishReason": "MAX_TOKENS"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4},
        "modelVersion": "gemini-x",
    }
    tracker.feed(json.dumps(last).encode())
    assert tracker.usage is not None and (tracker.usage.input_tokens, tracker.usage.output_tokens) == (9, 4)
    assert tracker.model == "gemini-x"


def test_finish_reasons_and_a_blocked_prompt_in_each_client_format():
    from gateway.translate import reply

    def answer(**kw) -> bytes:
        return json.dumps({"usageMetadata": {"promptTokenCount": 3}, **kw}).encode()

    long = answer(candidates=[{"content": {"parts": [{"text": "x"}]}, "finishReason": "MAX_TOKENS"}])
    assert (
        json.loads(reply(long, upstream="gemini", client="chat", model="m"))["choices"][0]["finish_reason"] == "length"
    )
    assert json.loads(reply(long, upstream="gemini", client="messages", model="m"))["stop_reason"] == "max_tokens"
    blocked = answer(promptFeedback={"blockReason": "SAFETY"})
    chat = json.loads(reply(blocked, upstream="gemini", client="chat", model="m"))
    assert (chat["choices"][0]["finish_reason"], chat["choices"][0]["message"]["content"]) == ("content_filter", "")
    assert json.loads(reply(blocked, upstream="gemini", client="messages", model="m"))["stop_reason"] == "refusal"
    thought = answer(
        candidates=[{"content": {"parts": [{"text": "hmm", "thought": True}, {"text": "42"}]}, "finishReason": "STOP"}]
    )
    assert (
        json.loads(reply(thought, upstream="gemini", client="chat", model="m"))["choices"][0]["message"]["content"]
        == "42"
    )


def test_empty_turns_are_left_out_and_turns_of_one_role_merge(settings):
    body = {
        **BASE,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ],
    }
    out = translate_request(kind="chat", body=body, headers={}, target="gemini").body
    assert out["contents"] == [{"role": "user", "parts": [{"text": "hi"}, {"text": "again"}]}]
