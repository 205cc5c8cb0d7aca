"""OpenAI-compatible providers, one row each: a connection kind whose base URL, extra headers and
model naming come from this table, so a connection to one needs only its key.

Each is a `Connection.Kind` (tests/catalog/test_presets.py checks the two agree) served by one
adapter (gateway/providers/presets.py). A connection's own base URL wins over the preset's (a
region, a proxy, a self-hosted server elsewhere), and every base URL, the preset's too, goes
through the destination rules: the local servers' defaults (vLLM, Ollama) are refused unless the
operator allows their network (CAPGATE_UPSTREAM_ALLOWED_NETWORKS).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    kind: str
    title: str
    base_url: str
    # How a catalog model is named upstream when its name has no vendor part ("/"):
    # "as_is", "vendor/name" (the catalog provider's slug, mapped by `vendors`), or a template
    # with {name}.
    naming: str = "as_is"
    vendors: dict[str, str] = field(default_factory=dict)
    # Endpoints served in OpenAI's format.
    endpoints: frozenset[str] = frozenset({"chat"})
    # The parameter an output ceiling goes in: several servers know only max_tokens.
    max_tokens_param: str = "max_tokens"
    needs_key: bool = True
    # Extra headers: (header, connection option it is read from). Sent only when set.
    headers: tuple[tuple[str, str], ...] = ()
    docs: str = ""


PRESETS: dict[str, Preset] = {
    p.kind: p
    for p in (
        Preset("groq", "Groq", "https://api.groq.com/openai/v1", max_tokens_param="max_completion_tokens"),
        Preset("mistral", "Mistral AI", "https://api.mistral.ai/v1", endpoints=frozenset({"chat", "embeddings"})),
        Preset("deepseek", "DeepSeek", "https://api.deepseek.com/v1"),
        Preset("xai", "xAI", "https://api.x.ai/v1", max_tokens_param="max_completion_tokens"),
        Preset("together", "Together AI", "https://api.together.xyz/v1", endpoints=frozenset({"chat", "embeddings"})),
        Preset(
            "fireworks",
            "Fireworks AI",
            "https://api.fireworks.ai/inference/v1",
            naming="accounts/fireworks/models/{name}",
            endpoints=frozenset({"chat", "embeddings"}),
        ),
        Preset(
            "openrouter",
            "OpenRouter",
            "https://openrouter.ai/api/v1",
            naming="vendor/name",
            # genai-prices' provider slugs where OpenRouter names the vendor otherwise.
            vendors={"mistral": "mistralai", "meta": "meta-llama", "moonshotai": "moonshotai", "zai": "z-ai"},
            # OpenRouter's app attribution headers, from the connection's options.
            headers=(("http-referer", "app_url"), ("x-title", "app_name")),
        ),
        Preset(
            "vllm",
            "vLLM (self-hosted)",
            "http://localhost:8000/v1",
            endpoints=frozenset({"chat", "embeddings"}),
            needs_key=False,
        ),
        Preset(
            "ollama",
            "Ollama (self-hosted)",
            "http://localhost:11434/v1",
            endpoints=frozenset({"chat", "embeddings"}),
            needs_key=False,
        ),
    )
}


def upstream_model(preset: Preset, *, provider_slug: str, name: str) -> str:
    """The id the preset's provider knows a catalog model by. A name that already names its
    vendor ("meta-llama/Llama-3.3-70B-Instruct") is sent as it is."""
    if "/" in name or preset.naming == "as_is":
        return name
    if preset.naming == "vendor/name":
        return f"{preset.vendors.get(provider_slug, provider_slug)}/{name}"
    return preset.naming.format(name=name)
