"""The fake's Converse format, checked with AWS's own SDK (boto3's bedrock-runtime client, its
`converse` and `converse_stream`): if boto3 can sign for it, parse its answer into the service
model's shapes and decode its event stream, the fake speaks the format. Plain pytest: no
database, no Django."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import boto3
import botocore.exceptions
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from .bedrock import ACCESS_KEY, SECRET_KEY
from .server import TOOL_ARGUMENTS, UpstreamHandle, run_in_thread

MODEL = "meta.llama3-3-70b-instruct-v1:0"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "get_weather",
                "description": "The weather in a city",
                "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}},
            }
        }
    ],
    "toolChoice": {"any": {}},
}
MESSAGES = [
    {
        "role": "user",
        "content": [{"text": "What is the weather here?"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
    }
]


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
        config=Config(retries={"max_attempts": 1}),
    )


def test_boto3_converse_gets_the_message_tool_use_and_usage(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=12, completion_tokens=3, cached_tokens=4, cache_write_tokens=2, tool_call=True)
    reply = runtime(upstream).converse(
        modelId=MODEL,
        system=[{"text": "Answer briefly."}],
        messages=MESSAGES,
        inferenceConfig={"maxTokens": 50, "temperature": 0.5, "stopSequences": ["END"]},
        toolConfig=TOOLS,
    )
    content = reply["output"]["message"]["content"]
    assert content[0]["text"].startswith("The quick")
    assert content[1]["toolUse"]["name"] == "get_weather" and content[1]["toolUse"]["input"] == TOOL_ARGUMENTS
    assert reply["stopReason"] == "tool_use"
    usage = reply["usage"]
    assert (usage["inputTokens"], usage["outputTokens"]) == (12, 3)
    assert (usage["cacheReadInputTokens"], usage["cacheWriteInputTokens"], usage["totalTokens"]) == (4, 2, 21)
    seen = upstream.last(f"/model/{MODEL}/converse")
    # boto3 sends the image's bytes base64 in the JSON body, and the model id only in the path
    assert seen["body"]["messages"][0]["content"][1]["image"]["source"]["bytes"] == base64.b64encode(PNG).decode()
    assert "modelId" not in seen["body"] and seen["headers"]["authorization"].startswith("AWS4-HMAC-SHA256")


def test_boto3_converse_stream_decodes_the_event_sequence(upstream):
    upstream.reset()
    upstream.control(prompt_tokens=7, completion_tokens=4, tool_call=True)
    reply = runtime(upstream).converse_stream(modelId=MODEL, messages=MESSAGES, toolConfig=TOOLS)
    events = list(reply["stream"])
    names = [next(iter(e)) for e in events]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    assert {"contentBlockStart", "contentBlockDelta", "contentBlockStop"} <= set(names)
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    assert text.startswith("The quick")
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "get_weather"
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    assert (events[-1]["metadata"]["usage"]["inputTokens"], events[-1]["metadata"]["usage"]["outputTokens"]) == (7, 4)


def test_a_request_outside_the_service_model_is_refused_as_bedrock_does(upstream):
    upstream.reset()
    client = runtime(upstream)
    with pytest.raises(botocore.exceptions.ClientError) as wrong:
        runtime(upstream, secret="not-the-secret").converse(modelId=MODEL, messages=MESSAGES)
    assert wrong.value.response["Error"]["Code"] == "InvalidSignatureException"
    # boto3 validates its own parameters, so a malformed body is sent the way capgate would send it
    url = f"{upstream.url}/model/{MODEL}/converse"
    for body in (
        b'{"messages": [{"role": "user", "content": [{"text": "a", "image": {}}]}]}',  # two union members
        b'{"messages": [{"role": "user", "content": [{"text": "a"}]}], "max_tokens": 5}',  # not a Converse field
        b'{"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "@@"}}}]}]}',
    ):
        signed = AWSRequest(method="POST", url=url, data=body, headers={"content-type": "application/json"})
        SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "bedrock", "us-east-1").add_auth(signed)
        answer = httpx.post(url, content=body, headers=dict(signed.headers.items()))
        assert answer.status_code == 400 and answer.headers["x-amzn-errortype"] == "ValidationException", body
    assert upstream.stats()["requests"] == 0  # refused before any handler ran
    # the fake's failure modes answer as Converse's exceptions, which boto3 names
    upstream.control(fail="429")
    with pytest.raises(botocore.exceptions.ClientError) as throttled:
        client.converse(modelId=MODEL, messages=MESSAGES)
    assert throttled.value.response["Error"]["Code"] == "ThrottlingException"
