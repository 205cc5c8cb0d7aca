"""What each connection kind adds to the bill beyond the endpoint it serves: how its usage is
read, and its own paid features. The endpoint tables (live.py) classify every request field for
every kind; a feature priced per model (a tier, web search, a long-context band) is priced or
refused at the route target's catalog model, whichever kind serves it. `tests/gateway/
test_billing_inventory.py` checks that every connection kind has its table here."""

from __future__ import annotations

from gateway.billing.entries import FREE, PRICED, REFUSED, TOKENS, Entry

_OPENAI_USAGE = Entry(
    PRICED,
    "OpenAI's usage fields: prompt, cached and completion tokens; output is the larger of "
    "completion_tokens and total_tokens - prompt_tokens",
)
_PRESET = {
    "usage": _OPENAI_USAGE,
    "base URL, model naming, headers": Entry(
        FREE, "from the preset table (catalog/presets.py); cannot change the bill"
    ),
    "output ceiling": Entry(TOKENS, "sent in the parameter the provider takes (max_tokens or max_completion_tokens)"),
    "provider extensions": Entry(
        REFUSED, "any field the provider adds to OpenAI's body is unclassified: 400 under a blocking cap"
    ),
}

KINDS: dict[str, dict[str, Entry]] = {
    "openai": {"usage": Entry(PRICED, "each endpoint's own usage object, as in the tables above")},
    "anthropic": {"usage": Entry(PRICED, "message_start and message_delta usage, as in the tables above")},
    "azure_openai": {
        "usage": _OPENAI_USAGE,
        "deployment, api-version": Entry(FREE, "where the call goes; the deployment's catalog model prices it"),
    },
    "gemini": {
        "usage": _OPENAI_USAGE,
        "thinking tokens": Entry(PRICED, "counted in total_tokens only; billed as output"),
        "`extra_body.google` (thinking config, cached content), grounding": Entry(
            REFUSED, "unclassified fields: 400 under a blocking cap"
        ),
        "usage (`options.api: native`)": Entry(
            PRICED,
            "generateContent's usageMetadata: promptTokenCount plus toolUsePromptTokenCount as input, its "
            "cachedContentTokenCount at the cache-read rate, candidatesTokenCount plus thoughtsTokenCount as "
            "output; a stream's last usageMetadata once a candidate finished (else the worst case); prompt or "
            "output tokens of a modality other than text and image (audio, video) are flagged as unpriced",
        ),
        "output ceiling (native)": Entry(
            TOKENS, "generationConfig.maxOutputTokens, which thinking tokens count inside; injected under a cap"
        ),
        "grounding with Google Search or Maps, code execution, URL context, File Search (native)": Entry(
            FREE,
            "never sent: the body is translated from chat or messages, whose tables refuse every hosted tool, "
            "so only functionDeclarations reach Gemini",
        ),
        "cachedContent, safetySettings, labels (native)": Entry(
            FREE, "never sent: no field of the endpoints maps to them; Gemini's defaults apply"
        ),
    },
    "bedrock": {
        "usage": Entry(
            PRICED,
            "Anthropic's usage (input, output, cache read and write tokens) from the body or the "
            "event stream's message_start/message_delta; the last event's "
            "amazon-bedrock-invocationMetrics fill in a missing count (the larger is kept)",
        ),
        "cross-region inference profiles": Entry(
            PRICED,
            "a profile id (global., us., eu., ...) is its own catalog model with its own price. AWS "
            "bills Claude Sonnet 4.5 and every later Claude model 10% above the global price on an "
            "in-region id or a geographic profile: a route to a global price (a global. catalog "
            "model, Anthropic's list) sent as such an id reserves and records every list token rate "
            "times 1.1; a regional. catalog price already carries it (catalog/pricing.py "
            "`location_multiplier`)",
        ),
        "`anthropic-beta`": Entry(PRICED, "sent as the body's anthropic_beta; each beta classified as on /v1/messages"),
        "guardrails, latency-optimized inference, Bedrock service tiers": Entry(
            FREE,
            "chosen with X-Amzn-Bedrock-* headers that capgate never sends: the on-demand standard "
            "tier without guardrails is what is billed",
        ),
        "a stream's exception event": Entry(
            PRICED, "relayed as Anthropic's error event; a stream without final usage is charged at its worst case"
        ),
        "Converse (`options.api: converse`): usage": Entry(
            PRICED,
            "`usage` of the answer or of the stream's metadata event: inputTokens, outputTokens, "
            "cacheReadInputTokens and cacheWriteInputTokens (1-hour writes from cacheDetails) at the "
            "catalog model's rates and the `serviceTier` the answer reports; a stream without its metadata "
            "event is charged at its worst case",
        ),
        "Converse: output ceiling": Entry(
            TOKENS, "always sent as inferenceConfig.maxTokens, the ceiling the worst case assumed"
        ),
        "Converse: serviceTier": Entry(
            PRICED, "sent from the client's service tier; flex and priority at the catalog model's multipliers"
        ),
        "Converse: guardrailConfig, performanceConfig (latency optimized), promptVariables, "
        "additionalModelRequestFields": Entry(
            FREE,
            "never sent: no client field maps to them (docs/billing.md, 'Bedrock Converse request fields'), "
            "so the standard on-demand price without guardrails is what is billed",
        ),
    },
    "vertex": {
        "usage (Claude)": Entry(
            PRICED,
            "Anthropic's usage from rawPredict or streamRawPredict, server_tool_use.web_search_requests "
            "at the catalog model's web-search price",
        ),
        "usage (Gemini)": Entry(
            PRICED,
            "OpenAI's usage fields: cached tokens (prompt_tokens_details.cached_tokens) at the cache-read "
            "rate, thinking tokens (total_tokens only) as output",
        ),
        "regional endpoints": Entry(
            PRICED,
            "Google bills Claude Sonnet 4.5 and every later Claude model 10% above the global price "
            "on any other location (a region or a multi-region); the catalog carries the global "
            "price, so a connection whose region is not global reserves and records those models at "
            "every list token rate times 1.1 (catalog/pricing.py `location_multiplier`, matched on "
            "the id sent to Vertex). Older Claude and Gemini have one price everywhere. A "
            "negotiated rate is taken as the connection's bill and is not raised",
        ),
        "`extra_body.google`, grounding with Google Search": Entry(
            REFUSED, "unclassified fields: 400 under a blocking cap"
        ),
        "the OAuth token request": Entry(FREE, "not billed; once per connection and token lifetime"),
    },
    "echo": {"usage": Entry(PRICED, "the built-in provider's usage, priced from the catalog like any other")},
    **dict.fromkeys(("groq", "mistral", "deepseek", "xai", "together", "fireworks", "openrouter"), _PRESET),
    **dict.fromkeys(
        ("vllm", "ollama"),
        {**_PRESET, "self-hosted": Entry(FREE, "priced at the catalog model the route names, if it has a price")},
    ),
}
