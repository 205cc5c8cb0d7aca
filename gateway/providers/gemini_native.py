"""Gemini's native API: a `gemini` connection with `options.api: "native"` is called through
this adapter (Gemini.variant); its endpoint format is "gemini", which no client endpoint speaks,
so every request reaching it is translated (gateway/translate/gemini.py).

- `POST {base}/v1beta/models/{model}:generateContent`, or `:streamGenerateContent?alt=sse` for
  a stream (SSE whose events are partial GenerateContentResponse objects); `{base}` is
  `https://generativelanguage.googleapis.com` or the connection's base URL;
- the API key in `x-goog-api-key`;
- the body a generateContent request (gateway/translate/gemini.py makes it from a chat or
  messages request): the gateway's own fields (`model`, `stream`, an injected output ceiling
  `maxOutputTokens`) are moved where Gemini takes them, the URL and `generationConfig`;
- usage from `usageMetadata`: `promptTokenCount` (which includes `cachedContentTokenCount`)
  plus `toolUsePromptTokenCount` is the input, the cached part billed at the cache-read rate;
  `candidatesTokenCount` plus `thoughtsTokenCount` the output. A stream's counts are cumulative:
  the last event's are the call's, and they are final only once a candidate has finished.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from catalog.pricing import Usage
from gateway.providers.base import Adapter
from gateway.providers.usage import StreamUsage

if TYPE_CHECKING:
    from gateway.admission.routing import Target

FORMAT = "gemini"
NATIVE_BASE_URL = "https://generativelanguage.googleapis.com"
# Modalities Gemini prices at their own rates, which the catalog's token prices do not carry.
_PRICED_MODALITIES = {"TEXT", "IMAGE"}


def url(target: Target, model_id: str, *, stream: bool) -> str:
    base = httpx.URL(target.connection.base_url or NATIVE_BASE_URL)
    prefix = base.raw_path.decode("ascii").partition("?")[0].rstrip("/")
    for suffix in ("/v1beta/openai", "/v1beta"):  # accept the API's own base URLs too
        prefix = prefix.removesuffix(suffix)
    model = quote(model_id.removeprefix("models/"), safe="-._")
    action = "streamGenerateContent" if stream else "generateContent"
    path = f"{prefix}/v1beta/models/{model}:{action}" + ("?alt=sse" if stream else "")
    return str(base.copy_with(raw_path=path.encode("ascii"), fragment=None))  # raw_path carries the query


def native_body(body: dict) -> dict:
    """The generateContent body: the gateway's top-level fields moved where Gemini takes them."""
    out = {k: v for k, v in body.items() if k not in ("model", "stream", "maxOutputTokens")}
    if body.get("maxOutputTokens") is not None:
        out["generationConfig"] = {**(body.get("generationConfig") or {}), "maxOutputTokens": body["maxOutputTokens"]}
    return out


def _count(d: object, key: str) -> int:
    value = d.get(key) if isinstance(d, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _unpriced_modalities(u: dict) -> list[str]:
    out = []
    for key in ("promptTokensDetails", "candidatesTokensDetails", "toolUsePromptTokensDetails"):
        for detail in u.get(key) or []:
            modality = detail.get("modality") if isinstance(detail, dict) else None
            if modality and modality not in _PRICED_MODALITIES and _count(detail, "tokenCount"):
                out.append(f"usageMetadata.{key}.{modality}={detail['tokenCount']}")
    return out


def usage_gemini(u: object) -> Usage | None:
    if not isinstance(u, dict):
        return None
    cached = _count(u, "cachedContentTokenCount")
    prompt = _count(u, "promptTokenCount") + _count(u, "toolUsePromptTokenCount")
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=_count(u, "candidatesTokenCount") + _count(u, "thoughtsTokenCount"),
        cache_read_tokens=cached,
        unpriced=tuple(_unpriced_modalities(u)),
    )


def usage_from_body(data: bytes) -> tuple[Usage | None, str]:
    try:
        answer = json.loads(data)
    except ValueError:
        return None, ""
    if not isinstance(answer, dict):
        return None, ""
    return usage_gemini(answer.get("usageMetadata")), str(answer.get("modelVersion") or "")


class GeminiStreamUsage(StreamUsage):
    """The last usageMetadata of a streamGenerateContent stream, kept once a candidate has
    finished (a stream cut before that has no final count: charged at its worst case)."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._latest: object = None
        self._finished = False

    def feed(self, data: bytes) -> bool:
        if b"usageMetadata" not in data and b"finishReason" not in data:
            return False
        event = json.loads(data)
        if not isinstance(event, dict):
            return False
        if event.get("usageMetadata") is not None:
            self._latest = event["usageMetadata"]
        self.model = str(event.get("modelVersion") or self.model)
        if any(isinstance(c, dict) and c.get("finishReason") for c in event.get("candidates") or []):
            self._finished = True
        if (event.get("promptFeedback") or {}).get("blockReason"):  # the prompt was blocked: no answer follows
            self._finished = True
        if self._finished:
            self.usage = usage_gemini(self._latest)
        return False


class GeminiNative(Adapter):
    kind = "gemini"
    endpoints = frozenset({FORMAT})
    default_base_url = NATIVE_BASE_URL

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        return url(target, self.model_id(target), stream=stream)

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        headers["x-goog-api-key"] = target.connection.plain_secret

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        return native_body(body)

    def output_param(self, target: Target, endpoint: str) -> str:
        return "maxOutputTokens"

    def usage_from_body(self, endpoint: str, data: bytes) -> tuple[Usage | None, str]:
        return usage_from_body(data)

    def stream_usage(self, endpoint: str) -> StreamUsage:
        return GeminiStreamUsage()


NATIVE = GeminiNative()
