"""Amazon Bedrock's Converse API wire format, answered by the fake with its own knobs.

- `POST /model/{modelId}/converse` answers Converse's JSON (`output.message`, `stopReason`,
  `usage`, `metrics`); `POST /model/{modelId}/converse-stream` answers an AWS event stream
  (application/vnd.amazon.eventstream) of messageStart, contentBlockDelta (text), contentBlockStart
  / contentBlockDelta / contentBlockStop (a tool use), messageStop and metadata (the usage), each
  message named by its `:event-type` header with the event's JSON as payload.
- The request is SigV4-signed as InvokeModel's (tests/upstream/bedrock.py verifies it) and is
  checked against botocore's own service model for ConverseRequest (unknown or missing fields,
  wrong types, a union with other than one member, blobs that are not base64), refused with
  400 ValidationException as Bedrock refuses it. Errors are `{"message": ...}` with the exception
  named in `x-amzn-ErrorType`.
- Knobs: prompt_tokens -> inputTokens, completion_tokens -> outputTokens ("max" echoes
  inferenceConfig.maxTokens), cached_tokens -> cacheReadInputTokens, cache_write_tokens ->
  cacheWriteInputTokens, tool_call (the first tool is called with TOOL_ARGUMENTS), tier (the
  serviceTier reported when the request names none), and the fail modes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import botocore.session
from botocore.validate import ParamValidator

from tests.upstream import bedrock

if TYPE_CHECKING:
    from tests.upstream.server import _Exchange

PATH = re.compile(r"/model/(?P<model>[^/]+)/(?P<action>converse|converse-stream)")
ROUTE = "/converse"  # the handler's key in the fake's route table
# Converse's exceptions by the status the fake's fail modes answer with.
EXCEPTIONS = {
    400: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


@functools.lru_cache(maxsize=1)
def _input_shape() -> Any:
    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    return model.operation_model("Converse").input_shape


def _from_wire(value: Any, shape: Any) -> Any:
    """JSON as sent on the wire as the Python parameters botocore validates (blobs decoded)."""
    if shape.type_name == "blob":
        if not isinstance(value, str):
            return value
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"Invalid base64 for {shape.name}") from None
    if shape.type_name == "structure" and not shape.metadata.get("document") and isinstance(value, dict):
        return {k: _from_wire(v, shape.members[k]) if k in shape.members else v for k, v in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_from_wire(v, shape.member) for v in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {k: _from_wire(v, shape.value) for k, v in value.items()}
    return value


def check(model_id: str, body: Any) -> str | None:
    """What botocore's service model says is wrong with a ConverseRequest, or None."""
    if not isinstance(body, dict):
        return "Malformed input request: expected an object"
    try:
        params = _from_wire({**body, "modelId": model_id}, _input_shape())
    except ValueError as exc:
        return str(exc)
    report = ParamValidator().validate(params, _input_shape())
    return report.generate_report() if report.has_errors() else None


def to_v1(
    method: str, host: str, raw_path: str, query: str, headers: dict[str, str], raw: bytes
) -> tuple[dict[str, Any], tuple[int, dict[str, str], dict[str, Any]] | None]:
    """(the Converse body with `model` and `stream` added for the handler, or the refusal)."""
    match = PATH.fullmatch(raw_path)
    try:
        if match is None or method != "POST":
            raise bedrock.Refusal(404, "UnknownOperationException", f"Unknown operation {method} {raw_path}")
        bedrock.verify(method, host, raw_path, query, headers, raw)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise bedrock.Refusal(400, "ValidationException", "Malformed JSON") from None
        problem = check(unquote(match["model"]), body)
        if problem is not None:
            raise bedrock.Refusal(400, "ValidationException", problem)
    except bedrock.Refusal as refusal:
        return {}, (refusal.status, {"x-amzn-errortype": refusal.error_type}, {"message": refusal.message})
    return {**body, "model": unquote(match["model"]), "stream": match["action"] == "converse-stream"}, None


def error(status: int, message: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    return status, {"x-amzn-errortype": EXCEPTIONS.get(status, "InternalServerException")}, {"message": message}


def encode_frame(frame: str) -> bytes:
    """One `name\\n{json}` frame of the handler as an AWS event stream message."""
    name, _, payload = frame.partition("\n")
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return bedrock.message(headers, payload.strip().encode())


def _tool(body: dict[str, Any], knobs: dict[str, Any]) -> str | None:
    tools = (body.get("toolConfig") or {}).get("tools") or []
    specs = [t["toolSpec"] for t in tools if isinstance(t, dict) and "toolSpec" in t]
    return str(specs[0]["name"]) if knobs["tool_call"] and specs else None


async def handle(ex: _Exchange) -> None:
    from tests.upstream.server import TOOL_ARGUMENTS, _completion_tokens, _pieces

    body, knobs = ex.body, ex.knobs
    pieces = _pieces(knobs["chunks"])
    output = _completion_tokens(knobs, {"max_tokens": (body.get("inferenceConfig") or {}).get("maxTokens")})
    usage: dict[str, Any] = {"inputTokens": knobs["prompt_tokens"], "outputTokens": output}
    usage |= {"cacheReadInputTokens": knobs["cached_tokens"], "cacheWriteInputTokens": knobs["cache_write_tokens"]}
    usage["totalTokens"] = sum(usage.values())
    tier = (body.get("serviceTier") or {}).get("type") or knobs["tier"] or "default"
    tool = _tool(body, knobs)
    use = {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": tool, "input": TOOL_ARGUMENTS}
    stop = "tool_use" if tool else "end_turn"
    if not body.get("stream"):
        content: list[dict[str, Any]] = [{"text": "".join(pieces)}, *([{"toolUse": use}] if tool else [])]
        answer: dict[str, Any] = {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": usage,
            "metrics": {"latencyMs": 42},
            "serviceTier": {"type": tier},
        }
        await ex.respond(answer)  # fail=no_usage drops `usage`
        return
    events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    events += [("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}) for p in pieces]
    events.append(("contentBlockStop", {"contentBlockIndex": 0}))
    if tool:
        arguments = json.dumps(TOOL_ARGUMENTS)
        halves = [arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]]
        start = {"toolUse": {"toolUseId": use["toolUseId"], "name": tool}}
        events.append(("contentBlockStart", {"contentBlockIndex": 1, "start": start}))
        events += [("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": h}}}) for h in halves]
        events.append(("contentBlockStop", {"contentBlockIndex": 1}))
    events.append(("messageStop", {"stopReason": stop}))
    if ex.fail != "no_usage":
        metadata = {"usage": usage, "metrics": {"latencyMs": 42}, "serviceTier": {"type": tier}}
        events.append(("metadata", metadata))
    await ex.stream([f"{name}\n{json.dumps(payload)}" for name, payload in events], drop_at=3)
