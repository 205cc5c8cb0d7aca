"""The JSON type of every field of the live endpoints (gateway/admission/request_fields.py `check_params`
checks each body against it before anything is sized or reserved)."""

from __future__ import annotations

from typing import Any

# The JSON type each field of each endpoint takes, as the official SDKs type it
# (tests/gateway/test_field_types.py compares it with their request TypedDicts). Every field is
# checked against it before anything is sized or reserved, so a value of the wrong type is a 400
# there instead of an error wherever the field is first used (after admission, or upstream).
# null is accepted everywhere: it means the field is absent, as the SDKs' Optional fields do.
_S, _I, _N, _B, _O, _A = "string", "integer", "number", "boolean", "object", "array"
_ANY = (_S, _I, _N, _B, _O, _A)
FIELD_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "chat": {
        **dict.fromkeys(
            (
                "model",
                "reasoning_effort",
                "verbosity",
                "service_tier",
                "user",
                "safety_identifier",
                "prompt_cache_key",
                "prompt_cache_retention",
            ),
            (_S,),
        ),
        **dict.fromkeys(("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs"), (_I,)),
        **dict.fromkeys(("frequency_penalty", "presence_penalty", "temperature", "top_p"), (_N,)),
        **dict.fromkeys(("logprobs", "parallel_tool_calls", "store", "stream"), (_B,)),
        **dict.fromkeys(
            (
                "audio",
                "logit_bias",
                "metadata",
                "moderation",
                "prediction",
                "prompt_cache_options",
                "response_format",
                "stream_options",
                "web_search_options",
            ),
            (_O,),
        ),
        **dict.fromkeys(("messages", "functions", "modalities", "tools"), (_A,)),
        **dict.fromkeys(("function_call", "tool_choice"), (_S, _O)),
        "stop": (_S, _A),
    },
    "messages": {
        **dict.fromkeys(("model", "inference_geo", "service_tier"), (_S,)),
        **dict.fromkeys(("max_tokens", "top_k"), (_I,)),
        **dict.fromkeys(("temperature", "top_p"), (_N,)),
        "stream": (_B,),
        **dict.fromkeys(("cache_control", "metadata", "output_config", "thinking", "tool_choice"), (_O,)),
        **dict.fromkeys(("messages", "stop_sequences", "tools", "mcp_servers"), (_A,)),
        "system": (_S, _A),
        "container": (_S, _O),
        "speed": (_S,),
        **dict.fromkeys(("context_management", "diagnostics", "thread"), (_O,)),
        "safeguards": (_A,),
    },
    "responses": {
        **dict.fromkeys(
            (
                "instructions",
                "model",
                "previous_response_id",
                "prompt_cache_key",
                "prompt_cache_retention",
                "safety_identifier",
                "service_tier",
                "truncation",
                "user",
            ),
            (_S,),
        ),
        **dict.fromkeys(("max_output_tokens", "max_tool_calls", "top_logprobs"), (_I,)),
        **dict.fromkeys(("temperature", "top_p"), (_N,)),
        **dict.fromkeys(("background", "parallel_tool_calls", "store", "stream"), (_B,)),
        **dict.fromkeys(
            ("metadata", "moderation", "prompt", "prompt_cache_options", "reasoning", "stream_options", "text"), (_O,)
        ),
        **dict.fromkeys(("context_management", "include", "tools"), (_A,)),
        **dict.fromkeys(("conversation", "tool_choice"), (_S, _O)),
        "input": (_S, _A),
        **dict.fromkeys(("access_programs", "background_options", "image"), (_O,)),
        # Codex CLI sends it; the SDK does not type it: any JSON value (its bytes are in the
        # input bound like every field's).
        "client_metadata": _ANY,
    },
    # POST /v1/responses/compact: its fields take /v1/responses' types.
    "compact": {},
    "embeddings": {
        **dict.fromkeys(("model", "encoding_format", "user"), (_S,)),
        "dimensions": (_I,),
        "input": (_S, _A),
    },
}
FIELD_TYPES["compact"] = {
    name: FIELD_TYPES["responses"][name]
    for name in (
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "reasoning",
        "text",
        "service_tier",
        "image",
        "parallel_tool_calls",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
    )
}
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    _S: (str,),
    _I: (int,),
    _N: (int, float),
    _B: (bool,),
    _O: (dict,),
    _A: (list,),
}
ARTICLES = {_S: "a string", _I: "an integer", _N: "a number", _B: "a boolean", _O: "an object", _A: "an array"}


def json_type_ok(value: Any, names: tuple[str, ...]) -> bool:
    """Whether a parsed JSON value is one of the JSON types `names` (a boolean is no number)."""
    if value is None:
        return True
    if isinstance(value, bool):
        return _B in names
    return any(isinstance(value, _JSON_TYPES[name]) for name in names)
