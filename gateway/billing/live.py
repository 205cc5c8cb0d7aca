"""The live endpoints' tables: /v1/chat/completions, /v1/messages, /v1/responses and
/v1/embeddings — their fields, forwarded headers, tool types and Anthropic betas."""

from __future__ import annotations

import re

from gateway.billing.entries import FREE, IDENT, PRICED, REFUSED, TOKENS, Entry

_e = Entry

_SAMPLING = "a sampling setting; output stays within the output ceiling"
_BODY = "its bytes are part of the input bound"

FIELDS: dict[str, dict[str, Entry]] = {
    "chat": {
        "model": _e(TOKENS, "priced at the most expensive route target; the target's own model id is sent upstream"),
        "messages": _e(
            TOKENS,
            "UTF-8 bytes + per-message framing bound the input tokens; images by the model's image bound, in "
            "tool messages too; "
            "audio and files refused under a blocking cap; so is an assistant message's `audio` (earlier audio "
            "output named by id, which the provider bills again as input audio tokens the catalog has no price "
            "for): 402 `audio_reference_under_budget`, param `messages[].audio`",
        ),
        "max_tokens": _e(
            TOKENS,
            "the output ceiling; above the model's catalog maximum output it is reserved and sent at that maximum",
        ),
        "max_completion_tokens": _e(
            TOKENS,
            "the output ceiling (reasoning tokens count inside it); above the model's catalog maximum output "
            "it is reserved and sent at that maximum",
        ),
        "n": _e(TOKENS, "the output ceiling is reserved once per choice"),
        "tools": _e(
            TOKENS,
            "function and custom tool schemas are body bytes, plus a fixed tool-use overhead; other tool "
            "types are refused",
        ),
        "functions": _e(TOKENS, _BODY + ", plus the tool-use overhead"),
        "response_format": _e(TOKENS, _BODY),
        "prediction": _e(
            TOKENS,
            "rejected prediction tokens are billed as output: the prediction's bytes are added to the output bound",
        ),
        "reasoning_effort": _e(TOKENS, "reasoning tokens are output tokens inside max_completion_tokens"),
        "verbosity": _e(TOKENS, "output length inside the output ceiling"),
        "service_tier": _e(
            PRICED,
            "priority/fast and flex are priced by the catalog's tier multipliers; auto is the connection's "
            "configured tier; a tier without a price is refused under a blocking cap",
        ),
        "audio": _e(REFUSED, "audio output is priced per audio token, which the catalog cannot bound"),
        "modalities": _e(
            REFUSED, "an 'audio' modality buys audio output (refused under a blocking cap); ['text'] is free"
        ),
        "web_search_options": _e(
            REFUSED, "search-preview models bill a per-call fee plus search content the body cannot show"
        ),
        "moderation": _e(REFUSED, "moderation of input and output has no documented price"),
        "frequency_penalty": _e(FREE, _SAMPLING),
        "presence_penalty": _e(FREE, _SAMPLING),
        "logit_bias": _e(FREE, _SAMPLING),
        "logprobs": _e(FREE, "returns log probabilities of the same tokens"),
        "top_logprobs": _e(FREE, "returns log probabilities of the same tokens"),
        "seed": _e(FREE, _SAMPLING),
        "stop": _e(FREE, "can only end the output sooner"),
        "temperature": _e(FREE, _SAMPLING),
        "top_p": _e(FREE, _SAMPLING),
        "stream": _e(FREE, "same tokens, delivered as events"),
        "stream_options": _e(FREE, "the gateway always asks for usage"),
        "tool_choice": _e(FREE, "chooses among tools already in the body"),
        "function_call": _e(FREE, "chooses among functions already in the body"),
        "parallel_tool_calls": _e(FREE, "tool calls are output inside the output ceiling"),
        "metadata": _e(FREE, IDENT),
        "store": _e(FREE, "stored completions are not billed"),
        "user": _e(FREE, IDENT),
        "safety_identifier": _e(FREE, IDENT),
        "prompt_cache_key": _e(FREE, "routes to a cache; a cache read is cheaper than input"),
        "prompt_cache_retention": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
        "prompt_cache_options": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
    },
    "messages": {
        "model": _e(TOKENS, "priced at the most expensive route target; the target's own model id is sent upstream"),
        "messages": _e(
            TOKENS,
            "UTF-8 bytes + per-message framing bound the input tokens; images by the model's image bound, in "
            "tool_result content too; documents (in tool_result and web fetch results too) refused under a "
            "blocking cap",
        ),
        "system": _e(TOKENS, _BODY),
        "max_tokens": _e(
            TOKENS,
            "the output ceiling; above the model's catalog maximum output it is reserved and sent at that maximum",
        ),
        "thinking": _e(
            TOKENS, "budget_tokens sits inside max_tokens (with interleaved thinking it is added to the output bound)"
        ),
        "output_config": _e(
            TOKENS, "effort and output format shape output inside max_tokens; a format schema is body bytes"
        ),
        "tools": _e(
            PRICED,
            "custom tools are body bytes plus the tool-use overhead; web_search is priced per use with "
            "max_uses (injected when absent), each use another pass adding a bounded result; web_fetch is bounded by "
            "max_uses x max_content_tokens (injected when absent); code_execution and MCP toolsets are "
            "refused under a blocking cap",
        ),
        "cache_control": _e(
            PRICED, "cache writes are bounded at the cache-write rate; ttl '1h' at the catalog's 1-hour write price"
        ),
        "service_tier": _e(
            PRICED,
            "auto is the connection's configured tier (standard unless set); priority is priced by the "
            "catalog's multiplier",
        ),
        "container": _e(REFUSED, "code-execution containers are billed by the hour"),
        "mcp_servers": _e(REFUSED, "remote MCP tool results add input the body cannot show"),
        "inference_geo": _e(REFUSED, "regional inference is priced above the global rate; 'global' is free"),
        "speed": _e(
            PRICED,
            "'fast' is fast mode: every token rate times the catalog's fast-mode multiplier (genai-prices' "
            "fast price), recorded at the speed the usage reports; refused under a blocking cap on a model "
            "without one; 'standard' is free",
        ),
        "context_management": _e(
            TOKENS,
            "clear_thinking and clear_tool_uses edits only drop earlier context, so the whole body still bounds "
            "the input; a compact edit runs a model call of its own and is refused under a blocking cap",
        ),
        "diagnostics": _e(FREE, "asks for the reason of a prompt-cache miss in the response; not billed"),
        "safeguards": _e(
            FREE,
            "asks the provider to check the response's tool calls (Claude Code's auto mode: dangerous_tool_use); "
            "the server runs those checks as part of the request at no charge (code.claude.com/docs/en/"
            "auto-mode-classifier-billing); its classifier_context is body bytes",
        ),
        "thread": _e(
            TOKENS,
            "a message thread: 'create' keeps the conversation under the response's id; a 'continue' adds that "
            "earlier context, bounded by what capgate relayed for the previous message (its input + output "
            "tokens); a previous_message_id capgate did not relay is refused under a blocking cap",
        ),
        "metadata": _e(FREE, IDENT),
        "stop_sequences": _e(FREE, "can only end the output sooner"),
        "stream": _e(FREE, "same tokens, delivered as events"),
        "temperature": _e(FREE, _SAMPLING),
        "top_p": _e(FREE, _SAMPLING),
        "top_k": _e(FREE, _SAMPLING),
        "tool_choice": _e(FREE, "chooses among tools already in the body"),
    },
    "responses": {
        "model": _e(TOKENS, "priced at the most expensive route target; the target's own model id is sent upstream"),
        "input": _e(
            TOKENS,
            "UTF-8 bytes + per-item framing bound the input tokens; images by the model's image bound wherever "
            "they sit (messages, function and custom tool outputs, computer-use screenshots); files, audio and "
            "item references refused under a blocking cap, in tool outputs as in messages",
        ),
        "instructions": _e(TOKENS, _BODY),
        "max_output_tokens": _e(
            TOKENS,
            "the output ceiling (reasoning tokens count inside it); above the model's catalog maximum output "
            "it is reserved and sent at that maximum",
        ),
        "reasoning": _e(TOKENS, "reasoning tokens are output tokens inside max_output_tokens"),
        "text": _e(TOKENS, "a format schema is body bytes; verbosity stays inside the output ceiling"),
        "previous_response_id": _e(
            TOKENS,
            "the earlier context is bounded by what capgate relayed for that response (its input + output "
            "tokens); an id capgate did not relay is refused under a blocking cap",
        ),
        "conversation": _e(
            TOKENS,
            "the conversation's context is bounded by the last response capgate relayed in it (or, after a "
            "turn that ended without one, by that turn's bound); under a blocking cap one turn of a "
            "conversation runs at a time (409 conversation_locked meanwhile), since the provider bills a turn "
            "for items other turns add while it waits; an unknown conversation, or a background turn of one, "
            "is refused under a blocking cap",
        ),
        "truncation": _e(TOKENS, "'auto' may drop context; the bound does not count on it"),
        "tools": _e(
            PRICED,
            "function, custom and client-run tools are body bytes plus the tool-use overhead; web_search is "
            "priced per use, its uses bounded by max_tool_calls (sent upstream, injected when absent), each "
            "another pass adding a bounded result; file_search, code_interpreter, image_generation, MCP and "
            "other hosted tools are refused under a blocking cap",
        ),
        "service_tier": _e(
            PRICED,
            "priority/fast and flex are priced by the catalog's tier multipliers; auto is the connection's "
            "configured tier",
        ),
        "background": _e(
            TOKENS,
            "a provider job (jobs/background.py): bounded like the same response in the foreground, admitted "
            "at submission, its hold kept until the provider's final report",
        ),
        "prompt": _e(REFUSED, "a stored prompt template adds input the body cannot show"),
        "context_management": _e(REFUSED, "server-side compaction runs model calls of its own"),
        "moderation": _e(REFUSED, "moderation of input and output has no documented price"),
        "access_programs": _e(
            FREE, "selects an access program (e.g. Cyber) the organization is authorized for; same token prices"
        ),
        "image": _e(FREE, "image context compression can only lower the input; the bound counts images uncompressed"),
        "background_options": _e(
            TOKENS,
            "a background job's completion window: the discounted windows cost less than the foreground "
            "price the job is bounded at",
        ),
        "client_metadata": _e(FREE, "labels the client sends about itself (Codex's turn metadata)"),
        "max_tool_calls": _e(FREE, "can only lower the number of built-in tool calls"),
        "tool_choice": _e(FREE, "chooses among tools already in the body"),
        "parallel_tool_calls": _e(FREE, "tool calls are output inside the output ceiling"),
        "include": _e(FREE, "returns more of the same response; not billed"),
        "store": _e(FREE, "stored responses are not billed"),
        "stream": _e(FREE, "same tokens, delivered as events"),
        "stream_options": _e(FREE, "delivery options"),
        "metadata": _e(FREE, IDENT),
        "user": _e(FREE, IDENT),
        "safety_identifier": _e(FREE, IDENT),
        "temperature": _e(FREE, _SAMPLING),
        "top_p": _e(FREE, _SAMPLING),
        "top_logprobs": _e(FREE, "returns log probabilities of the same tokens"),
        "prompt_cache_key": _e(FREE, "routes to a cache; a cache read is cheaper than input"),
        "prompt_cache_retention": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
        "prompt_cache_options": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
    },
    # POST /v1/responses/compact: the SDK's `responses.compact` fields, and the ones Codex's compaction
    # sends besides (tools, parallel_tool_calls, reasoning, text). It has no output ceiling field.
    "compact": {
        "model": _e(TOKENS, "priced at the most expensive route target; the target's own model id is sent upstream"),
        "input": _e(
            TOKENS,
            "the history to compact: UTF-8 bytes + per-item framing bound the input tokens, as for /v1/responses; "
            "files, audio and item references refused under a blocking cap",
        ),
        "instructions": _e(TOKENS, _BODY),
        "previous_response_id": _e(
            TOKENS, "as for /v1/responses: bounded by what capgate relayed for that response, else refused under a cap"
        ),
        "tools": _e(
            TOKENS,
            "definitions in the body plus the tool-use overhead: the compaction pass returns the user messages "
            "and one compaction item and runs no tool; tool types refused on /v1/responses are refused here too",
        ),
        "reasoning": _e(
            TOKENS,
            "reasoning tokens are output; the request has no output ceiling, so the output is bounded at the "
            "model's maximum output (never a ceiling capgate could send)",
        ),
        "text": _e(TOKENS, "verbosity and format stay inside the output bound; a schema is body bytes"),
        "service_tier": _e(
            PRICED,
            "priority/fast and flex are priced by the catalog's tier multipliers; auto is the connection's "
            "configured tier",
        ),
        "image": _e(FREE, "image context compression can only lower the input; the bound counts images uncompressed"),
        "parallel_tool_calls": _e(FREE, "no tool is called by a compaction"),
        "prompt_cache_key": _e(FREE, "routes to a cache; a cache read is cheaper than input"),
        "prompt_cache_retention": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
        "prompt_cache_options": _e(FREE, "OpenAI cache writes cost nothing extra; reads are cheaper than input"),
    },
    "embeddings": {
        "model": _e(TOKENS, "priced at the most expensive route target; the target's own model id is sent upstream"),
        "input": _e(TOKENS, "UTF-8 bytes (or token arrays) bound the input tokens"),
        "dimensions": _e(FREE, "shortens the returned vector"),
        "encoding_format": _e(FREE, "how the vector is encoded"),
        "user": _e(FREE, IDENT),
    },
}

# Request headers forwarded upstream. Everything else the client sends stays at the gateway.
HEADERS: dict[str, dict[str, Entry]] = {
    "chat": {},
    "responses": {},
    "compact": {},
    "embeddings": {},
    "messages": {
        "anthropic-version": _e(FREE, "the wire-format version"),
        "anthropic-beta": _e(PRICED, "each beta is classified below; an unknown beta is refused"),
        "anthropic-user-profile-id": _e(FREE, IDENT),
    },
}

# Provider headers a client may send that are never forwarded (the connection decides the
# account), so they cannot change the bill. Any other header with a provider prefix is refused.
NOT_FORWARDED = {
    "anthropic-dangerous-direct-browser-access": "a browser-use acknowledgement for the SDK",
    "anthropic-workspace-id": "the connection's own account and workspace are billed",
    "openai-organization": "the connection's own account is billed",
    "openai-project": "the connection's own account is billed",
}
PROVIDER_HEADER_PREFIXES = ("anthropic-", "openai-")

# Other headers the SDKs and agents send (tests/clients/test_client_headers.py captures them from
# the real clients), never forwarded: the provider bills the body and the provider headers above,
# and sees the connection's own key and client. A name ending in "-" is a prefix.
_SESSION = "a session id; a session is capped by X-Capgate-Run (README), and the provider bills none of it"
CLIENT_HEADERS = {
    "accept": "HTTP content negotiation between the client and capgate",
    "accept-encoding": "HTTP content negotiation between the client and capgate",
    "connection": "HTTP transport between the client and capgate",
    "content-length": "HTTP transport between the client and capgate",
    "content-type": "HTTP transport between the client and capgate",
    "host": "HTTP transport between the client and capgate",
    "user-agent": "the client's name and version; capgate's own HTTP client calls the provider",
    "authorization": "the capgate key; the connection's own credentials are sent upstream",
    "x-api-key": "the capgate key; the connection's own credentials are sent upstream",
    "x-capgate-": "capgate's own: end customer, run and run budget",
    "x-stainless-": "the SDKs' platform, retry and timeout telemetry",
    "x-app": "Claude Code's client label",
    "x-claude-code-session-id": "Claude Code's " + _SESSION,
    "session-id": "Codex's " + _SESSION,
    "thread-id": "Codex's thread id; the provider bills none of it",
    "x-client-request-id": "the client's request id; capgate names each call by x-capgate-request-id",
    "originator": "which Codex front end sent the request",
    "x-codex-": "Codex's window id, turn metadata and feature flags for its own backend; the Responses API "
    "bills none of them (remote compaction is a call of its own, POST /v1/responses/compact)",
}


def client_header(name: str) -> str | None:
    """Why a non-provider header a client sends stays at the gateway; None if the inventory does
    not list it (it stays at the gateway all the same: only the headers above are forwarded)."""
    name = name.lower()
    if name in CLIENT_HEADERS:
        return CLIENT_HEADERS[name]
    for prefix, why in CLIENT_HEADERS.items():
        if prefix.endswith("-") and name.startswith(prefix):
            return why
    return None


# anthropic-beta values, by name without the date suffix.
ANTHROPIC_BETAS: dict[str, Entry] = {
    "prompt-caching": _e(TOKENS, "cache writes are bounded at the cache-write rate"),
    "extended-cache-ttl": _e(PRICED, "allows ttl '1h' cache writes, priced at the catalog's 1-hour write price"),
    "token-efficient-tools": _e(FREE, "fewer output tokens for tool calls"),
    "fine-grained-tool-streaming": _e(FREE, "same tokens, streamed sooner"),
    "interleaved-thinking": _e(TOKENS, "thinking budget_tokens is added to the output bound"),
    "output-128k": _e(TOKENS, "output stays within max_tokens"),
    "context-1m": _e(PRICED, "prompts above the model's long-context threshold are priced at its long-context band"),
    "context-management": _e(FREE, "clears old context: can only lower the input"),
    "computer-use": _e(TOKENS, "client-side tool: its definition adds a fixed overhead"),
    "web-search": _e(PRICED, "see tools: web_search"),
    "web-fetch": _e(TOKENS, "see tools: web_fetch"),
    "structured-outputs": _e(TOKENS, "a format schema is body bytes"),
    "effort": _e(TOKENS, "output stays within max_tokens"),
    "user-profiles": _e(FREE, IDENT),
    "code-execution": _e(REFUSED, "code-execution containers are billed by the hour"),
    "mcp-client": _e(REFUSED, "remote MCP tool results add input the body cannot show"),
    "files-api": _e(REFUSED, "file references add input the body cannot show"),
    "skills": _e(REFUSED, "skills run in billed code-execution containers"),
    # Claude Code's own (it sends claude-code, interleaved-thinking, context-management,
    # per-turn-control, mid-conversation-tool-changes, thinking-token-count, advanced-tool-use, effort).
    "claude-code": _e(FREE, "identifies the Claude Code client"),
    # Claude Code's auto mode (-p --permission-mode auto) adds these two with the 'safeguards' field.
    "afk-mode": _e(FREE, "auto mode's server-side classifier review, run at no charge (see 'safeguards')"),
    "dangerous-tool-use": _e(FREE, "the dangerous_tool_use safeguard, checked at no charge (see 'safeguards')"),
    "per-turn-control": _e(TOKENS, "per-turn settings carried in the body"),
    "advanced-tool-use": _e(
        TOKENS,
        "tool search over deferred tool definitions that are in the body (defer_loading only keeps them out of "
        "the context) and tool-use examples (body bytes); programmatic tool calling needs a code_execution tool, "
        "refused under a blocking cap",
    ),
    "mid-conversation-tool-changes": _e(TOKENS, "tools changed between turns are in the body"),
    "mid-conversation-output-config": _e(TOKENS, "output settings changed between turns stay inside max_tokens"),
    "mid-conversation-system-clear-at": _e(TOKENS, "system text changed between turns is in the body"),
    "inline-tools": _e(TOKENS, "tools defined inside messages are body bytes"),
    "thinking-token-count": _e(FREE, "reports how many thinking tokens were used"),
    "thinking-display-updates": _e(TOKENS, "thinking is billed inside max_tokens however it is displayed"),
    "thinking-binding-controls": _e(TOKENS, "thinking stays inside max_tokens"),
    "dev-full-thinking": _e(TOKENS, "full instead of summarized thinking, billed inside max_tokens either way"),
    "output-300k": _e(TOKENS, "output stays within max_tokens"),
    "model-context-window-exceeded": _e(FREE, "a stop reason instead of an error at the context limit"),
    "cache-diagnosis": _e(FREE, "reports why a prompt-cache prefix was not reused"),
    "token-counting": _e(FREE, "token counting is not billed"),
    "message-batches": _e(TOKENS, "batches are bounded on their own endpoint, at the batch price"),
    "pdfs": _e(TOKENS, "document parts are parts nothing bounds: refused under a blocking cap"),
    "task-budgets": _e(FREE, "a task budget can only end an agent's work sooner"),
    "user-profiles-billing": _e(FREE, IDENT),
    "fast-mode": _e(
        PRICED, "enables 'speed': 'fast', priced by the catalog's fast-mode multiplier (the 'speed' field's entry)"
    ),
    "compact": _e(REFUSED, "server-side compaction runs model calls of its own"),
    "server-side-fallback": _e(REFUSED, "the provider may serve the request with another, differently priced model"),
    "fallback-credit": _e(REFUSED, "changes how a fallback is billed, in a way the catalog cannot price"),
    "advisor-tool": _e(REFUSED, "an advisor model's calls are billed on top of the request"),
    "agent-memory": _e(REFUSED, "memory stored server-side adds input the body cannot show"),
    "dreaming": _e(REFUSED, "server-side background work the body cannot bound"),
    "message-threads": _e(TOKENS, "see the 'thread' field: a continue is bounded by the context capgate relayed"),
    "managed-agents": _e(REFUSED, "managed agent sessions run and bill server-side"),
    "mcp-tunnels": _e(REFUSED, "remote MCP tool results add input the body cannot show"),
    "efs": _e(REFUSED, "file storage for code-execution containers, billed on its own"),
    "experimental-claude-tag": _e(REFUSED, "undocumented: refused under a blocking cap until classified"),
    # Admin and account APIs: they change nothing a Messages call bills.
    "admin-user-sign-out": _e(FREE, "an Admin API beta; no effect on a Messages call"),
    "analytics-usage-cost": _e(FREE, "an Admin API beta; no effect on a Messages call"),
    "spend-limit-reads": _e(FREE, "an Admin API beta; no effect on a Messages call"),
    "telemetry-destinations": _e(FREE, "an Admin API beta; no effect on a Messages call"),
    "webhooks": _e(FREE, "an Admin API beta; no effect on a Messages call"),
    "google-managed-data-controls": _e(FREE, "an account data-control setting; no effect on a Messages call"),
    "ce-claude-code-managed-settings": _e(FREE, "an enterprise admin beta; no effect on a Messages call"),
    "ce-plugins": _e(FREE, "an enterprise admin beta; no effect on a Messages call"),
    "ce-user-management": _e(FREE, "an enterprise admin beta; no effect on a Messages call"),
}

# Tool `type` values, per endpoint, by name without the date suffix.
# A hosted web search, by the parameter that bounds its uses.
_SEARCH = (
    "web search: per-use price (web_search_usd_per_use) x {n}; each search is another pass over the "
    "request and adds up to server_tool_result_tokens to every later pass"
)

TOOL_TYPES: dict[str, dict[str, Entry]] = {
    "chat": {
        "function": _e(TOKENS, "a schema in the body"),
        "custom": _e(TOKENS, "a definition in the body"),
    },
    "responses": {
        "function": _e(TOKENS, "a schema in the body"),
        "custom": _e(TOKENS, "a definition in the body"),
        "namespace": _e(TOKENS, "a group of function schemas in the body"),
        "computer": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "computer_use_preview": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "local_shell": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "shell": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "apply_patch": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "web_search": _e(PRICED, _SEARCH.format(n="max_tool_calls")),
        "web_search_preview": _e(PRICED, _SEARCH.format(n="max_tool_calls")),
        "file_search": _e(REFUSED, "billed per call plus vector storage"),
        "code_interpreter": _e(REFUSED, "code containers are billed per session"),
        "image_generation": _e(REFUSED, "images are billed per image"),
        "mcp": _e(REFUSED, "remote MCP tool results add input the body cannot show"),
        "tool_search": _e(REFUSED, "hosted tool search adds input the body cannot show"),
        "programmatic_tool_calling": _e(REFUSED, "hosted code execution is billed on its own"),
    },
    "messages": {
        "custom": _e(TOKENS, "a schema in the body (also: no type)"),
        "web_search": _e(PRICED, _SEARCH.format(n="max_uses")),
        "web_fetch": _e(TOKENS, "fetched content: max_uses x max_content_tokens"),
        "bash": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "text_editor": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "computer": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "memory": _e(TOKENS, "client-side tool: a fixed definition overhead"),
        "tool_search_tool_regex": _e(
            TOKENS, "searches deferred tool definitions that are in the body; what it loads is already bounded"
        ),
        "tool_search_tool_bm25": _e(
            TOKENS, "searches deferred tool definitions that are in the body; what it loads is already bounded"
        ),
        "advisor": _e(REFUSED, "an advisor model's calls are billed on top of the request"),
        "browser_toolset": _e(REFUSED, "a hosted browser session is billed on its own"),
        "computer_toolset": _e(REFUSED, "a hosted computer session is billed on its own"),
        "code_execution": _e(REFUSED, "code-execution containers are billed by the hour"),
        "mcp_toolset": _e(REFUSED, "remote MCP tool results add input the body cannot show"),
    },
}

_DATED = re.compile(r"^(?P<name>.+?)[-_](?P<date>\d{8}|\d{4}-\d{2}-\d{2}|\d{4}_\d{2}_\d{2})$")


def undated(value: str) -> str:
    """'web_search_20250305' -> 'web_search'; 'context-1m-2025-08-07' -> 'context-1m'."""
    m = _DATED.match(value)
    return m.group("name") if m else value
