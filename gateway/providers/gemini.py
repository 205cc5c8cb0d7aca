"""The Gemini API, through its OpenAI-compatible endpoint or (`options.api: "native"`) its own
generateContent API.

- OpenAI-compatible (the default): `chat/completions` and `embeddings` directly under the base
  URL (Google's when none is set), the API key as a bearer token, OpenAI's usage fields (thinking
  tokens appear in `total_tokens` only; gateway/providers/usage.py bills them as output).
- Native: format `gemini` only (gateway/providers/gemini_native.py): chat and messages requests
  reach it translated (gateway/translate/gemini.py), the key in `x-goog-api-key`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.pricing import Usage
from gateway.providers import gemini_native as native
from gateway.providers.base import Adapter, joined_url, register
from gateway.providers.usage import StreamUsage

if TYPE_CHECKING:
    from gateway.admission.routing import Target

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai/"
PATHS = {"chat": "chat/completions", "embeddings": "embeddings"}
NATIVE_FORMATS = frozenset({native.FORMAT})


class Gemini(Adapter):
    endpoints = frozenset(PATHS)
    default_base_url = GEMINI_BASE_URL

    def formats(self, target: Target) -> frozenset[str]:
        return NATIVE_FORMATS if native.is_native(target) else self.endpoints

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        if endpoint == native.FORMAT:
            return native.url(target, self.model_id(target), stream=stream)
        return joined_url(target.connection.base_url or GEMINI_BASE_URL, PATHS[endpoint])

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        if native.is_native(target):
            headers["x-goog-api-key"] = target.connection.plain_secret
        else:
            super().auth(target, client_headers, headers)

    def body(self, target: Target, endpoint: str, body: dict, *, stream: bool) -> dict:
        return native.body(body) if endpoint == native.FORMAT else body

    def output_param(self, target: Target, endpoint: str) -> str:
        return "maxOutputTokens" if endpoint == native.FORMAT else super().output_param(target, endpoint)

    def usage_from_body(self, endpoint: str, data: bytes) -> tuple[Usage | None, str]:
        return native.usage_from_body(data) if endpoint == native.FORMAT else super().usage_from_body(endpoint, data)

    def stream_usage(self, endpoint: str) -> StreamUsage:
        return native.GeminiStreamUsage() if endpoint == native.FORMAT else super().stream_usage(endpoint)


register("gemini", Gemini())
