"""Fixtures for the real-client tests: the live gateway and its tenant (tests/gateway/conftest.py),
with headroom slices off and on (money tests run both ways)."""

import time
from decimal import Decimal

import pytest

from ledger import slices
from ledger.models import UsageRecord
from requestlog import buffer
from requestlog.models import Refusal
from tests.gateway.conftest import gateway, upstream, wired  # noqa: F401

# The fake upstream's usage for every call: what each client's request is billed for.
PROMPT_TOKENS, COMPLETION_TOKENS = 1200, 30


@pytest.fixture(params=[False, True], ids=["slices-off", "slices-on"])
def slices_mode(request, settings, monkeypatch):
    monkeypatch.setattr(slices, "book", slices.Book())
    settings.CAPGATE = {**settings.CAPGATE, "SLICES": request.param}
    return request.param


@pytest.fixture
def agent_tenant(wired, upstream, slices_mode):  # noqa: F811
    """The test tenant with a search price (Codex always sends a web_search tool) and the fake
    upstream's usage fixed."""
    wired.model.web_search_usd_per_use = Decimal("0.01")
    wired.model.server_tool_result_tokens = 2000
    wired.model.save()
    upstream.control(prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS)
    return wired


def requests_seen() -> int:
    """Every request the gateway answered after the key was known: admitted ones have a usage
    record, refused ones a Refusal row (written from the in-memory buffer here)."""
    # The gateway's own loop flushes the same buffer: a flush here can find it empty while that
    # one is still writing, so wait (bounded) for the rows to land. The client has exited by now,
    # so any retry it made is already among them.
    deadline = time.monotonic() + 5.0
    while True:
        buffer.flush()
        seen = UsageRecord.objects.count() + Refusal.objects.count()
        if seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)
