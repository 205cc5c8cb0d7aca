"""The Gemini API through its OpenAI-compatible endpoint: `chat/completions` and `embeddings`
directly under the base URL (Google's when none is set), the API key as a bearer token, OpenAI's
usage fields (thinking tokens appear in `total_tokens` only; gateway/providers/usage.py bills
them as output). A connection with `options.api: "native"` speaks Gemini's own generateContent
instead (gateway/providers/gemini_native.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.providers.base import Adapter, joined_url, register
from gateway.providers.gemini_native import NATIVE

if TYPE_CHECKING:
    from catalog.models import Connection
    from gateway.admission.routing import Target

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai/"
PATHS = {"chat": "chat/completions", "embeddings": "embeddings"}


class Gemini(Adapter):
    endpoints = frozenset(PATHS)
    default_base_url = GEMINI_BASE_URL

    def url(self, target: Target, endpoint: str, *, stream: bool = False) -> str:
        return joined_url(target.connection.base_url or GEMINI_BASE_URL, PATHS[endpoint])

    def variant(self, connection: Connection) -> Adapter:
        """A connection with `options.api: "native"` speaks generateContent; otherwise the
        OpenAI-compatible endpoint."""
        if connection.options.get("api") == "native":
            return NATIVE
        return self


register("gemini", Gemini())
