"""The billing inventory (gateway/billing/) against the official SDKs' request types, and
docs/billing.md against the inventory.

The SDK versions are pinned in pyproject.toml. A new version that adds a request parameter fails
here until the parameter is classified, instead of reaching a provider unbounded."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import anthropic.resources.messages.batches
import anthropic.resources.messages.messages
import anthropic.types as anthropic_types
import anthropic.types.beta as anthropic_beta_types
import pytest
from anthropic.types.anthropic_beta_param import AnthropicBetaParam
from anthropic.types.message_create_params import MessageCreateParamsBase
from anthropic.types.messages.batch_create_params import BatchCreateParams as MessageBatchCreateParams
from openai.types.batch_create_params import BatchCreateParams
from openai.types.chat import ChatCompletionToolUnionParam
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.embedding_create_params import EmbeddingCreateParams
from openai.types.file_create_params import FileCreateParams
from openai.types.responses.response_compact_params import ResponseCompactParams
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from openai.types.responses.tool_param import ToolParam
from openai.types.video_create_params import VideoCreateParams

from gateway import billing
from gateway.admission.request_fields import ALLOWED

DOCS = Path(__file__).resolve().parents[2] / "docs" / "billing.md"


def _header_params() -> dict[str, str]:
    """Parameters the Anthropic SDK's messages resources send as a header, read from their source
    (`"anthropic-user-profile-id": user_profile_id`): parameter -> header."""
    source = "".join(
        inspect.getsource(module)
        for module in (anthropic.resources.messages.messages, anthropic.resources.messages.batches)
    )
    return {param: header for header, param in re.findall(r'"(anthropic-[a-z0-9-]+)": (\w+)', source)}


HEADER_PARAMS = _header_params()


def _sdk_params(typed_dict: type) -> set[str]:
    """Every parameter the SDK can send: body fields, or the header a field is aliased to or sent as."""
    names = set()
    for name, hint in typing.get_type_hints(typed_dict, include_extras=True).items():
        alias = next(
            (getattr(m, "alias", None) for m in getattr(hint, "__metadata__", ()) if getattr(m, "alias", None)), None
        )
        names.add(alias or HEADER_PARAMS.get(name, name))
    return names


def _literals(hint: object) -> set[str]:
    """The string literals in a (nested) union or Literal type."""
    out: set[str] = set()
    for arg in typing.get_args(hint):
        if isinstance(arg, str):
            out.add(arg)
        else:
            out |= _literals(arg)
    return out


def _tool_types(union: object) -> set[str]:
    """The `type` values of every tool param in an SDK tool union ('custom' for a tool without one)."""
    out = set()
    for member in typing.get_args(union):
        if typing.get_origin(member) is typing.Annotated:
            member = typing.get_args(member)[0]
        hints = typing.get_type_hints(member)
        out |= _literals(hints["type"]) if "type" in hints else {"custom"}
    return out


@pytest.mark.parametrize(
    ("kind", "typed_dict"),
    [
        ("chat", CompletionCreateParamsBase),
        ("messages", MessageCreateParamsBase),
        ("embeddings", EmbeddingCreateParams),
        ("responses", ResponseCreateParamsBase),
        ("compact", ResponseCompactParams),
    ],
)
def test_every_parameter_the_official_sdk_can_send_is_classified(kind, typed_dict):
    known = set(billing.FIELDS[kind]) | set(billing.HEADERS[kind]) | set(billing.NOT_FORWARDED)
    missing = sorted(_sdk_params(typed_dict) - known)
    assert not missing, f"unclassified {kind} parameters (add each to gateway/billing/live.py): {missing}"


def test_every_anthropic_beta_the_official_sdk_knows_is_classified():
    sdk = {billing.undated(v) for v in _literals(AnthropicBetaParam)}
    assert len(sdk) > 30  # the SDK's list was read, not an empty union
    missing = sorted(sdk - set(billing.ANTHROPIC_BETAS))
    assert not missing, f"unclassified anthropic-beta values (add each to gateway/billing/live.py): {missing}"


@pytest.mark.parametrize(
    ("kind", "unions"),
    [
        ("messages", [anthropic_types.ToolUnionParam, anthropic_beta_types.BetaToolUnionParam]),
        ("responses", [ToolParam]),
        ("chat", [ChatCompletionToolUnionParam]),
    ],
)
def test_every_tool_type_the_official_sdk_can_send_is_classified(kind, unions):
    sdk = {billing.undated(t) for union in unions for t in _tool_types(union)}
    missing = sorted(sdk - set(billing.TOOL_TYPES[kind]))
    assert not missing, f"unclassified {kind} tool types (add each to gateway/billing/live.py): {missing}"


def test_parameters_the_sdk_sends_as_headers_are_found():
    # the header mapping above is read from the SDK's source: it must find the ones it sends today
    assert HEADER_PARAMS["user_profile_id"] == "anthropic-user-profile-id"
    assert HEADER_PARAMS["workspace_id"] == "anthropic-workspace-id"


def test_the_gateway_accepts_exactly_the_inventorys_fields():
    assert {k: set(v) for k, v in billing.FIELDS.items()} == ALLOWED
    for table in [
        *billing.FIELDS.values(),
        *billing.JOB_FIELDS.values(),
        *billing.HEADERS.values(),
        *billing.TOOL_TYPES.values(),
        billing.ANTHROPIC_BETAS,
    ]:
        assert all(entry.cls in billing.CLASS_TITLES and entry.why for entry in table.values())


@pytest.mark.parametrize(
    ("kind", "typed_dict"),
    [
        ("files", FileCreateParams),
        ("batches", BatchCreateParams),
        ("message_batches", MessageBatchCreateParams),
        ("videos", VideoCreateParams),
    ],
)
def test_a_job_endpoint_lists_exactly_what_the_official_sdk_can_send(kind, typed_dict):
    sdk = _sdk_params(typed_dict)
    headers = {name for name in sdk if name.startswith(billing.PROVIDER_HEADER_PREFIXES)}
    # both ways: a new SDK field fails until classified, and the endpoint accepts no field the
    # SDK cannot send (each endpoint's allowlist is its JOB_FIELDS table: tests/jobs/test_job_fields.py)
    assert sdk - headers == set(billing.JOB_FIELDS[kind]), "classify it in gateway/billing/jobs.py"
    assert headers <= set(billing.JOB_HEADERS_NOT_FORWARDED[kind])


def test_docs_billing_md_is_the_inventory():
    assert DOCS.read_text() == billing.markdown(), "regenerate: python -m gateway.billing > docs/billing.md"


def test_the_inventory_would_catch_a_new_sdk_parameter():
    # the check above is not vacuous: a TypedDict with one more field fails it
    Extended = typing.TypedDict("Extended", {"model": str, "brand_new_paid_option": bool}, total=False)  # noqa: UP013
    assert _sdk_params(Extended) - set(billing.FIELDS["chat"]) == {"brand_new_paid_option"}


def test_every_connection_kind_says_what_it_adds_to_the_bill():
    from catalog.models import Connection

    assert set(billing.KINDS) == set(Connection.Kind.values)
