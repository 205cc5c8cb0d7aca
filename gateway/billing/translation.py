"""What each request field becomes when a request in one format is sent to a target of the
other: one table per direction, read by the translators (a field not in its table is refused)
and printed into docs/billing.md, as the billing inventory is.

- mapped: carried over with the same meaning (the rule says how);
- dropped: left out, because it cannot change the answer or the bill on the target;
- refused: 400 `untranslatable_field` naming it, because the target has no faithful equivalent
  and dropping it could change the answer or the bill. A target that cannot take a request is
  left out of its failover order; with no target left the request is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

MAPPED, DROPPED, REFUSED = "mapped", "dropped", "refused"
HOW_TITLES = {MAPPED: "mapped", DROPPED: "dropped", REFUSED: "refused (400)"}

# The directions: (client endpoint, target format). /v1/messages reaches Gemini through the
# chat translation (MESSAGES_TO_CHAT, then CHAT_TO_GEMINI).
CHAT_TO_MESSAGES = ("chat", "messages")
MESSAGES_TO_CHAT = ("messages", "chat")
CHAT_TO_CONVERSE = ("chat", "converse")
MESSAGES_TO_CONVERSE = ("messages", "converse")
CHAT_TO_GEMINI = ("chat", "gemini")
# Only the fields that do not go through the chat translation (it has no field for them).
MESSAGES_TO_GEMINI = ("messages", "gemini")
# The stateless Responses subset an Anthropic-format target answers faithfully.
RESPONSES_TO_MESSAGES = ("responses", "messages")


@dataclass(frozen=True)
class Rule:
    how: str
    why: str


_r = Rule
_IGNORED_NONE = "; null is the same as absent"

FIELDS: dict[tuple[str, str], dict[str, Rule]] = {
    CHAT_TO_MESSAGES: {
        "model": _r(MAPPED, "the target's own model id"),
        "messages": _r(
            MAPPED,
            "leading system and developer messages become `system`; user text and image parts become text and "
            "image blocks (data URLs as base64 sources, other URLs as url sources; `detail` has no equivalent "
            "and the image is bounded at the model's maximum either way); assistant `tool_calls` become "
            "`tool_use` blocks; `tool` messages become `tool_result` blocks in the next user turn. Refused: a "
            "system message after the conversation started, audio and file parts, `name`, legacy `function` "
            "messages, tool-call arguments that are not a JSON object",
        ),
        "max_tokens": _r(MAPPED, "`max_tokens` (the output ceiling is always sent: Anthropic requires it)"),
        "max_completion_tokens": _r(MAPPED, "`max_tokens`"),
        "stop": _r(MAPPED, "`stop_sequences` (a string becomes a list of one)"),
        "temperature": _r(MAPPED, "`temperature` from 0 to 1; above 1 (OpenAI's range goes to 2) it is refused"),
        "top_p": _r(MAPPED, "`top_p`"),
        "n": _r(MAPPED, "1 is the default; more choices than one are refused (a message has one)"),
        "stream": _r(MAPPED, "`stream`; the answer is streamed as chat.completion.chunk events ending in [DONE]"),
        "stream_options": _r(
            MAPPED, "`include_usage` adds the final usage chunk, built from message_start and message_delta"
        ),
        "tools": _r(
            MAPPED,
            "function tools become custom tools (`parameters` as `input_schema`); `strict: true` and custom "
            "(free-form) tools are refused",
        ),
        "tool_choice": _r(MAPPED, "auto -> auto, none -> none, required -> any, a named function -> the named tool"),
        "parallel_tool_calls": _r(MAPPED, "false sets `disable_parallel_tool_use` on the tool choice"),
        "user": _r(MAPPED, "`metadata.user_id`"),
        "safety_identifier": _r(MAPPED, "`metadata.user_id`"),
        "service_tier": _r(
            MAPPED, "auto is left to the connection; default becomes standard_only; other tiers are refused"
        ),
        "modalities": _r(MAPPED, "['text'] is the only output a message has; audio is refused"),
        "response_format": _r(MAPPED, "type text is the default; a JSON object or schema format is refused"),
        "metadata": _r(DROPPED, "labels for stored completions, which the target does not keep"),
        "store": _r(DROPPED, "stored completions are an OpenAI feature; the target stores nothing"),
        "prompt_cache_key": _r(DROPPED, "a cache routing hint; without cache_control the target bills plain input"),
        "prompt_cache_retention": _r(DROPPED, "OpenAI cache retention; the target caches only with cache_control"),
        "prompt_cache_options": _r(DROPPED, "OpenAI cache options; the target caches only with cache_control"),
        "seed": _r(REFUSED, "no equivalent: the target samples without a seed"),
        "frequency_penalty": _r(REFUSED, "no equivalent sampling penalty" + _IGNORED_NONE),
        "presence_penalty": _r(REFUSED, "no equivalent sampling penalty" + _IGNORED_NONE),
        "logit_bias": _r(REFUSED, "no equivalent"),
        "logprobs": _r(REFUSED, "the target returns no log probabilities"),
        "top_logprobs": _r(REFUSED, "the target returns no log probabilities"),
        "reasoning_effort": _r(REFUSED, "effort levels do not map onto a thinking budget faithfully"),
        "verbosity": _r(REFUSED, "no equivalent"),
        "prediction": _r(REFUSED, "predicted outputs are an OpenAI feature"),
        "audio": _r(REFUSED, "the target has no audio output"),
        "web_search_options": _r(REFUSED, "a search-preview model feature"),
        "moderation": _r(REFUSED, "no equivalent"),
        "functions": _r(REFUSED, "legacy function calling: send `tools`"),
        "function_call": _r(REFUSED, "legacy function calling: send `tool_choice`"),
    },
    MESSAGES_TO_CHAT: {
        "model": _r(MAPPED, "the target's own model id"),
        "messages": _r(
            MAPPED,
            "text blocks become text parts (a lone text block a plain string); image blocks become image_url "
            "parts (base64 sources as data URLs); `tool_use` blocks become assistant `tool_calls`; "
            "`tool_result` blocks become `tool` messages placed right after the assistant turn. `cache_control` "
            "is dropped (the target caches prefixes itself, with no write premium). Refused: documents, "
            "thinking and redacted thinking blocks, server tool blocks, images inside tool results. A "
            "system message between turns stays a system message at its place",
        ),
        "system": _r(MAPPED, "a leading system message (text blocks joined with blank lines)"),
        "max_tokens": _r(MAPPED, "`max_completion_tokens` (or the connection's `max_tokens_param`)"),
        "stop_sequences": _r(MAPPED, "`stop`; more than 4 sequences (OpenAI's limit) are refused"),
        "temperature": _r(MAPPED, "`temperature` (0 to 1 is inside OpenAI's range)"),
        "top_p": _r(MAPPED, "`top_p`"),
        "top_k": _r(REFUSED, "OpenAI has no top-k sampling"),
        "stream": _r(
            MAPPED,
            "`stream` with usage requested; the answer is streamed as message_start, content_block_*, "
            "message_delta (with the usage) and message_stop",
        ),
        "tools": _r(
            MAPPED,
            "custom tools become function tools (`input_schema` as `parameters`; `cache_control` dropped); "
            "server and client-defined Anthropic tools (web search, bash, text editor, computer, ...) and "
            "any other tool setting (`defer_loading`, `input_examples`, `strict`, ...) are refused",
        ),
        "tool_choice": _r(
            MAPPED,
            "auto -> auto, any -> required, tool -> the named function, none -> none; "
            "`disable_parallel_tool_use` -> `parallel_tool_calls: false`",
        ),
        "metadata": _r(MAPPED, "`user_id` becomes `user`"),
        "service_tier": _r(MAPPED, "auto is left to the connection; standard_only becomes default"),
        "thinking": _r(
            MAPPED,
            "disabled is the default; adaptive thinking (the model reasons as it sees fit) becomes "
            "`reasoning_effort` at output_config's effort (high when absent, Anthropic's default), whose "
            "reasoning tokens are output inside max_completion_tokens; enabled thinking with a token budget "
            "has no equivalent and is refused",
        ),
        "diagnostics": _r(DROPPED, "asks the target for a cache-miss reason it does not report; not billed"),
        "output_config": _r(
            MAPPED,
            "`effort` low, medium or high becomes `reasoning_effort`; max and an output format have no "
            "equivalent and are refused",
        ),
        "cache_control": _r(DROPPED, "the target caches prefixes itself, with no write premium"),
        "context_management": _r(
            MAPPED,
            "clear_thinking edits are dropped (thinking blocks are refused, so there is nothing to clear); "
            "other edits (clear_tool_uses, compact) change the context the model sees and are refused",
        ),
        "container": _r(REFUSED, "code-execution containers are an Anthropic feature"),
        "mcp_servers": _r(REFUSED, "remote MCP servers are an Anthropic feature"),
        "inference_geo": _r(REFUSED, "regional inference is an Anthropic setting"),
        "speed": _r(REFUSED, "fast mode is an Anthropic setting"),
        "safeguards": _r(
            REFUSED, "the provider's safety checks of tool calls run only at Anthropic: refused, never dropped"
        ),
        "thread": _r(REFUSED, "a server-side message thread is an Anthropic feature"),
    },
    CHAT_TO_GEMINI: {
        "model": _r(MAPPED, "the target's own model id, in the URL (`models/{id}:generateContent`)"),
        "messages": _r(
            MAPPED,
            "system and developer messages become `systemInstruction` (Gemini has one: those between turns join "
            "it in order); user turns become `user` contents "
            "and assistant turns `model` contents (consecutive turns of one role merge); text parts become "
            "text parts; image parts with a base64 data URL become `inlineData` (bounded at the model's image "
            "maximum); assistant `tool_calls` become `functionCall` parts (the first of a turn with Google's "
            "skip_thought_signature_validator signature, since the call's own signature was not kept); `tool` "
            "messages become `functionResponse` parts named after the call they answer, the content as "
            "`response.result`. Refused: image URLs that are "
            "not data URLs (Gemini takes images inline), audio and file parts, `name`, legacy `function` "
            "messages, a tool message answering no earlier call, tool-call arguments that are not a JSON object",
        ),
        "max_tokens": _r(MAPPED, "`generationConfig.maxOutputTokens`, which thinking tokens count inside"),
        "max_completion_tokens": _r(MAPPED, "`generationConfig.maxOutputTokens`, which thinking tokens count inside"),
        "stop": _r(MAPPED, "`generationConfig.stopSequences` (a string becomes a list of one)"),
        "temperature": _r(MAPPED, "`generationConfig.temperature` (0 to 2 in both)"),
        "top_p": _r(MAPPED, "`generationConfig.topP`"),
        "seed": _r(MAPPED, "`generationConfig.seed`"),
        "frequency_penalty": _r(MAPPED, "`generationConfig.frequencyPenalty`"),
        "presence_penalty": _r(MAPPED, "`generationConfig.presencePenalty`"),
        "n": _r(
            MAPPED, "`generationConfig.candidateCount`; each candidate is a choice, the output reserved per choice"
        ),
        "stream": _r(
            MAPPED,
            "`:streamGenerateContent?alt=sse`; each partial answer becomes chat.completion.chunk events, ending "
            "in [DONE] once a candidate finished",
        ),
        "stream_options": _r(MAPPED, "`include_usage` adds the final usage chunk, from the last `usageMetadata`"),
        "tools": _r(
            MAPPED,
            "function tools become `functionDeclarations` (`parameters` as `parametersJsonSchema`, JSON Schema "
            "as sent); `strict: true` and custom (free-form) tools are refused",
        ),
        "tool_choice": _r(
            MAPPED,
            "`toolConfig.functionCallingConfig`: auto -> AUTO, none -> NONE, required -> ANY, a named function -> "
            "ANY with `allowedFunctionNames`",
        ),
        "parallel_tool_calls": _r(
            MAPPED, "true is the default; false is refused (Gemini has no switch against parallel calls)"
        ),
        "response_format": _r(
            MAPPED,
            "text is the default; json_object -> `responseMimeType: application/json`; json_schema -> that and "
            "`responseJsonSchema`",
        ),
        "reasoning_effort": _r(
            MAPPED,
            "`thinkingConfig.thinkingLevel` (minimal, low, medium, high, xhigh); none -> `thinkingBudget: 0`. "
            "Thinking tokens are billed as output, inside maxOutputTokens",
        ),
        "service_tier": _r(MAPPED, "auto and default are the connection's standard tier; other tiers are refused"),
        "modalities": _r(MAPPED, "['text'] is the default output; audio is refused"),
        "user": _r(DROPPED, "an end-user identifier; Gemini takes none and it cannot change the answer or the bill"),
        "safety_identifier": _r(DROPPED, "an end-user identifier; Gemini takes none"),
        "metadata": _r(DROPPED, "labels for stored completions, which the target does not keep"),
        "store": _r(DROPPED, "stored completions are an OpenAI feature; the target stores nothing"),
        "prompt_cache_key": _r(DROPPED, "a cache routing hint; Gemini caches implicitly and reports cached tokens"),
        "prompt_cache_retention": _r(DROPPED, "OpenAI cache retention; Gemini caches implicitly"),
        "prompt_cache_options": _r(DROPPED, "OpenAI cache options; Gemini caches implicitly"),
        "logit_bias": _r(REFUSED, "no equivalent"),
        "logprobs": _r(REFUSED, "log probabilities are not carried back"),
        "top_logprobs": _r(REFUSED, "log probabilities are not carried back"),
        "verbosity": _r(REFUSED, "no equivalent"),
        "prediction": _r(REFUSED, "predicted outputs are an OpenAI feature"),
        "audio": _r(REFUSED, "audio output is not carried back"),
        "web_search_options": _r(
            REFUSED, "grounding with Google Search is billed per query at its own price; it is never sent"
        ),
        "moderation": _r(REFUSED, "no equivalent"),
        "functions": _r(REFUSED, "legacy function calling: send `tools`"),
        "function_call": _r(REFUSED, "legacy function calling: send `tool_choice`"),
    },
    MESSAGES_TO_GEMINI: {
        "top_k": _r(MAPPED, "`generationConfig.topK`"),
        "thinking": _r(
            MAPPED,
            "enabled with `budget_tokens` -> `thinkingConfig.thinkingBudget` (thinking tokens are output inside "
            "maxOutputTokens, as inside max_tokens; the thinking itself is not shown, so no thinking block comes "
            "back to be replayed); adaptive and disabled go through the chat translation",
        ),
    },
}

_NO_PARALLEL = "Converse has no switch for parallel tool calls; the model may make several either way"
_CONVERSE_IMAGES = (
    "image blocks carry their bytes (png, jpeg, gif, webp); an image given by URL is refused, since Converse "
    "takes bytes or an S3 location and fetching it is not the model's behaviour"
)

FIELDS[CHAT_TO_CONVERSE] = {
    "model": _r(MAPPED, "the target's own model id, in the path (`/model/{modelId}/converse`)"),
    "messages": _r(
        MAPPED,
        "leading system and developer messages become `system` text blocks; user text parts become text blocks "
        f"and image parts with a base64 data URL become image blocks ({_CONVERSE_IMAGES}); assistant "
        "`tool_calls` become `toolUse` blocks; `tool` messages become `toolResult` blocks in the next user turn; "
        "consecutive turns of one role merge; a system message after the conversation started becomes a message "
        "of Converse's system role at its place. Refused: audio and file parts, `name`, legacy `function` "
        "messages, tool-call arguments that are not a JSON object",
    ),
    "max_tokens": _r(MAPPED, "`inferenceConfig.maxTokens` (the output ceiling is always sent)"),
    "max_completion_tokens": _r(MAPPED, "`inferenceConfig.maxTokens`"),
    "stop": _r(MAPPED, "`inferenceConfig.stopSequences` (a string becomes a list of one)"),
    "temperature": _r(MAPPED, "`inferenceConfig.temperature` from 0 to 1; above 1 it is refused"),
    "top_p": _r(MAPPED, "`inferenceConfig.topP`"),
    "n": _r(MAPPED, "1 is the default; more choices than one are refused (Converse answers one message)"),
    "stream": _r(
        MAPPED,
        "`/model/{modelId}/converse-stream`; its AWS event stream (messageStart, contentBlockStart/Delta/Stop, "
        "messageStop, metadata) is streamed as chat.completion.chunk events ending in [DONE]",
    ),
    "stream_options": _r(MAPPED, "`include_usage` adds the final usage chunk, built from the metadata event"),
    "tools": _r(
        MAPPED,
        "function tools become `toolConfig.tools[].toolSpec` (`parameters` as `inputSchema.json`, `strict` as "
        "`strict`); custom (free-form) tools are refused",
    ),
    "tool_choice": _r(
        MAPPED,
        "auto -> `auto`, required -> `any`, a named function -> `tool`; none beside tools has no equivalent and "
        "is refused (without tools it changes nothing and is left out)",
    ),
    "parallel_tool_calls": _r(
        MAPPED, "true is the default; false beside tools is refused: " + _NO_PARALLEL + " (without tools, left out)"
    ),
    "user": _r(DROPPED, "an end-user identifier: Converse has none, and it changes neither answer nor bill"),
    "safety_identifier": _r(DROPPED, "an end-user identifier: Converse has none"),
    "service_tier": _r(
        MAPPED,
        "auto is left to the connection; default, flex and priority become `serviceTier.type` and are priced at "
        "that tier's multiplier; other tiers are refused",
    ),
    "modalities": _r(MAPPED, "['text'] is the only output Converse has; audio is refused"),
    "response_format": _r(
        MAPPED,
        "type text is the default; a JSON schema becomes `outputConfig.textFormat` (type json_schema, the schema "
        "as a string); a plain JSON object format is refused",
    ),
    "metadata": _r(DROPPED, "labels for stored completions, which the target does not keep"),
    "store": _r(DROPPED, "stored completions are an OpenAI feature; the target stores nothing"),
    "prompt_cache_key": _r(DROPPED, "a cache routing hint; without cache points the target bills plain input"),
    "prompt_cache_retention": _r(DROPPED, "OpenAI cache retention; the target caches only at cache points"),
    "prompt_cache_options": _r(DROPPED, "OpenAI cache options; the target caches only at cache points"),
    "seed": _r(REFUSED, "no equivalent: Converse samples without a seed"),
    "frequency_penalty": _r(REFUSED, "no equivalent sampling penalty" + _IGNORED_NONE),
    "presence_penalty": _r(REFUSED, "no equivalent sampling penalty" + _IGNORED_NONE),
    "logit_bias": _r(REFUSED, "no equivalent"),
    "logprobs": _r(REFUSED, "Converse returns no log probabilities"),
    "top_logprobs": _r(REFUSED, "Converse returns no log probabilities"),
    "reasoning_effort": _r(
        MAPPED,
        "low, medium, high and xhigh become `outputConfig.effort` (reasoning tokens are billed as output); "
        "minimal and none are refused",
    ),
    "verbosity": _r(REFUSED, "no equivalent"),
    "prediction": _r(REFUSED, "predicted outputs are an OpenAI feature"),
    "audio": _r(REFUSED, "Converse has no audio output"),
    "web_search_options": _r(REFUSED, "a search-preview model feature"),
    "moderation": _r(REFUSED, "no equivalent"),
    "functions": _r(REFUSED, "legacy function calling: send `tools`"),
    "function_call": _r(REFUSED, "legacy function calling: send `tool_choice`"),
}

FIELDS[MESSAGES_TO_CONVERSE] = {
    "model": _r(MAPPED, "the target's own model id, in the path (`/model/{modelId}/converse`)"),
    "messages": _r(
        MAPPED,
        f"text blocks become text blocks; base64 image blocks become image blocks ({_CONVERSE_IMAGES}); "
        "`tool_use` blocks become `toolUse` blocks; `tool_result` blocks become `toolResult` blocks (text and "
        "image content; `is_error` as status error); `cache_control` on a block becomes a `cachePoint` block "
        "after it (ttl 5m or 1h kept, cache writes priced as Anthropic's). Refused: documents, thinking and "
        "redacted thinking blocks, server tool blocks, search results. A system message between turns "
        "becomes a message of Converse's system role at its place",
    ),
    "system": _r(MAPPED, "`system` text blocks (`cache_control` as a cachePoint after the block)"),
    "max_tokens": _r(MAPPED, "`inferenceConfig.maxTokens`"),
    "stop_sequences": _r(MAPPED, "`inferenceConfig.stopSequences`"),
    "temperature": _r(MAPPED, "`inferenceConfig.temperature` (0 to 1 on both)"),
    "top_p": _r(MAPPED, "`inferenceConfig.topP`"),
    "top_k": _r(REFUSED, "Converse has no top-k sampling; only a model-specific field could carry it"),
    "stream": _r(
        MAPPED,
        "`/model/{modelId}/converse-stream`; its AWS event stream is streamed as message_start, "
        "content_block_* (text, tool_use), message_delta (with the usage of the metadata event) and message_stop",
    ),
    "tools": _r(
        MAPPED,
        "custom tools become `toolConfig.tools[].toolSpec` (`input_schema` as `inputSchema.json`, `strict` kept, "
        "`cache_control` as a cachePoint after the tool); server and Anthropic-defined tools (web search, bash, "
        "text editor, computer, ...) and other tool settings (`defer_loading`, `input_examples`, ...) are refused",
    ),
    "tool_choice": _r(
        MAPPED,
        "auto -> `auto`, any -> `any`, tool -> `tool`; none and `disable_parallel_tool_use` are refused: "
        + _NO_PARALLEL,
    ),
    "metadata": _r(DROPPED, "`user_id` identifies the end user for abuse detection; Converse has no such field"),
    "service_tier": _r(MAPPED, "auto is left to the connection; standard_only becomes `serviceTier.type` default"),
    "thinking": _r(
        MAPPED,
        "disabled is the default; adaptive thinking becomes `outputConfig.effort` at output_config's effort "
        "(high when absent, Anthropic's default; reasoning tokens are billed as output); enabled thinking with "
        "a token budget is a model-specific field Converse does not standardise, refused",
    ),
    "diagnostics": _r(DROPPED, "asks the target for a cache-miss reason it does not report; not billed"),
    "output_config": _r(
        MAPPED,
        "`effort` (low, medium, high, max) becomes `outputConfig.effort`; a JSON-schema `format` becomes "
        "`outputConfig.textFormat` (the schema as a string); any other setting is refused",
    ),
    "cache_control": _r(MAPPED, "automatic caching: a `cachePoint` block at the end of the last message (ttl kept)"),
    "context_management": _r(
        MAPPED,
        "clear_thinking edits are dropped (thinking blocks are refused, so there is nothing to clear); other "
        "edits change the context the model sees and are refused",
    ),
    "container": _r(REFUSED, "code-execution containers are an Anthropic feature"),
    "mcp_servers": _r(REFUSED, "remote MCP servers are an Anthropic feature"),
    "inference_geo": _r(REFUSED, "regional inference is an Anthropic setting; Converse's region is the connection's"),
    "speed": _r(REFUSED, "fast mode is an Anthropic setting"),
    "safeguards": _r(
        REFUSED, "the provider's safety checks of tool calls run only at Anthropic: refused, never dropped"
    ),
    "thread": _r(REFUSED, "a server-side message thread is an Anthropic feature"),
}

# The Converse request fields, and whether a translated request ever carries them: the gateway
# sends only what a client field maps to (above), so a paid Converse feature no client field
# asks for is never turned on.
CONVERSE_REQUEST: dict[str, Rule] = {
    "messages": _r(MAPPED, "from the client's messages"),
    "system": _r(MAPPED, "from the client's system prompt"),
    "inferenceConfig": _r(MAPPED, "maxTokens (always: the bound's output ceiling), temperature, topP, stopSequences"),
    "toolConfig": _r(MAPPED, "from the client's tools and tool choice"),
    "serviceTier": _r(MAPPED, "from the client's service tier, priced at the tier's multiplier"),
    "outputConfig": _r(
        MAPPED, "textFormat from the client's JSON-schema output format, effort from its reasoning effort"
    ),
    "guardrailConfig": _r(
        REFUSED, "never sent: guardrail assessments are billed per text unit, which the catalog does not price"
    ),
    "performanceConfig": _r(
        REFUSED, "never sent: latency-optimized inference is priced differently, and the catalog has no such price"
    ),
    "promptVariables": _r(REFUSED, "never sent: it fills a prompt-management template the bound cannot see"),
    "additionalModelRequestFields": _r(
        REFUSED, "never sent: model-specific fields (thinking budgets, top-k) the bound cannot price generically"
    ),
    "additionalModelResponseFieldPaths": _r(REFUSED, "never sent"),
    "requestMetadata": _r(DROPPED, "never sent: log-filtering labels, no effect on answer or bill"),
    "projectIdentifier": _r(DROPPED, "never sent"),
}

# anthropic-beta values a request to an OpenAI-format target may carry: each only turns on an
# Anthropic feature that shows in the body (where every field, block and tool setting is checked
# against the rules above) or changes nothing the target does. Any other beta is refused, since
# it could change the answer or the bill in a way the body does not show.
DROPPED_BETAS: dict[str, str] = {
    "claude-code": "identifies the client",
    "prompt-caching": "cache_control is dropped",
    "extended-cache-ttl": "cache_control is dropped",
    "token-efficient-tools": "an Anthropic tool-call encoding",
    "fine-grained-tool-streaming": "tool arguments are streamed as the target sends them",
    "interleaved-thinking": "thinking is refused",
    "context-management": "context_management is refused",
    "effort": "output_config's effort is in the body",
    "output-128k": "the output ceiling is max_tokens either way",
    "thinking-token-count": "thinking is refused",
    "user-profiles": "an identifier",
    "cache-diagnosis": "diagnostics is dropped",
    "token-counting": "not used by a message",
    "per-turn-control": "per-turn settings are in the body, checked field by field",
    "mid-conversation-tool-changes": "the tools are in the body",
    "mid-conversation-output-config": "output_config is checked in the body",
    "mid-conversation-system-clear-at": "the system prompt is in the body",
    "advanced-tool-use": "deferred tools and tool examples are tool settings, refused",
    "inline-tools": "tools inside messages are blocks, refused",
    "structured-outputs": "an output format is refused",
    "thinking-display-updates": "thinking is refused",
    "thinking-binding-controls": "thinking is refused",
    "dev-full-thinking": "thinking is refused",
    "model-context-window-exceeded": "a stop reason: the target reports its own",
    "web-search": "server tools are refused",
    "web-fetch": "server tools are refused",
    "pdfs": "documents are refused",
}


_NOT_KEPT = "the target keeps no response, so nothing earlier can be continued from"
FIELDS[RESPONSES_TO_MESSAGES] = {
    "model": _r(MAPPED, "the target's own model id"),
    "input": _r(
        MAPPED,
        "a string is one user turn; message items become turns (input_text and output_text parts as text "
        "blocks, input_image with an image URL as an image block: data URLs as base64 sources); "
        "`function_call` items become `tool_use` blocks and `function_call_output` items `tool_result` "
        "blocks. Refused: system or developer items after the conversation started, file, audio and "
        "file-id image parts, reasoning items (the other model's own, possibly encrypted, reasoning), item "
        "references, hosted-tool call items, call arguments that are not a JSON object",
    ),
    "instructions": _r(MAPPED, "`system` (before any system or developer input item)"),
    "max_output_tokens": _r(MAPPED, "`max_tokens` (the output ceiling is always sent: Anthropic requires it)"),
    "temperature": _r(MAPPED, "`temperature` from 0 to 1; above 1 (OpenAI's range goes to 2) it is refused"),
    "top_p": _r(MAPPED, "`top_p`"),
    "stream": _r(
        MAPPED,
        "`stream`; the answer is streamed as Responses events: response.created, response.in_progress, "
        "response.output_item.added, response.content_part.added, response.output_text.delta (or "
        "response.function_call_arguments.delta), the matching .done events, then response.completed "
        "(response.incomplete at the output ceiling) with the usage",
    ),
    "stream_options": _r(DROPPED, "`include_obfuscation` pads events; the usage is always in the final event"),
    "tools": _r(
        MAPPED,
        "function tools (`type: function`) become custom tools (`parameters` as `input_schema`), and need "
        "`strict: false`: strict schema adherence, the Responses default, has no faithful equivalent. Hosted "
        "tools (web search, file search, code interpreter, computer use, image generation, MCP), custom and "
        "namespace tools are refused",
    ),
    "tool_choice": _r(
        MAPPED, "auto -> auto, none -> none, required -> any, a named function -> the named tool; others refused"
    ),
    "parallel_tool_calls": _r(MAPPED, "false sets `disable_parallel_tool_use` on the tool choice"),
    "user": _r(MAPPED, "`metadata.user_id`"),
    "safety_identifier": _r(MAPPED, "`metadata.user_id`"),
    "service_tier": _r(
        MAPPED, "auto is left to the connection; default becomes standard_only; other tiers are refused"
    ),
    "store": _r(
        MAPPED,
        "false, or absent: the response is not stored (the answer says `store: false`; it cannot be "
        "retrieved or continued from). true is refused: the target keeps nothing a later request could use",
    ),
    "text": _r(
        MAPPED,
        "`format` text is the default; a JSON object or schema format is refused (as chat's response_format "
        "is), and so is a `verbosity`",
    ),
    "reasoning": _r(
        REFUSED,
        "effort levels do not map onto a thinking budget faithfully (as chat's reasoning_effort)" + _IGNORED_NONE,
    ),
    "include": _r(
        MAPPED,
        "`reasoning.encrypted_content` and the hosted-tool and input-image values are dropped (no reasoning, "
        "hosted tool or stored input reaches the target, so there is nothing to include); "
        "`message.output_text.logprobs` is refused (the target returns no log probabilities)",
    ),
    "truncation": _r(MAPPED, "disabled is the default; auto (dropping context from the middle) is refused"),
    "max_tool_calls": _r(DROPPED, "bounds hosted-tool calls, and hosted tools are refused"),
    "top_logprobs": _r(REFUSED, "the target returns no log probabilities; 0 is the same as absent"),
    "metadata": _r(DROPPED, "labels for stored responses, which the target does not keep"),
    "prompt_cache_key": _r(DROPPED, "a cache routing hint; without cache_control the target bills plain input"),
    "prompt_cache_retention": _r(DROPPED, "OpenAI cache retention; the target caches only with cache_control"),
    "prompt_cache_options": _r(DROPPED, "OpenAI cache options; the target caches only with cache_control"),
    "client_metadata": _r(DROPPED, "client labels; the target neither answers nor bills by them"),
    "previous_response_id": _r(REFUSED, _NOT_KEPT + " (capgate keeps a response's size, not its content)"),
    "conversation": _r(REFUSED, _NOT_KEPT),
    "background": _r(REFUSED, "background responses are OpenAI jobs"),
    "background_options": _r(REFUSED, "background responses are OpenAI jobs"),
    "prompt": _r(REFUSED, "a stored prompt template is OpenAI's; its content is not in the body"),
    "context_management": _r(REFUSED, "OpenAI's server-side compaction has no equivalent"),
    "moderation": _r(REFUSED, "no equivalent"),
    "access_programs": _r(REFUSED, "no equivalent"),
    "image": _r(REFUSED, "image generation settings: the target has no image output"),
}


def markdown() -> list[str]:
    """The translation section of docs/billing.md."""
    lines = [
        "",
        "## Translation between formats",
        "",
        "A route may list targets of either format: `/v1/chat/completions` reaches Anthropic-format targets",
        "and `/v1/messages` reaches OpenAI-format targets (OpenAI, Azure OpenAI, Gemini); both reach",
        "Bedrock connections that speak the Converse API (`options.api: converse`) and Gemini's native",
        "generateContent (`options.api: native`); `/v1/responses` reaches Anthropic-format targets for",
        "its stateless subset. The request is",
        "translated before it is bounded, and the worst case is the translated body on the priciest target",
        "that may be tried; each attempt is priced and recorded at the model called. Usage is read from the",
        "target's own format (cache reads and writes, reasoning tokens) and the answer, its stream and its",
        "errors are translated back into the endpoint's own shape. A target that cannot take a request",
        "faithfully is left out of its failover order; with no target left the request is refused with 400",
        "`untranslatable_field` naming the field. Generated from `gateway/billing/translation.py`.",
    ]
    titles = {
        CHAT_TO_MESSAGES: "/v1/chat/completions to Anthropic messages",
        MESSAGES_TO_CHAT: "/v1/messages to OpenAI chat completions",
        CHAT_TO_CONVERSE: "/v1/chat/completions to Bedrock Converse",
        MESSAGES_TO_CONVERSE: "/v1/messages to Bedrock Converse",
        CHAT_TO_GEMINI: "/v1/chat/completions to Gemini generateContent",
        MESSAGES_TO_GEMINI: "/v1/messages to Gemini generateContent",
        RESPONSES_TO_MESSAGES: "/v1/responses to Anthropic messages",
    }
    notes = {
        RESPONSES_TO_MESSAGES: [
            "",
            "`/v1/responses` reaches an Anthropic-format target for the stateless subset that maps",
            "faithfully. The answer is a Response (`object: response`): text blocks become `message` items,",
            "`tool_use` blocks `function_call` items (the block id as `call_id`), `stop_reason` max_tokens",
            "`status: incomplete` with `incomplete_details.reason: max_output_tokens` (refusal: content_filter),",
            "and the usage `input_tokens` (cache reads and writes included, as",
            "`input_tokens_details.cached_tokens` and `cache_write_tokens`) and `output_tokens`. Errors keep",
            "OpenAI's shape.",
        ],
        CHAT_TO_GEMINI: [
            "",
            'A `gemini` connection with `options.api: "native"` speaks Gemini\'s own API',
            "(`{base}/v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`, the key in",
            "`x-goog-api-key`). `/v1/messages` reaches it through the chat translation: the table above",
            "(messages to chat), then this one, except the fields of the next table; a field either refuses",
            "is refused, named as the client sent it.",
            "The answer comes back the same way: candidates become choices (a messages client reads the",
            "first as its message), `finishReason` the finish or stop reason (STOP with a function call:",
            "tool calls; MAX_TOKENS: length; the safety reasons: content_filter / refusal), and",
            "`usageMetadata` the usage: `promptTokenCount` (with `toolUsePromptTokenCount`) the prompt,",
            "`cachedContentTokenCount` the cached part of it (billed at the cache-read rate),",
            "`candidatesTokenCount` plus `thoughtsTokenCount` the output. Errors, Google's",
            "`{code, message, status}`, reach the client in the endpoint's own shape.",
        ],
        MESSAGES_TO_GEMINI: [
            "",
            "The fields Gemini takes that chat completions has no field for, carried directly (every other",
            "field goes through the two tables above):",
        ],
    }
    for direction, rules in FIELDS.items():
        lines += ["", f"### {titles[direction]}", *notes.get(direction, []), "", "| field | how | rule |"]
        lines += ["|---|---|---|"]
        lines += [f"| `{name}` | {HOW_TITLES[r.how]} | {r.why} |" for name, r in rules.items()]
    lines += [
        "",
        "`anthropic-beta` values a request to an OpenAI-format target may carry (any other is refused):",
        "",
        "| beta | why it can be dropped |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {why} |" for name, why in DROPPED_BETAS.items()]
    lines += [
        "",
        "A request to a Bedrock Converse target carries the same betas, and refuses any other.",
        "",
        "### Bedrock Converse request fields",
        "",
        "What a translated Converse request carries; a paid Converse feature no client field maps to is never",
        "sent. Usage is read from `usage` (the metadata event when streamed): inputTokens, outputTokens,",
        "cacheReadInputTokens and cacheWriteInputTokens (1-hour writes from cacheDetails), priced at the",
        "`serviceTier` the answer reports.",
        "",
        "| field | how | rule |",
        "|---|---|---|",
    ]
    lines += [f"| `{name}` | {HOW_TITLES[r.how]} | {r.why} |" for name, r in CONVERSE_REQUEST.items()]
    return lines
