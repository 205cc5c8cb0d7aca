"""OpenAI: `/v1/...` under the base URL, the API key as a bearer token, usage in each endpoint's
own format. Every default of the adapter interface is OpenAI's."""

from __future__ import annotations

from gateway.providers.base import Adapter, register


class OpenAI(Adapter):
    endpoints = frozenset({"chat", "embeddings", "responses", "compact", "videos"})
    jobs = frozenset({"batches", "background"})
    default_base_url = "https://api.openai.com/v1"


register("openai", OpenAI())
