"""The Gemini API's native format: `POST /v1beta/models/{model}:generateContent` and
`:streamGenerateContent?alt=sse`, the key in `x-goog-api-key` (or `?key=`).

The answer is a GenerateContentResponse: `candidates` (one per `candidateCount`) whose
`content.parts` hold the text, or a `functionCall` of the first declared function when the
`tool_call` knob is on (finishReason STOP either way, as Gemini answers), and `usageMetadata`
from the knobs: `promptTokenCount` (prompt_tokens, which includes `cachedContentTokenCount`,
the cached_tokens knob), `candidatesTokenCount` (completion_tokens; "max" is the request's
`generationConfig.maxOutputTokens`), `thoughtsTokenCount` (thoughts_tokens) and their total.
A stream is SSE, each event a partial response: one text piece per event with the prompt count
so far, the last with finishReason and the whole usage. Errors are Google's shape,
`{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

PREFIX = "/v1beta/models/"
# The handler's key in the fake's route table (the model is in the path, read here).
ROUTE = "/v1beta/models/{model}:generateContent"
_PATH = re.compile(r"/v1beta/models/(?P<model>[A-Za-z0-9._-]+):(?P<action>generateContent|streamGenerateContent)")
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUSES.get(status, "UNKNOWN")}}


def parse(path: str, query: dict[str, str], headers: dict[str, str]) -> tuple[str, bool, tuple[int, Any] | None]:
    """(model, streamed, or the (status, error body) Gemini answers before any model runs)."""
    found = _PATH.fullmatch(path)
    if found is None:
        return "", False, (404, error(404, f"Method not found: {path}"))
    if not (headers.get("x-goog-api-key") or query.get("key")):
        return "", False, (403, error(403, "Method doesn't allow unregistered callers. Please use API Key."))
    stream = found["action"] == "streamGenerateContent"
    if stream and query.get("alt") != "sse":  # without alt=sse Gemini streams a JSON array
        return "", False, (400, error(400, "The fake streams Server-Sent Events only: ask with alt=sse."))
    return found["model"], stream, None


def _declared(body: dict[str, Any]) -> str | None:
    for tool in body.get("tools") or []:
        for declaration in tool.get("functionDeclarations") or [] if isinstance(tool, dict) else []:
            if isinstance(declaration, dict) and declaration.get("name"):
                return str(declaration["name"])
    return None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _check(body: dict[str, Any]) -> str | None:
    """What Gemini would refuse in the body (400), or None. Field names are proto JSON's: camelCase
    or snake_case (the SDK sends some of each)."""
    body = {_camel(k): v for k, v in body.items()}
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "contents is not specified"
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return f"contents[{i}].role: Please use a valid role: user, model."
        if not content.get("parts"):
            return f"contents[{i}].parts: must not be empty"
    config = {_camel(k): v for k, v in (body.get("generationConfig") or {}).items()}
    unknown = set(config) - {
        "maxOutputTokens",
        "stopSequences",
        "temperature",
        "topP",
        "topK",
        "seed",
        "candidateCount",
        "presencePenalty",
        "frequencyPenalty",
        "responseMimeType",
        "responseJsonSchema",
        "responseSchema",
        "thinkingConfig",
    }
    if unknown:
        return f"Invalid JSON payload received. Unknown name \"{sorted(unknown)[0]}\" at 'generation_config'"
    top = set(body) - {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings"}
    if top:
        return f'Invalid JSON payload received. Unknown name "{sorted(top)[0]}": Cannot find field.'
    return None


async def generate(ex: Any, *, model: str, stream: bool, pieces: list[str]) -> None:
    """generateContent or, with `stream`, streamGenerateContent?alt=sse."""
    body, knobs = ex.body, ex.knobs
    problem = _check(body)
    if problem is not None:
        await ex.json(400, error(400, problem))
        return
    config = body.get("generationConfig") or {}
    completion = knobs["completion_tokens"]
    if completion == "max":
        completion = config.get("maxOutputTokens") if isinstance(config.get("maxOutputTokens"), int) else 16
        if knobs["ignore_max_tokens"]:
            completion *= 4
    completion = int(completion * knobs["overbill"])
    prompt, thoughts = knobs["prompt_tokens"], knobs["thoughts_tokens"]
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": prompt + completion + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    if knobs["cached_tokens"]:
        usage["cachedContentTokenCount"] = knobs["cached_tokens"]
    function = _declared(body) if knobs["tool_call"] else None
    call = {"functionCall": {"name": function, "args": {"city": "Paris", "units": "celsius"}}}
    n = int(config.get("candidateCount") or 1)
    head = {"modelVersion": model, "responseId": uuid.uuid4().hex[:20]}

    def candidate(i: int, parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": i}
        if finish:
            out["finishReason"] = finish
        return out

    if not stream:
        parts: list[dict[str, Any]] = [call] if function else [{"text": "".join(pieces)}]
        answer = {"candidates": [candidate(i, parts, "STOP") for i in range(n)], "usageMetadata": usage, **head}
        await ex.respond(answer)
        return
    partial = {"promptTokenCount": prompt, "totalTokenCount": prompt}
    events = [
        {"candidates": [candidate(i, [{"text": p}], None) for i in range(n)], "usageMetadata": partial, **head}
        for p in pieces
    ]
    last = [call] if function else [{"text": ""}]
    events.append({"candidates": [candidate(i, last, "STOP") for i in range(n)], "usageMetadata": usage, **head})
    if ex.fail == "no_usage":
        for event in events:
            event.pop("usageMetadata")
    frames = [f"data: {json.dumps(e)}\r\n\r\n" for e in events]
    await ex.stream(frames, drop_at=2)  # after two pieces of text
