"""The JSON types of the official SDKs' request parameters, read from their TypedDicts: what
gateway/admission/field_types.py FIELD_TYPES is compared with, and what the fuzz test generates from."""

from __future__ import annotations

import collections.abc
import types
import typing

import typing_extensions
from anthropic.types.message_create_params import MessageCreateParamsBase
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.embedding_create_params import EmbeddingCreateParams
from openai.types.responses.response_compact_params import ResponseCompactParams
from openai.types.responses.response_create_params import ResponseCreateParamsBase

SDK_PARAMS: dict[str, type] = {
    "chat": CompletionCreateParamsBase,
    "messages": MessageCreateParamsBase,
    "embeddings": EmbeddingCreateParams,
    "responses": ResponseCreateParamsBase,
    "compact": ResponseCompactParams,
}
_SEQUENCES = (
    list,
    tuple,
    collections.abc.Iterable,
    collections.abc.Sequence,
    typing.Iterable,
    typing.Sequence,
    typing.List,  # noqa: UP006 (what the SDKs annotate with)
)


def json_types(hint: object) -> set[str]:
    """The JSON types a parameter annotation allows ("null" for Optional)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Annotated, typing.Required, typing.NotRequired, typing_extensions.Required):
        return json_types(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(json_types(a) for a in typing.get_args(hint)))
    if origin is typing.Literal:
        return {_literal(v) for v in typing.get_args(hint)}
    if origin in (dict, typing.Dict, collections.abc.Mapping):  # noqa: UP006
        return {"object"}
    if origin in _SEQUENCES:
        return {"array"}
    if hint is type(None):
        return {"null"}
    if hint is str:
        return {"string"}
    if hint is bool:
        return {"boolean"}
    if hint is int:
        return {"integer"}
    if hint is float:
        return {"number"}
    if typing_extensions.is_typeddict(hint):
        return {"object"}
    if hint is object:
        return {"string", "integer", "number", "boolean", "object", "array"}
    raise AssertionError(f"no JSON type for {hint!r}")


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "integer"
    raise AssertionError(f"literal {value!r}")


def sdk_field_types(kind: str) -> dict[str, set[str]]:
    """{field: JSON types} for every body field of the endpoint's SDK params (null left out)."""
    hints = typing.get_type_hints(SDK_PARAMS[kind], include_extras=True)
    out = {}
    for name, hint in hints.items():
        metadata = getattr(hint, "__metadata__", ())
        if any(getattr(m, "alias", None) for m in metadata):
            continue  # sent as a header, not a body field
        out[name] = json_types(hint) - {"null"}
    return out
