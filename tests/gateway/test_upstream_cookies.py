"""The upstream clients keep no cookies: one aiohttp session and a few httpx clients carry every
tenant's calls, so a cookie one provider answer set (an edge's session cookie, say) would go out
with the next call to that host, whoever it is for. Whole answers (straight from the aiohttp
session) and streams (through httpx) alike; the removal test shows the cookie sent on."""

from __future__ import annotations

import httpx
import pytest

from gateway.upstream import transport
from tests.gateway.conftest import KEY, wait_settled

PATH = "/v1/chat/completions"


@pytest.fixture
def fresh_clients():
    """The shared clients rebuilt for the test (they read the guard when they are made)."""
    transport._clients.clear()
    yield
    transport._clients.clear()


def _call(gateway, *, stream: bool, set_cookie: str = "") -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    if set_cookie:
        headers["X-Upstream-set_cookie"] = set_cookie
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": stream}
    resp = httpx.post(f"{gateway.url}{PATH}", json=body, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def _cookie_sent_after_one_was_set(gateway, upstream, *, stream: bool) -> str | None:
    # given: an upstream answer that sets a cookie for its host
    _call(gateway, stream=stream, set_cookie="edge_session=tenant-a-secret; Path=/")
    # when: the next call goes to the same host
    _call(gateway, stream=stream)
    wait_settled()
    return upstream.last(PATH)["headers"].get("cookie")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_cookie_an_answer_set_is_not_sent_with_the_next_call(gateway, wired, upstream, fresh_clients, stream):
    # then: nothing was kept to send
    assert _cookie_sent_after_one_was_set(gateway, upstream, stream=stream) is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_removal_with_a_cookie_jar_the_next_call_carries_the_cookie(
    gateway, wired, upstream, fresh_clients, monkeypatch, stream
):
    monkeypatch.setattr(transport.GUARDS, "no_cookie_jar", False)
    # then: the first answer's cookie went out with the second call
    assert "edge_session=tenant-a-secret" in (_cookie_sent_after_one_was_set(gateway, upstream, stream=stream) or "")
