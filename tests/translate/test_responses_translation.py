"""/v1/responses served by an Anthropic-format target, through a live capgate, read by the
official OpenAI SDK: a Response and its event stream, a function-tool round trip, billed at the
model called; refused under an exhausted cap; failover from a failing OpenAI target; and the
fields with no faithful equivalent refused with 400 naming them."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseCompletedEvent, ResponseStreamEvent
from pydantic import TypeAdapter

from catalog.models import Connection, Model
from gateway.admission.bounds import shape_responses
from gateway.models import StoredResponse
from gateway.translate import ResponsesFromMessages, responses, translate_request
from ledger.models import Reservation, UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream.server import TOOL_ARGUMENTS, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}}},
    "strict": False,
}
COST = 1000 * 15_000 + 200 * 75_000  # 1000 in at $15/M, 200 out at $75/M, in nano-USD


def _openai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def _request(**extra) -> dict:
    return {
        "model": "claude-via-responses",
        "max_output_tokens": 300,
        "instructions": "Answer briefly.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is the weather where this photo was taken?"},
                    {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
                ],
            }
        ],
        "tools": [WEATHER],
        "tool_choice": "required",
        "store": False,
        **extra,
    }


def _recorded(connection, cost: int = COST) -> UsageRecord:
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id, rec.input_tokens, rec.output_tokens) == ("served", connection.id, 1000, 200)
    assert rec.cost_nano == cost
    return rec


def _sent_body(upstream) -> dict:
    body = upstream.last("/v1/messages")["body"]
    assert body["system"] == "Answer briefly."
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What is the weather where this photo was taken?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
    ]
    assert body["tools"] == [
        {"name": "get_weather", "input_schema": WEATHER["parameters"], "description": WEATHER["description"]}
    ]
    assert (body["tool_choice"], body["max_tokens"]) == ({"type": "any"}, 300)
    return body


def test_responses_create_is_served_by_an_anthropic_target(gateway, wired, upstream):
    # given: a route whose only target speaks Anthropic's format, and a model that calls the tool
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when
    response = _openai(gateway).responses.create(**_request())
    # then: the SDK reads a Response with the text and the function call
    assert (response.object, response.status, response.store) == ("response", "completed", False)
    assert response.output_text.startswith("The quick brown fox")
    call = next(item for item in response.output if item.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    assert call.call_id and call.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (1000, 200, 1200)
    assert response.usage.input_tokens_details.cached_tokens == 0
    # and the provider got an Anthropic request, without the Responses-only fields
    body = _sent_body(upstream)
    assert body["model"] == wired.model.name and "store" not in body and "stream" not in body
    _recorded(wired.anthropic)


def test_a_function_tool_round_trip_reaches_the_target_as_tool_use_and_tool_result(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    client = _openai(gateway)
    first = client.responses.create(**_request())
    call = next(item for item in first.output if item.type == "function_call")
    # when: the call and its output are sent back, as a stateless Responses client does
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=False)
    second = client.responses.create(
        **_request(
            input=[
                *_request()["input"],
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"},
            ],
            tool_choice="auto",
        )
    )
    # then: the target saw the call as tool_use and its output as tool_result, in alternating turns
    messages = upstream.last("/v1/messages")["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": call.call_id, "name": "get_weather", "input": TOOL_ARGUMENTS}
    ]
    assert messages[2]["content"] == [{"type": "tool_result", "tool_use_id": call.call_id, "content": "18C and sunny"}]
    assert second.output_text.startswith("The quick brown fox")
    assert not [item for item in second.output if item.type == "function_call"]
    wait_settled()
    assert sorted(r.cost_nano for r in UsageRecord.objects.all()) == [COST, COST]


def test_the_stream_is_responses_events_the_sdk_parses(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200, tool_call=True)
    # when: the SDK's streaming helper reads the events and assembles the final Response
    with _openai(gateway).responses.stream(**_request()) as stream:
        events = list(stream)
        final = stream.get_final_response()
    # then: the documented sequence, numbered from 0
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text_item = kinds.index("response.output_item.added")
    assert kinds[text_item + 1] == "response.content_part.added"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.startswith("The quick brown fox") and final.output_text == text
    call = next(item for item in final.output if item.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (1000, 200)
    assert final.status == "completed"
    assert upstream.last("/v1/messages")["body"]["stream"] is True
    _sent_body(upstream)
    _recorded(wired.anthropic)


def test_stream_true_yields_events_the_sdk_types(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    body = {"model": "claude-via-responses", "input": "Tell me a story.", "max_output_tokens": 300}
    events = list(_openai(gateway).responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * (len(kinds) - 8),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.usage.output_tokens == 200
    assert events[-1].response.output[0].content[0].text == events[-4].text
    # and every event on the wire validates as the SDK's own type, not only the lenient parse
    with httpx.stream(
        "POST", gateway.url + "/v1/responses", headers={"authorization": f"Bearer {KEY}"}, json={**body, "stream": True}
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    strict = [TypeAdapter(ResponseStreamEvent).validate_json(line[len("data: ") :]) for line in lines]
    assert [e.type for e in strict] == kinds
    wait_settled()
    assert UsageRecord.objects.count() == 2
    UsageRecord.objects.exclude(pk=UsageRecord.objects.order_by("id").first().pk).delete()
    _recorded(wired.anthropic)


def _anthropic_stream(stop: str) -> list[bytes]:
    """An Anthropic messages stream, as the API sends it, that stops for `stop`."""
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 7}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Once"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 20}},
        {"type": "message_stop"},
    ]
    return [json.dumps(e).encode() for e in events]


@pytest.mark.parametrize(
    ("stop", "status", "reason"),
    [
        ("max_tokens", "incomplete", "max_output_tokens"),
        ("refusal", "incomplete", "content_filter"),
        ("end_turn", "completed", None),
    ],
)
def test_the_stop_reason_is_the_response_status(stop, status, reason):
    # the stream: the SDK's own event types read every event, and the last one says why it ended
    translator = ResponsesFromMessages(request={"input": "hi", "max_output_tokens": 20})
    frames = [raw for data in _anthropic_stream(stop) for raw in translator.feed(data)]
    events = [TypeAdapter(ResponseStreamEvent).validate_json(f.split(b"\ndata: ", 1)[1]) for f in frames]
    final = events[-1]
    assert final.type == ("response.completed" if status == "completed" else "response.incomplete")
    assert (final.response.status, final.response.usage.output_tokens) == (status, 20)
    assert (final.response.incomplete_details and final.response.incomplete_details.reason) == reason
    # the whole answer: the same, validated as the SDK's Response
    message = {
        "id": "msg_1",
        "content": [{"type": "text", "text": "Once"}],
        "stop_reason": stop,
        "usage": {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 20},
    }
    whole = Response.model_validate_json(responses.reply(json.dumps(message).encode(), model="m", request={}))
    assert (whole.status, whole.output_text) == (status, "Once")
    assert (whole.incomplete_details and whole.incomplete_details.reason) == reason
    assert (whole.usage.input_tokens, whole.usage.input_tokens_details.cached_tokens) == (10, 3)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_exhausted_blocking_cap_refuses_before_the_target_sees_it(gateway, wired, upstream, stream):
    wired.route("claude-via-responses", wired.anthropic)
    wired.budget(amount="0.01")  # 300 output tokens at $75/M alone is $0.0225
    with pytest.raises(openai.APIStatusError) as refused:
        _openai(gateway).responses.create(**_request(), stream=stream)
    assert refused.value.status_code == 402 and "organization_budget" in str(refused.value.body)
    assert upstream.stats()["requests"] == 0
    assert not Reservation.objects.exists() and not UsageRecord.objects.filter(status="served").exists()


@pytest.fixture
def broken():
    """A second fake provider that answers every call with 503."""
    handle = run_in_thread()
    handle.control(fail="503")
    yield handle
    handle.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_failover_from_a_failing_openai_target_is_billed_once_at_the_model_called(
    gateway, wired, upstream, broken, stream
):
    # given: a blocking cap; the first target speaks Responses natively and fails with 503, the
    # second is an Anthropic target on a model at a fifth of the price
    budget = wired.budget(amount="5")
    first = Connection.objects.create(
        organization=wired.org, name="oa-broken", kind="openai", base_url=broken.url + "/v1", secret="sk-x"
    )
    cheap = Model.objects.create(
        provider=wired.model.provider,
        name="cheap-1",
        input_usd_per_mtok=Decimal("3"),
        output_usd_per_mtok=Decimal("15"),
        max_output_tokens=4096,
        max_image_tokens=1600,
    )
    route = wired.route("claude-via-responses", first)
    route.targets.create(connection=wired.anthropic, model=cheap, position=1)
    upstream.control(prompt_tokens=1000, completion_tokens=200)
    body = {"model": "claude-via-responses", "input": "hi", "max_output_tokens": 300}
    # when
    client = _openai(gateway)
    if stream:
        events = list(client.responses.create(**body, stream=True))
        assert events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    else:
        text = client.responses.create(**body).output_text
    # then: the OpenAI target got the native body once; the Anthropic one answered
    assert text.startswith("The quick brown fox")
    assert broken.stats()["requests"] == 1
    assert broken.last("/v1/responses")["body"]["input"] == "hi"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.connection_id) == ("served", wired.anthropic.id)
    assert rec.cost_nano == 1000 * 3_000 + 200 * 15_000
    assert window_of(budget).spent_nano == rec.cost_nano and window_of(budget).reserved_nano == 0
    assert not Reservation.objects.exists()


def test_a_translated_response_is_not_kept_as_a_stored_response(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=10, completion_tokens=5)
    response = _openai(gateway).responses.create(model="claude-via-responses", input="hi", max_output_tokens=20)
    # then: nothing is kept that a continuation or a GET could find, under either id
    wait_settled()
    assert not StoredResponse.objects.exists()
    r = httpx.get(gateway.url + f"/v1/responses/{response.id}", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"


UNTRANSLATABLE = [
    ("store", {"store": True}),
    ("previous_response_id", {"previous_response_id": "resp_abc"}),
    ("conversation", {"conversation": "conv_abc"}),
    ("background", {"background": True}),
    ("truncation", {"truncation": "auto"}),
    ("reasoning", {"reasoning": {"effort": "high"}}),
    ("text.format", {"text": {"format": {"type": "json_object"}}}),
    ("include", {"include": ["message.output_text.logprobs"]}),
    ("top_logprobs", {"top_logprobs": 3}),
    ("tools[0].type", {"tools": [{"type": "web_search"}]}),
    ("tools[0].type", {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
    ("tools[0].type", {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}),
    ("tools[0].type", {"tools": [{"type": "custom", "name": "x"}]}),
    ("tools[0].strict", {"tools": [{**WEATHER, "strict": True}]}),
    ("tools[0].strict", {"tools": [{k: v for k, v in WEATHER.items() if k != "strict"}]}),
    ("tool_choice", {"tool_choice": {"type": "web_search_preview"}}),
    ("temperature", {"temperature": 1.5}),
    ("input[0]", {"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}]}),
    ("input[0].type", {"input": [{"type": "item_reference", "id": "msg_1"}]}),
    ("input[1].role", {"input": [{"role": "user", "content": "hi"}, {"role": "developer", "content": "late"}]}),
    ("input[0].content[0]", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f_1"}]}]}),
    ("input[0].arguments", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}),
]


@pytest.mark.parametrize(
    ("field", "extra"), UNTRANSLATABLE, ids=[f"{f}-{i}" for i, (f, _) in enumerate(UNTRANSLATABLE)]
)
def test_fields_without_a_faithful_equivalent_are_refused_naming_them(gateway, wired, upstream, field, extra):
    wired.route("claude-via-responses", wired.anthropic)
    body = {"model": "claude-via-responses", "input": "hi", "max_output_tokens": 20, **extra}
    r = httpx.post(gateway.url + "/v1/responses", headers={"authorization": f"Bearer {KEY}"}, json=body, timeout=30)
    # then: a 400 in the Responses endpoint's error shape, and nothing sent or billed
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("untranslatable_field", field), error
    assert field in error["message"]
    assert upstream.stats()["requests"] == 0
    wait_settled()
    assert not UsageRecord.objects.filter(status="served").exists() and not Reservation.objects.exists()


def test_the_sdk_reads_a_refusal_as_a_bad_request_naming_the_field(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gateway).responses.create(model="claude-via-responses", input="hi", tools=[{"type": "web_search"}])
    assert refused.value.code == "untranslatable_field" and refused.value.param == "tools[0].type"


def test_dropped_fields_are_left_out_of_the_target_body(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=10, completion_tokens=5)
    _openai(gateway).responses.create(
        model="claude-via-responses",
        input="hi",
        max_output_tokens=20,
        metadata={"a": "b"},
        prompt_cache_key="k",
        include=["reasoning.encrypted_content"],
        safety_identifier="user-7",
        store=False,
    )
    body = upstream.last("/v1/messages")["body"]
    assert body["metadata"] == {"user_id": "user-7"}
    assert set(body) == {"model", "messages", "max_tokens", "metadata"}


@pytest.mark.parametrize("guarded", [True, False], ids=["bound-on-translation", "removed"])
def test_the_worst_case_is_the_translated_body(gateway, wired, upstream, monkeypatch, guarded):
    # given: a Responses request whose messages translation is bigger (each call and its output
    # becomes a block with its own framing), on a route whose only target speaks messages
    if not guarded:  # the removal: the target bounded on the client's own body
        from gateway.admission import sizing

        def client_shape_only(shape, targets, translation):
            translation("messages")  # still made (the proxy sends it), but not what the bound is taken from
            return {}, targets

        monkeypatch.setattr(sizing, "_translate", client_shape_only)
    wired.budget(amount="5")
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(prompt_tokens=10, completion_tokens=5)
    items: list[dict] = []
    for i in range(40):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": '{"q": "x"}'})
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "ok"})
    body = {
        "model": "claude-via-responses",
        "max_output_tokens": 100,
        "input": [{"role": "user", "content": "go"}, *items],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False}],
    }
    own = shape_responses(body).text_tokens
    translated = translate_request(kind="responses", body=body, headers={}).shape.text_tokens
    assert translated > own  # the case the bound must follow
    # when
    r = httpx.post(gateway.url + "/v1/responses", headers={"authorization": f"Bearer {KEY}"}, json=body, timeout=30)
    # then: the reservation covers the body the target was sent
    assert r.status_code == 200, r.text
    if not guarded:  # without the guard, the reservation falls short of it
        assert int(r.headers["x-capgate-reserved-input-tokens"]) == own < translated
        return
    assert int(r.headers["x-capgate-reserved-input-tokens"]) == translated
    reserved = Decimal(r.headers["x-capgate-reserved-usd"])
    # at the most expensive input rate (the cache write, $18.75/M) plus 100 output tokens at $75/M
    assert reserved == Decimal(translated * 18_750 + 100 * 75_000) / 10**9


def test_a_target_that_cannot_take_the_request_is_left_out_of_the_failover_order(gateway, wired, upstream):
    # given: an Anthropic target first and an OpenAI one second; `store: true` only OpenAI can keep
    route = wired.route("claude-via-responses", wired.anthropic)
    route.targets.create(connection=wired.openai, model=wired.model, position=1)
    upstream.control(prompt_tokens=10, completion_tokens=5)
    # when
    response = _openai(gateway).responses.create(
        model="claude-via-responses", input="hi", max_output_tokens=20, store=True
    )
    # then: served natively by the OpenAI target, the Anthropic one never called
    assert response.output_text
    assert upstream.last("/v1/responses")["body"]["store"] is True
    assert upstream.stats()["by_path"] == {"/v1/responses": 1}
    wait_settled()
    assert UsageRecord.objects.get().connection_id == wired.openai.id


def test_the_targets_error_reaches_the_client_in_the_responses_shape(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    upstream.control(fail="400")
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gateway).responses.create(model="claude-via-responses", input="hi", max_output_tokens=20)
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error" and error["message"]
    assert upstream.stats()["by_path"] == {"/v1/messages": 1}
    wait_settled()
    assert UsageRecord.objects.get().status == "failed_upstream"


def test_an_error_event_is_the_responses_error_event():
    translator = ResponsesFromMessages(request={})
    start = {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 7}}}
    translator.feed(json.dumps(start).encode())
    (frame,) = translator.feed(b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}')
    event = TypeAdapter(ResponseStreamEvent).validate_json(frame.split(b"\ndata: ", 1)[1])
    assert (event.type, event.code, event.message, event.sequence_number) == (
        "error",
        "overloaded_error",
        "Overloaded",
        2,
    )


def test_a_stream_the_target_cuts_ends_without_completed_and_is_charged_its_worst_case(gateway, wired, upstream):
    wired.route("claude-via-responses", wired.anthropic)
    budget = wired.budget(amount="5")
    # its events spaced out, so those before the drop reach the gateway on their own
    upstream.control(prompt_tokens=10, completion_tokens=5, chunks=8, fail="drop_mid_stream", chunk_delay_ms=50)
    events = _openai(gateway).responses.create(
        model="claude-via-responses", input="hi", max_output_tokens=20, stream=True
    )
    kinds = [event.type for event in events]
    # then: the client saw it broken, not completed, and the cap was charged the reservation
    assert "response.completed" not in kinds and kinds[0] == "response.created"
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "estimated" and rec.cost_nano > 0
    assert window_of(budget).spent_nano == rec.cost_nano and window_of(budget).reserved_nano == 0
