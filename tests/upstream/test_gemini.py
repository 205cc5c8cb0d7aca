"""The fake's Gemini OpenAI-compatible format, checked with the official OpenAI client pointed at
it as Google documents (base_url .../v1beta/openai/, the Gemini API key as api_key): if the SDK
can call it, the fake speaks the format. Plain pytest: no database, no Django."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from .server import UpstreamHandle, run_in_thread

CHAT = "/v1beta/openai/chat/completions"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


def gemini(upstream: UpstreamHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.url + "/v1beta/openai/", api_key="gemini-key", max_retries=0)


def test_the_sdk_calls_chat_completions_with_the_key_as_a_bearer_token(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=12, completion_tokens=3, thoughts_tokens=40)
    reply = gemini(upstream).chat.completions.create(
        model="gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}], reasoning_effort="low"
    )
    assert reply.choices[0].message.content and reply.model == "gemini-2.5-flash"
    # Gemini's thinking tokens appear in the total only.
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (12, 3, 55)
    seen = upstream.last(CHAT)
    assert seen["headers"]["authorization"] == "Bearer gemini-key"
    assert seen["body"]["reasoning_effort"] == "low"


def test_the_sdk_streams_with_usage_and_embeds(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=7, completion_tokens=4)
    chunks = list(
        gemini(upstream).chat.completions.create(
            model="gemini-2.5-flash",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 4
    vectors = gemini(upstream).embeddings.create(model="gemini-embedding-001", input=["a", "b"])
    assert len(vectors.data) == 2
    assert upstream.last("/v1beta/openai/embeddings")["headers"]["authorization"] == "Bearer gemini-key"


def test_gemini_refuses_a_call_without_a_key_or_on_an_unknown_path(upstream):
    upstream.reset()
    unauthorized = httpx.post(upstream.url + CHAT, json={"messages": []})
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["status"] == "UNAUTHENTICATED"
    unknown = httpx.post(upstream.url + "/v1beta/openai/completions", headers={"authorization": "Bearer k"}, json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
    assert upstream.stats()["requests"] == 0  # refused before any handler ran
