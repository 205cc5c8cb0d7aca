"""The billing inventory (gateway/billing/) against the official SDKs' request types, and
docs/billing.md against the inventory.

The SDK versions are pinned in pyproject.toml. A new version that adds a request parameter fails
here until the parameter is classified, instead of reaching a provider unbounded."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from anthropic.types.message_create_params import MessageCreateParamsBase
from anthropic.types.messages.batch_create_params import BatchCreateParams as MessageBatchCreateParams
from openai.types.batch_create_params import BatchCreateParams
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.embedding_create_params import EmbeddingCreateParams
from openai.types.file_create_params import FileCreateParams
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from openai.types.video_create_params import VideoCreateParams

from gateway import billing
from gateway.request_fields import ALLOWED

DOCS = Path(__file__).resolve().parents[2] / "docs" / "billing.md"


def _sdk_params(typed_dict: type) -> set[str]:
    """Every parameter the SDK can send: body fields, or the header a field is aliased to."""
    names = set()
    for name, hint in typing.get_type_hints(typed_dict, include_extras=True).items():
        alias = next(
            (getattr(m, "alias", None) for m in getattr(hint, "__metadata__", ()) if getattr(m, "alias", None)), None
        )
        names.add(alias or name)
    return names


@pytest.mark.parametrize(
    ("kind", "typed_dict"),
    [
        ("chat", CompletionCreateParamsBase),
        ("messages", MessageCreateParamsBase),
        ("embeddings", EmbeddingCreateParams),
        ("responses", ResponseCreateParamsBase),
    ],
)
def test_every_parameter_the_official_sdk_can_send_is_classified(kind, typed_dict):
    known = set(billing.FIELDS[kind]) | set(billing.HEADERS[kind])
    missing = sorted(_sdk_params(typed_dict) - known)
    assert not missing, f"unclassified {kind} parameters (add each to gateway/billing/live.py): {missing}"


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
