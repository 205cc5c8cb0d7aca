"""The fake's native Gemini format, checked with Google's own SDK (google-genai) pointed at it:
if the SDK can call it, streamed and not, with a function call and an image, the fake speaks
the format. Plain pytest: no database, no Django."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest
from google import genai
from google.genai import errors, types

from .server import UpstreamHandle, run_in_thread

MODEL = "gemini-2.5-flash"
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PNG = base64.b64decode(PNG_B64)
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


def client(upstream: UpstreamHandle, key: str = "gemini-key") -> genai.Client:
    """A client kept by the caller: the SDK closes its HTTP client when the Client is collected."""
    options = types.HttpOptions(
        base_url=upstream.url, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key=key, http_options=options)


def test_the_sdk_generates_content_with_an_image_and_reads_the_usage(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=120, completion_tokens=30, thoughts_tokens=50, cached_tokens=100)
    gemini = client(upstream)
    answer = gemini.models.generate_content(
        model=MODEL,
        contents=[types.Part.from_text(text="What is this?"), types.Part.from_bytes(data=PNG, mime_type="image/png")],
        config=types.GenerateContentConfig(
            system_instruction="Answer briefly.", max_output_tokens=300, stop_sequences=["END"], temperature=0.2
        ),
    )
    assert answer.text.startswith("The quick brown fox")
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    usage = answer.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count) == (120, 30)
    assert (usage.thoughts_token_count, usage.cached_content_token_count, usage.total_token_count) == (50, 100, 200)
    seen = upstream.last(f"/v1beta/models/{MODEL}:generateContent")
    assert seen["headers"]["x-goog-api-key"] == "gemini-key"
    body = seen["body"]
    assert body["systemInstruction"]["parts"] == [{"text": "Answer briefly."}]
    inline = body["contents"][0]["parts"][1]["inlineData"]  # the SDK sends mime_type: proto JSON takes both
    assert (inline.get("mimeType") or inline.get("mime_type"), inline["data"]) == ("image/png", PNG_B64)
    assert body["generationConfig"]["maxOutputTokens"] == 300


def test_the_sdk_reads_a_function_call(upstream):
    upstream.reset()
    upstream.control(tool_call=True)
    gemini = client(upstream)
    answer = gemini.models.generate_content(
        model=MODEL,
        contents="Weather in Paris?",
        config=types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[WEATHER])],
            tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        ),
    )
    call = answer.function_calls[0]
    assert (call.name, call.args) == ("get_weather", {"city": "Paris", "units": "celsius"})


def test_the_sdk_streams_with_usage_on_the_last_event(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=7, completion_tokens=4, chunks=3)
    gemini = client(upstream)
    events = list(gemini.models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(e.text or "" for e in events).startswith("The quick brown")
    assert events[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert events[-1].usage_metadata.candidates_token_count == 4
    assert upstream.last(f"/v1beta/models/{MODEL}:streamGenerateContent")["query"] == {"alt": "sse"}


def test_errors_are_googles_shape(upstream):
    upstream.reset()
    upstream.control(fail="429")
    gemini = client(upstream)
    with pytest.raises(errors.ClientError) as err:
        gemini.models.generate_content(model=MODEL, contents="hi")
    assert (err.value.code, err.value.status) == (429, "RESOURCE_EXHAUSTED")
    upstream.reset()
    keyless = httpx.post(upstream.url + f"/v1beta/models/{MODEL}:generateContent", json={"contents": []})
    assert keyless.status_code == 403 and keyless.json()["error"]["status"] == "PERMISSION_DENIED"
    bad = httpx.post(
        upstream.url + f"/v1beta/models/{MODEL}:generateContent",
        headers={"x-goog-api-key": "k"},
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "model": MODEL},
    )
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
