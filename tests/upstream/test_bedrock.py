"""The fake's Bedrock format, checked with AWS's own SDK (boto3's bedrock-runtime client) and
Anthropic's AnthropicBedrock client pointed at it: if they can call it, sign for it and decode its
event stream, the fake speaks the format. Plain pytest: no database, no Django."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import boto3
import botocore.exceptions
import pytest

from .bedrock import ACCESS_KEY, SECRET_KEY
from .server import UpstreamHandle, run_in_thread

MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


def runtime(upstream: UpstreamHandle, secret: str = SECRET_KEY):
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=upstream.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
    )


def test_boto3_invokes_the_model_with_a_signature_the_fake_verifies(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=12, completion_tokens=3)
    reply = runtime(upstream).invoke_model(modelId=MODEL, body=json.dumps(BODY), contentType="application/json")
    message = json.loads(reply["body"].read())
    assert message["type"] == "message" and message["model"] == MODEL
    assert (message["usage"]["input_tokens"], message["usage"]["output_tokens"]) == (12, 3)
    seen = upstream.last(f"/model/{MODEL}/invoke")
    assert seen["body"] == BODY and seen["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID")


def test_boto3_decodes_the_event_stream_with_usage_and_invocation_metrics(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=7, completion_tokens=4)
    reply = runtime(upstream).invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(BODY))
    events = [json.loads(e["chunk"]["bytes"]) for e in reply["body"]]
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop" and "content_block_delta" in types
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 4
    assert events[0]["message"]["usage"]["input_tokens"] == 7


def test_a_wrong_secret_or_an_extraneous_model_field_is_refused_as_bedrock_does(upstream):
    upstream.reset()
    with pytest.raises(botocore.exceptions.ClientError) as wrong:
        runtime(upstream, secret="not-the-secret").invoke_model(modelId=MODEL, body=json.dumps(BODY))
    assert wrong.value.response["Error"]["Code"] == "InvalidSignatureException"
    with pytest.raises(botocore.exceptions.ClientError) as extra:
        runtime(upstream).invoke_model(modelId=MODEL, body=json.dumps({**BODY, "model": MODEL}))
    assert extra.value.response["Error"]["Code"] == "ValidationException"
    assert upstream.stats()["requests"] == 0  # refused before any handler ran


def test_anthropic_bedrock_client_calls_and_streams(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=9, completion_tokens=2)
    client = anthropic.AnthropicBedrock(
        aws_access_key=ACCESS_KEY,
        aws_secret_key=SECRET_KEY,
        aws_region="us-east-1",
        base_url=upstream.url,
        max_retries=0,
    )
    reply = client.messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].text and reply.usage.input_tokens == 9
    with client.messages.stream(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.usage.output_tokens == 2
