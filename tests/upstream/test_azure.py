"""The fake's Azure OpenAI format, checked with the official client (openai.AzureOpenAI): if the
SDK can call it, the fake speaks the real format. Plain pytest: no database, no Django."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from .server import UpstreamHandle, run_in_thread

VERSION = "2024-10-21"
CHAT = "/openai/deployments/prod-4o/chat/completions"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


def azure(upstream: UpstreamHandle, **kw) -> openai.AzureOpenAI:
    kw.setdefault("api_key", "az-key")
    return openai.AzureOpenAI(azure_endpoint=upstream.url, api_version=VERSION, max_retries=0, **kw)


def test_the_azure_sdk_calls_a_deployment_with_its_key_and_api_version(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=12, completion_tokens=3)
    reply = azure(upstream).chat.completions.create(model="prod-4o", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content and reply.model == "prod-4o"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (12, 3)
    seen = upstream.last(CHAT)
    assert seen["headers"]["api-key"] == "az-key" and seen["query"] == {"api-version": VERSION}


def test_the_azure_sdk_streams_with_usage_and_embeds(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=7, completion_tokens=4)
    chunks = list(
        azure(upstream).chat.completions.create(
            model="prod-4o",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 4
    vectors = azure(upstream).embeddings.create(model="embed-small", input=["a", "b"])
    assert len(vectors.data) == 2
    assert upstream.last("/openai/deployments/embed-small/embeddings")["query"] == {"api-version": VERSION}


def test_an_entra_token_is_a_bearer_token(upstream):
    upstream.reset()
    client = openai.AzureOpenAI(
        azure_endpoint=upstream.url, api_version=VERSION, azure_ad_token="entra-token", max_retries=0
    )
    client.chat.completions.create(model="prod-4o", messages=[{"role": "user", "content": "hi"}])
    assert upstream.last(CHAT)["headers"]["authorization"] == "Bearer entra-token"


def test_azure_refuses_a_call_without_credentials_or_api_version(upstream):
    upstream.reset()
    unauthorized = httpx.post(upstream.url + CHAT, params={"api-version": VERSION}, json={"messages": []})
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "401"
    unversioned = httpx.post(upstream.url + CHAT, headers={"api-key": "k"}, json={"messages": []})
    assert unversioned.status_code == 404 and unversioned.json()["error"]["message"] == "Resource not found"
    assert upstream.stats()["requests"] == 0  # refused before any handler ran
