"""OpenAI-compatible providers (Groq, Mistral, DeepSeek, xAI, Together, Fireworks, OpenRouter,
vLLM, Ollama): one adapter per row of catalog/presets.py, which says the base URL, the model
naming, the output-ceiling parameter and any extra headers. Bodies, streams and usage are OpenAI's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.presets import PRESETS, Preset, upstream_model
from gateway.providers.base import Adapter, register

if TYPE_CHECKING:
    from gateway.admission.routing import Target


class OpenAICompatible(Adapter):
    def __init__(self, preset: Preset):
        self.preset = preset
        self.endpoints = preset.endpoints
        self.default_base_url = preset.base_url
        self.max_tokens_param = preset.max_tokens_param

    def auth(self, target: Target, client_headers: dict[str, str], headers: dict[str, str]) -> None:
        super().auth(target, client_headers, headers)
        options = target.connection.options
        for header, option in self.preset.headers:
            if isinstance(options.get(option), str) and options[option]:
                headers[header] = options[option]

    def model_id(self, target: Target) -> str:
        mapped = super().model_id(target)
        if mapped != target.model.name:  # the connection's own mapping wins
            return mapped
        return upstream_model(self.preset, provider_slug=target.model.provider.slug, name=target.model.name)


for _preset in PRESETS.values():
    register(_preset.kind, OpenAICompatible(_preset))
