"""The fields, betas and tool types coding agents and the current SDKs send, through the live
gateway: what is bounded is admitted under a blocking cap, what is priced above the catalog is
refused under it (and allowed under alert budgets), and a malformed value is a 400."""

from __future__ import annotations

import httpx
import pytest

from ledger.models import Reservation, UsageRecord
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = {"authorization": f"Bearer {KEY}"}
# Claude Code 2.1's betas on every request (tests/clients/ runs the real client).
CLAUDE_CODE_BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,"
    "advanced-tool-use-2025-11-20,effort-2025-11-24"
)
CLEAR = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"}]}


def _post(gateway, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    model = "gpt-test" if path == "/v1/responses" else "claude-test"
    if path == "/v1/responses":
        full = {"model": model, "input": "hi", "max_output_tokens": 10, **body}
    else:
        full = {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(gateway.url + path, json=full, headers={**AUTH, **(headers or {})}, timeout=30)


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/messages", {"context_management": CLEAR}, {"anthropic-beta": CLAUDE_CODE_BETAS}),
        ("/v1/messages", {"speed": "standard", "diagnostics": {"previous_message_id": None}}, {}),
        (
            "/v1/messages",
            {
                "tools": [
                    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
                    {"name": "Read", "input_schema": {"type": "object"}, "defer_loading": True},
                ]
            },
            {"anthropic-beta": "advanced-tool-use-2025-11-20"},
        ),
        ("/v1/messages", {}, {"anthropic-workspace-id": "wrkspc_1", "anthropic-beta": "output-300k-2026-03-24"}),
        (
            "/v1/responses",
            {"client_metadata": {"x-codex-turn-metadata": "{}"}, "image": {"context_compression": "auto"}},
            {},
        ),
        ("/v1/responses", {"access_programs": {"cyber": "standard"}}, {}),
    ],
)
def test_what_agents_send_is_admitted_under_a_blocking_cap_and_recorded(gateway, wired, upstream, path, body, headers):
    wired.budget(amount="5")
    resp = _post(gateway, path, body, headers)
    assert resp.status_code == 200, resp.text
    wait_settled()
    assert UsageRecord.objects.get().status == "served"
    assert not Reservation.objects.exists()
    # headers that choose the account are never forwarded: the connection's own account pays
    sent = upstream.last(path)["headers"]
    assert "anthropic-workspace-id" not in sent


@pytest.mark.parametrize(
    ("body", "headers", "code"),
    [
        ({"speed": "fast"}, {}, "speed_under_budget"),
        # fast mode on a model the catalog has no fast-mode multiplier for (tests/gateway/test_fast_mode.py)
        ({"speed": "fast"}, {"anthropic-beta": "fast-mode-2026-02-01"}, "speed_under_budget"),
        ({"context_management": {"edits": [{"type": "compact_20260112"}]}}, {}, "context_management_under_budget"),
        ({}, {"anthropic-beta": "server-side-fallback-2026-07-01"}, "anthropic_beta_under_budget"),
        ({"tools": [{"type": "advisor_20260301", "name": "advisor"}]}, {}, "advisor_under_budget"),
    ],
)
def test_what_the_catalog_cannot_price_is_refused_under_a_cap_and_allowed_under_alerts(
    gateway, wired, upstream, body, headers, code
):
    wired.budget(amount="5", mode="alert")
    assert _post(gateway, "/v1/messages", body, headers).status_code == 200
    wired.budget(amount="5")
    resp = _post(gateway, "/v1/messages", body, headers)
    assert resp.status_code == 402
    assert resp.json()["type"] == "error"  # Anthropic's shape on its endpoint
    assert code in resp.text


@pytest.mark.parametrize(
    "body",
    [
        {"speed": "ludicrous"},
        {"context_management": {"edits": "clear"}},
        {"context_management": {"edits": [{"keep": "all"}]}},
        {"context_management": []},
    ],
)
def test_a_malformed_agent_field_is_a_400_naming_it_and_changes_nothing(gateway, wired, body):
    wired.budget(amount="5")
    resp = _post(gateway, "/v1/messages", body)
    assert resp.status_code == 400
    assert resp.json()["type"] == "error"
    assert next(iter(body)) in resp.json()["error"]["message"]
    assert not UsageRecord.objects.exists()
    assert not Reservation.objects.exists()


def test_a_route_with_no_compatible_connection_is_a_final_400_not_an_overload(gateway, wired, upstream):
    # an embeddings call to a route served only by an Anthropic connection (embeddings are not
    # translated between formats): configuration, not an outage
    wired.route("gpt-test", wired.anthropic)
    resp = httpx.post(
        gateway.url + "/v1/embeddings", json={"model": "gpt-test", "input": "hi"}, headers=AUTH, timeout=30
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"  # not a 503, which SDKs retry
    assert resp.json()["error"]["code"] == "no_compatible_connection"
    assert resp.headers["x-should-retry"] == "false"
    assert upstream.stats()["requests"] == 0
