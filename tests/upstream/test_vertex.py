"""The fake's Vertex AI formats, checked with the providers' own clients pointed at it:
Anthropic's AnthropicVertex with google-auth service-account credentials (whose token request
the fake's token endpoint verifies), and the openai SDK on Vertex's OpenAI-compatible endpoint
as Google documents it (the access token as the API key). Plain pytest: no database, no Django."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import google.auth.transport.requests
import httpx
import openai
import pytest
from google.oauth2 import service_account

from .server import UpstreamHandle, run_in_thread
from .vertex import new_service_account

PROJECT, REGION = "capgate-test", "us-east5"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


def credentials(upstream: UpstreamHandle) -> service_account.Credentials:
    info = new_service_account(upstream.url + "/token", project=PROJECT)
    return service_account.Credentials.from_service_account_info(info, scopes=SCOPES)


def test_anthropic_vertex_gets_a_token_and_calls_raw_predict(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=11, completion_tokens=3)
    client = anthropic.AnthropicVertex(
        region=REGION,
        project_id=PROJECT,
        credentials=credentials(upstream),
        base_url=upstream.url + "/v1",
        max_retries=0,
    )
    reply = client.messages.create(
        model="claude-sonnet-4-5@20250929", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.content[0].text and reply.usage.input_tokens == 11
    path = f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/claude-sonnet-4-5@20250929"
    seen = upstream.last(path + ":rawPredict")
    assert "model" not in seen["body"] and seen["body"]["anthropic_version"]
    with client.messages.stream(
        model="claude-sonnet-4-5@20250929", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert "".join(stream.text_stream)
        assert stream.get_final_message().usage.output_tokens == 3
    assert upstream.stats()["token_grants"] == 1  # the SDK's token was reused


def test_the_openai_sdk_calls_vertex_gemini_with_the_access_token(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=20, completion_tokens=5, thoughts_tokens=30, cached_tokens=8)
    creds = credentials(upstream)
    creds.refresh(google.auth.transport.requests.Request())
    base = f"{upstream.url}/v1/projects/{PROJECT}/locations/{REGION}/endpoints/openapi"
    client = openai.OpenAI(base_url=base, api_key=creds.token, max_retries=0)
    reply = client.chat.completions.create(
        model="google/gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}], max_tokens=100
    )
    assert reply.usage.total_tokens == 55 and reply.usage.prompt_tokens_details.cached_tokens == 8
    chunks = list(
        client.chat.completions.create(
            model="google/gemini-2.5-flash",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 5


def test_vertex_refuses_a_call_without_a_token_or_with_a_forged_assertion(upstream):
    upstream.reset()
    url = f"{upstream.url}/v1/projects/{PROJECT}/locations/{REGION}/endpoints/openapi/chat/completions"
    refused = httpx.post(url, json={"model": "google/gemini-2.5-flash"}, headers={"authorization": "Bearer nope"})
    assert refused.status_code == 401 and refused.json()["error"]["status"] == "UNAUTHENTICATED"
    forged = httpx.post(
        upstream.url + "/token",
        data={"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": "a.b.c"},
    )
    assert forged.status_code == 400 and forged.json()["error"] == "invalid_grant"
    assert upstream.stats()["requests"] == 0
