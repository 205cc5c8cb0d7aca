"""Amazon Bedrock's InvokeModel wire format (Claude's Messages body) in front of the fake's
Anthropic handler.

- `POST /model/{modelId}/invoke` answers Anthropic's message JSON; `POST
  /model/{modelId}/invoke-with-response-stream` answers an AWS event stream
  (application/vnd.amazon.eventstream): one `chunk` event per Anthropic stream event, its JSON
  base64 in `{"bytes": ...}`; the last (message_stop) carries `amazon-bedrock-invocationMetrics`.
- The body is Anthropic's without `model` or `stream` (the path says both) and with
  `anthropic_version`; betas go in `anthropic_beta`.
- Every request is SigV4-signed for service `bedrock`: the fake recomputes the signature with
  botocore from the request it received and the secret of the access key (`KEYS`), so a request
  whose signed path, headers or body differ from what was sent is refused, as AWS refuses it
  (403, `x-amzn-ErrorType: InvalidSignatureException`). Errors are Bedrock's `{"message": ...}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from typing import Any
from urllib.parse import unquote

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

PREFIX = "/model/"
_PATH = re.compile(r"/model/(?P<model>[^/]+)/(?P<action>invoke|invoke-with-response-stream)")
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<cred>[^,]+), SignedHeaders=(?P<signed>[^,]+), Signature=(?P<sig>\w+)"
)
ACCESS_KEY = "AKIDCAPGATETEST0001"
SECRET_KEY = "capgate/test/secret/key/for/the/fake/bedrock"
KEYS = {ACCESS_KEY: SECRET_KEY}  # access key id -> secret key the fake accepts
EVENT_STREAM = "application/vnd.amazon.eventstream"


class Refusal(Exception):
    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def verify(method: str, host: str, raw_path: str, query: str, headers: dict[str, str], raw: bytes) -> str:
    """The region the request was signed for, or Refusal."""
    auth = _AUTH.fullmatch(headers.get("authorization", ""))
    if auth is None or "x-amz-date" not in headers:
        raise Refusal(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    key_id, date, region, service, terminal = auth["cred"].split("/")
    secret = KEYS.get(key_id)
    if secret is None:
        raise Refusal(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
    if service != "bedrock" or terminal != "aws4_request" or not headers["x-amz-date"].startswith(date):
        raise Refusal(403, "InvalidSignatureException", "Credential should be scoped to a valid service and date.")
    signed = auth["signed"].split(";")
    url = f"http://{host}{raw_path}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, data=raw, headers={h: headers.get(h, "") for h in signed})
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials(key_id, secret, headers.get("x-amz-security-token")), "bedrock", region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if expected != auth["sig"]:
        raise Refusal(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        )
    return region


def to_v1(
    method: str, host: str, raw_path: str, query: str, headers: dict[str, str], raw: bytes
) -> tuple[dict[str, Any], tuple[int, dict[str, str], dict[str, Any]] | None]:
    """(the Anthropic body it serves, or the (status, headers, body) Bedrock answers)."""
    match = _PATH.fullmatch(raw_path)
    try:
        if match is None or method != "POST":
            raise Refusal(404, "UnknownOperationException", f"Unknown operation {method} {raw_path}")
        verify(method, host, raw_path, query, headers, raw)
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise Refusal(400, "ValidationException", "Malformed input request: expected an object")
        for field in ("model", "stream"):
            if field in body:
                raise Refusal(400, "ValidationException", f"Malformed input request: extraneous key [{field}]")
        if not str(body.get("anthropic_version", "")):
            raise Refusal(400, "ValidationException", "Malformed input request: required key [anthropic_version]")
    except (Refusal, ValueError) as exc:
        refusal = exc if isinstance(exc, Refusal) else Refusal(400, "ValidationException", "Malformed JSON")
        return {}, (refusal.status, {"x-amzn-errortype": refusal.error_type}, {"message": refusal.message})
    stream = match["action"] == "invoke-with-response-stream"
    return {**body, "model": unquote(match["model"]), "stream": stream}, None


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event stream message: prelude (total and headers length, CRC), string headers,
    payload, message CRC."""
    encoded = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        encoded += struct.pack("!B", len(n)) + n + b"\x07" + struct.pack("!H", len(v)) + v
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + encoded + payload
    return body + struct.pack("!I", binascii.crc32(body) & 0xFFFFFFFF)


class Encoder:
    """Turns the fake's Anthropic SSE frames into Bedrock chunk events, adding the invocation
    metrics to message_stop from the usage the stream reported."""

    def __init__(self) -> None:
        self.input = self.output = 0
        self.seen_usage = False

    def __call__(self, frame: str) -> bytes:
        data = next((line[5:].strip() for line in frame.splitlines() if line.startswith("data:")), "")
        event = json.loads(data)
        if event.get("type") == "message_start" and "usage" in event["message"]:
            self.input, self.seen_usage = event["message"]["usage"].get("input_tokens", 0), True
        elif event.get("type") == "message_delta" and "usage" in event:
            self.output = event["usage"].get("output_tokens", 0)
        elif event.get("type") == "message_stop" and self.seen_usage:
            event["amazon-bedrock-invocationMetrics"] = {
                "inputTokenCount": self.input,
                "outputTokenCount": self.output,
                "invocationLatency": 42,
                "firstByteLatency": 7,
            }
        payload = json.dumps({"bytes": base64.b64encode(json.dumps(event).encode()).decode()}).encode()
        headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
        return message(headers, payload)
