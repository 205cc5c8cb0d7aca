"""Deeply nested or oversized JSON is a 400/413 in the endpoint's own shape, never a 500, and
changes nothing (issue 9, item 5)."""

from __future__ import annotations

import json

import httpx
import pytest
from rest_framework.test import APIClient

from core import jsonlimits
from ledger.models import Budget, Reservation, UsageRecord
from tests.gateway.conftest import KEY

AUTH = {"authorization": f"Bearer {KEY}"}
# What the issue sent: 2,500 levels, past Python's recursion limit.
DEEP = ("[" * 2500 + "]" * 2500).encode()


def deep_body(levels: int) -> bytes:
    # A well-formed request whose `metadata` nests `levels` - 1 levels below the top object.
    return (
        b'{"model": "echo-1", "max_tokens": 5, "messages": [], "metadata": '
        + b"[" * (levels - 1)
        + b"]" * (levels - 1)
        + b"}"
    )


def without_depth_guard(monkeypatch) -> None:
    """The guard removed: the loader is json.loads again (RecursionError and all)."""

    def plain(raw, *, max_bytes=None, depth=None):
        if max_bytes is not None and len(raw) > max_bytes:
            raise jsonlimits.JSONLimitError("too large", code="request_too_large", status=413)
        return json.loads(raw)

    monkeypatch.setattr(jsonlimits, "loads", plain)


# --- the loader ----------------------------------------------------------------------------------


def test_loader_accepts_the_limit_and_refuses_one_more(settings):
    settings.CAPGATE = {**settings.CAPGATE, "MAX_JSON_DEPTH": 5}
    assert jsonlimits.loads(b"[[[[[1]]]]]") == [[[[[1]]]]]
    with pytest.raises(jsonlimits.JSONLimitError) as exc:
        jsonlimits.loads(b'[[[{"a": [[1]]}]]]')
    assert exc.value.code == "json_too_deep" and exc.value.status == 400
    # Many brackets side by side are not depth.
    assert len(jsonlimits.loads(json.dumps([[i] for i in range(1000)]))) == 1000


def test_loader_refuses_what_python_cannot_parse_and_what_is_too_big():
    with pytest.raises(jsonlimits.JSONLimitError) as exc:
        jsonlimits.loads(DEEP)
    assert exc.value.code == "json_too_deep"
    with pytest.raises(jsonlimits.JSONLimitError) as exc:
        jsonlimits.loads(b"[" + b"1," * 100 + b"1]", max_bytes=100)
    assert exc.value.status == 413


# --- the gateway ---------------------------------------------------------------------------------

OPENAI_PATHS = ["/v1/chat/completions", "/v1/embeddings", "/v1/reservations", "/v1/reservations/r1/settle"]


def post(gateway, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(gateway.url + path, content=raw, headers={**AUTH, "content-type": "application/json"}, timeout=30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", OPENAI_PATHS)
@pytest.mark.parametrize("raw", [DEEP, deep_body(200)], ids=["2500-levels", "200-levels"])
def test_deep_json_is_a_400_in_openai_shape(gateway, wired, path, raw):
    r = post(gateway, path, raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "json_too_deep" and err["type"] == "invalid_request_error"
    assert "64 levels" in err["message"]
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("raw", [DEEP, deep_body(200)], ids=["2500-levels", "200-levels"])
def test_deep_json_is_a_400_in_anthropic_shape(gateway, wired, raw):
    r = post(gateway, "/v1/messages", raw)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "json_too_deep"
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_real_nested_request_still_passes(gateway, wired):
    # A tool schema nested a few levels is ordinary: served, not refused.
    schema = {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "string"}}}}
                },
            }
        },
    }
    body = {
        "model": "echo-1",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
    }
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.django_db(transaction=True)
def test_without_the_depth_guard_the_gateway_fails(gateway, wired, monkeypatch):
    without_depth_guard(monkeypatch)
    assert post(gateway, "/v1/chat/completions", DEEP).status_code == 500
    # ... and the 500 still comes in each endpoint's own shape.
    r = post(gateway, "/v1/messages", DEEP)
    assert r.status_code == 500
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert post(gateway, "/v1/messages", deep_body(200)).json()["error"]["code"] != "json_too_deep"


# --- the management API --------------------------------------------------------------------------


def api_post(org_a, raw: bytes) -> object:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {org_a.token_write}")
    return client.post(f"/api/orgs/{org_a.slug}/budgets/", data=raw, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw", [DEEP, b'{"name": "x", "recipients": ' + b"[" * 100 + b"]" * 100 + b"}"], ids=["2500-levels", "100-levels"]
)
def test_deep_json_is_a_400_in_the_api_shape(org_a, raw):
    before = Budget.objects.count()
    r = api_post(org_a, raw)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "json_too_deep" and "levels" in r.json()["detail"]
    assert Budget.objects.count() == before


@pytest.mark.django_db
def test_an_oversized_json_body_is_a_413_in_the_api_shape(org_a, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    r = api_post(org_a, json.dumps({"name": "x" * 2000}).encode())
    assert r.status_code == 413
    assert r.json()["code"] == "request_too_large"


@pytest.mark.django_db
def test_without_the_depth_guard_the_api_fails(org_a, monkeypatch):
    without_depth_guard(monkeypatch)
    client_raises = False
    try:
        r = api_post(org_a, DEEP)
    except RecursionError:
        client_raises = True  # the test client re-raises what would be a 500
    assert client_raises or r.status_code == 500
