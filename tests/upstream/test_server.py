"""Tests for the fake upstream itself. Plain pytest: no database, no Django."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from .server import UpstreamHandle, run_in_thread

pytestmark: list[pytest.MarkDecorator] = []

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


@pytest.fixture
def client(upstream: UpstreamHandle) -> Iterator[httpx.Client]:
    upstream.reset()
    with httpx.Client(base_url=upstream.url, timeout=10) as c:
        yield c


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], **extra}


def anthropic_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def sse_data(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_chat_non_stream_shape_and_usage(client: httpx.Client) -> None:
    r = client.post(CHAT, json=chat_body(n=2))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "gpt-test"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_chat_stream_with_include_usage(client: httpx.Client) -> None:
    r = client.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True}))
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(contents) == 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_chat_stream_without_include_usage(client: httpx.Client) -> None:
    r = client.post(CHAT, json=chat_body(stream=True), headers={"X-Upstream-Chunks": "2"})
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) == 4  # role, 2 content, finish
    assert all(c["choices"] and "usage" not in c for c in chunks)


def test_anthropic_non_stream(client: httpx.Client) -> None:
    client.post("/_control", json={"completion_tokens": "max", "overbill": 2})
    body = client.post(MESSAGES, json=anthropic_body()).json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == "claude-test"
    assert body["content"][0]["type"] == "text" and body["stop_reason"] == "end_turn"
    assert body["usage"] == {"input_tokens": 10, "output_tokens": 128,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                             "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                             "server_tool_use": {"web_search_requests": 0},
                             "service_tier": "standard"}  # fmt: skip


def test_anthropic_stream_event_sequence(client: httpx.Client) -> None:
    r = client.post(MESSAGES, json=anthropic_body(stream=True), headers={"X-Upstream-Completion-Tokens": "7"})
    events = []
    for block in r.text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {payload['type']}"
        events.append(payload)
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "ping",
        *["content_block_delta"] * 4,
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[0]["message"]["usage"]["input_tokens"] == 10
    assert events[0]["message"]["usage"]["output_tokens"] == 1
    assert events[3]["delta"]["type"] == "text_delta"
    assert events[-2] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                          "usage": {"output_tokens": 7, "server_tool_use": {"web_search_requests": 0}}}  # fmt: skip


def test_fail_500_openai_and_anthropic_shapes(client: httpx.Client) -> None:
    client.post("/_control", json={"fail": "500"})
    r = client.post(CHAT, json=chat_body())
    assert r.status_code == 500
    assert set(r.json()["error"]) == {"message", "type", "code", "param"}
    r = client.post(MESSAGES, json=anthropic_body())
    assert r.status_code == 500
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"


def test_fail_close_is_a_transport_error(client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(CHAT, json=chat_body(), headers={"X-Upstream-Fail": "close"})
    assert client.get("/_stats").json()["completed"] == 0


def test_drop_mid_stream_has_no_done(client: httpx.Client) -> None:
    received: list[str] = []
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", CHAT, json=body, headers={"X-Upstream-Fail": "drop_mid_stream"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                received.append(line)
    data = sse_data("\n".join(received))
    assert len(data) == 3 and "[DONE]" not in data  # role chunk + two content chunks
    assert all("usage" not in json.loads(d) or json.loads(d)["usage"] is None for d in data)


def test_no_usage_stream_ends_normally(client: httpx.Client) -> None:
    client.post("/_control", json={"fail": "no_usage"})
    data = sse_data(client.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True})).text)
    assert data[-1] == "[DONE]" and all(json.loads(d)["choices"] for d in data[:-1])
    text = client.post(MESSAGES, json=anthropic_body(stream=True)).text
    assert "message_stop" in text and "output_tokens" not in text


def test_fail_every_third_request(client: httpx.Client) -> None:
    client.post("/_control", json={"fail": "429", "fail_every": 3})
    statuses = [client.post(CHAT, json=chat_body()).status_code for _ in range(6)]
    assert statuses == [200, 200, 429, 200, 200, 429]


def test_stats_counts(client: httpx.Client) -> None:
    client.post(CHAT, json=chat_body())
    client.post(MESSAGES, json=anthropic_body(stream=True))
    client.post("/v1/embeddings", json={"model": "e", "input": ["a", "b"]})
    client.get("/v1/models")
    client.post(CHAT, json=chat_body(), headers={"X-Upstream-Fail": "503"})
    # A streaming client that hangs up early is counted as disconnected.
    with client.stream("POST", CHAT, json=chat_body(stream=True),
                       headers={"X-Upstream-Chunk-Delay-Ms": "200", "X-Upstream-Chunks": "50"}) as r:  # fmt: skip
        next(r.iter_lines())
    for _ in range(50):
        stats = client.get("/_stats").json()
        if stats["disconnected"]:
            break
        time.sleep(0.05)
    assert stats == {
        "requests": 6,
        "by_path": {CHAT: 3, MESSAGES: 1, "/v1/embeddings": 1, "/v1/models": 1},
        "in_flight": 0,
        "completed": 5,
        "disconnected": 1,
        "token_grants": 0,  # Vertex's OAuth token endpoint (tests/upstream/vertex.py)
    }


def test_header_overrides_global_knob(client: httpx.Client) -> None:
    client.post("/_control", json={"completion_tokens": 100, "fail": "500"})
    r = client.post(CHAT, json=chat_body(), headers={"X-Upstream-Completion-Tokens": "3", "X-Upstream-Fail": ""})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 3
    r = client.post(CHAT, json=chat_body(), headers={"X-Upstream-Fail": "nonsense"})
    assert r.status_code == 400


def test_delay_and_max_tokens_knobs(client: httpx.Client) -> None:
    client.post("/_control", json={"completion_tokens": "max", "ignore_max_tokens": True})
    r = client.post(CHAT, json=chat_body(max_completion_tokens=20), headers={"X-Upstream-Delay-Ms": "50"})
    assert r.json()["usage"]["completion_tokens"] == 80
    assert r.elapsed.total_seconds() >= 0.05


def test_stall_until_client_gives_up(client: httpx.Client) -> None:
    with pytest.raises(httpx.ReadTimeout):
        client.post(CHAT, json=chat_body(), headers={"X-Upstream-Fail": "stall"}, timeout=0.3)


def test_last_returns_forwarded_body(client: httpx.Client) -> None:
    sent = chat_body(max_tokens=33, stream=True, stream_options={"include_usage": True})
    client.post(CHAT, json=sent, headers={"X-Custom": "yes"})
    last = client.get("/_last", params={"path": CHAT}).json()
    assert last["body"] == sent and last["headers"]["x-custom"] == "yes"
    assert client.get("/_last", params={"path": MESSAGES}).status_code == 404


def test_embeddings(client: httpx.Client) -> None:
    body = client.post("/v1/embeddings", json={"model": "e", "input": "hello"}).json()
    assert body["object"] == "list" and len(body["data"]) == 1
    assert len(body["data"][0]["embedding"]) == 8
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10}


def test_openai_sdk(upstream: UpstreamHandle) -> None:
    upstream.reset()
    sdk = openai.OpenAI(base_url=upstream.url + "/v1", api_key="x", max_retries=0)
    done = sdk.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    assert done.choices[0].message.content and done.usage is not None and done.usage.total_tokens == 15
    stream = sdk.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    emb = sdk.embeddings.create(model="e", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[1].embedding) == 8


def test_anthropic_sdk(upstream: UpstreamHandle) -> None:
    upstream.reset()
    sdk = anthropic.Anthropic(base_url=upstream.url, api_key="x", max_retries=0)
    msgs: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    done = sdk.messages.create(model="claude-test", max_tokens=32, messages=msgs)
    assert done.content[0].type == "text" and done.usage.output_tokens == 5
    with sdk.messages.stream(model="claude-test", max_tokens=32, messages=msgs) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == done.content[0].text
    assert final.usage.input_tokens == 10 and final.usage.output_tokens == 5
    assert final.stop_reason == "end_turn"
    assert upstream.last(MESSAGES)["body"]["stream"] is True


def test_non_stream_drop_mid_stream_truncates_body(client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(MESSAGES, json=anthropic_body(), headers={"X-Upstream-Fail": "drop_mid_stream"})


def test_sdk_sees_connection_error_on_close(upstream: UpstreamHandle) -> None:
    upstream.reset()
    upstream.control(fail="close")
    sdk = openai.OpenAI(base_url=upstream.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert upstream.stats()["requests"] == 1
    upstream.reset()


def test_runs_as_a_module() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tests.upstream.server", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=root)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert r.json()["object"] == "list"
    finally:
        proc.terminate()
        proc.wait(10)
