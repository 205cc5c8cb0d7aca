"""A live capgate in front of the fake upstream (tests/gateway/conftest.py), an organization
wired to it, and helpers to drive jobs through the official SDKs and beat's poll."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import anthropic
import openai
import pytest

from tests.api.conftest import org_a, org_b  # noqa: F401  (fixtures)
from tests.gateway.conftest import KEY, gateway, slices_mode, upstream, wired  # noqa: F401  (fixtures)

LINE_MAX_TOKENS = 1000


def oa(gw) -> openai.OpenAI:
    return openai.OpenAI(api_key=KEY, base_url=gw.url + "/v1", max_retries=0, timeout=30)


def an(gw) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=KEY, base_url=gw.url, max_retries=0, timeout=30)


def batch_file(lines: int, *, model: str = "gpt-test", max_tokens: int = LINE_MAX_TOKENS) -> io.BytesIO:
    rows = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"question {i}"}],
                },
            }
        )
        for i in range(lines)
    ]
    return io.BytesIO(("\n".join(rows) + "\n").encode())


def upload(client: openai.OpenAI, lines: int, **kw):
    return client.files.create(file=("batch.jsonl", batch_file(lines, **kw)), purpose="batch")


@pytest.fixture
def jobs_org(request):
    """`wired`, with the model at a batch price of half and a video price."""
    org = request.getfixturevalue("wired")
    model = org.model
    model.batch_multiplier = Decimal("0.5")
    model.video_usd_per_second = Decimal("0.10")
    model.save()
    org.route("sora-test", org.openai)
    return org
