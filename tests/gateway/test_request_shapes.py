"""Request shapes the gateway must refuse with a 400 in the endpoint's own shape before anything is
reserved: a field of the wrong type (e.g. `stream_options` as a string while streaming), a lone
UTF-16 surrogate in any text field (JSON carries it as an escape), and a batch `endpoint` that is
not a string. Each runs under a blocking cap with headroom slices off and on: before the checks,
each was a 500 — some after admission, leaving an `estimated` record charged at the worst case."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from tests.gateway.conftest import KEY, assert_nothing_held

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]
LONE = "\ud800"  # json.dumps writes it as the escape \ud800, as a client's JSON may carry it


def post(gateway, path: str, body: dict) -> httpx.Response:
    # json.dumps (ensure_ascii) escapes a lone surrogate as \ud800, which is valid JSON text
    return httpx.post(gateway.url + path, content=json.dumps(body).encode(), headers=AUTH, timeout=30)


def assert_openai_400(r: httpx.Response, param: str | None = None) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param


def assert_anthropic_400(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "stream": True, "stream_options": "x"}),
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "stream": True, "stream_options": ["x"]}),
        ("/v1/responses", {"model": "echo-1", "input": "hi", "stream": True, "stream_options": "x"}),
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "stop": 5}),
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "metadata": "x"}),
        ("/v1/responses", {"model": "echo-1", "input": "hi", "text": []}),
        ("/v1/embeddings", {"model": "echo-1", "input": "hi", "dimensions": "8"}),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_before_admission(gateway, wired, slices_mode, path, body):
    # given: a blocking cap, so the request would be admitted against it
    wired.budget(amount="1")
    # when
    r = post(gateway, path, body)
    # then
    wrong = next(k for k in body if k not in ("model", "messages", "input", "stream"))
    assert_openai_400(r, param=wrong)
    assert_nothing_held()


def test_a_wrongly_typed_messages_field_is_a_400_in_anthropic_shape(gateway, wired, slices_mode):
    wired.budget(amount="1")
    r = post(gateway, "/v1/messages", {"model": "echo-1", "max_tokens": 10, "messages": MSG, "metadata": "x"})
    assert_anthropic_400(r)
    assert_nothing_held()


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"model": "echo-1", "messages": [{"role": "user", "content": LONE}]}),
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "user": "a" + LONE}),
        ("/v1/chat/completions", {"model": "echo-1", "messages": MSG, "metadata": {LONE: "key"}}),
        ("/v1/responses", {"model": "echo-1", "input": "x" + LONE}),
        ("/v1/embeddings", {"model": "echo-1", "input": [LONE]}),
        ("/v1/reservations", {"model": "echo-1", "messages": [{"role": "user", "content": LONE}]}),
        ("/v1/reservations", {"amount_usd": "0.01", "request_id": LONE}),
    ],
)
def test_a_lone_surrogate_is_a_400_before_admission(gateway, wired, slices_mode, path, body):
    wired.budget(amount="1")
    r = post(gateway, path, body)
    assert_openai_400(r)
    assert r.json()["error"]["code"] == "invalid_unicode"
    assert_nothing_held()


def test_a_lone_surrogate_in_messages_is_a_400_in_anthropic_shape(gateway, wired, slices_mode):
    wired.budget(amount="1")
    r = post(
        gateway, "/v1/messages", {"model": "echo-1", "max_tokens": 10, "messages": [{"role": "user", "content": LONE}]}
    )
    assert_anthropic_400(r)
    assert_nothing_held()


def test_a_lone_surrogate_in_a_message_batch_is_a_400(gateway, wired, slices_mode):
    wired.budget(amount="1")
    line = {
        "custom_id": "a",
        "params": {"model": "echo-1", "max_tokens": 10, "messages": [{"role": "user", "content": LONE}]},
    }
    r = post(gateway, "/v1/messages/batches", {"requests": [line]})
    assert_anthropic_400(r)
    assert_nothing_held()


def _upload(gateway, lines: list[dict]) -> httpx.Response:
    content = ("\n".join(json.dumps(x) for x in lines) + "\n").encode()
    return httpx.post(
        gateway.url + "/v1/files",
        headers={"authorization": f"Bearer {KEY}"},
        data={"purpose": "batch"},
        files={"file": ("batch.jsonl", io.BytesIO(content), "application/jsonl")},
        timeout=30,
    )


def _line(content: str = "hi", url: object = "/v1/chat/completions") -> dict:
    body = {"model": "echo-1", "max_tokens": 10, "messages": [{"role": "user", "content": content}]}
    return {"custom_id": "r1", "method": "POST", "url": url, "body": body}


def test_a_lone_surrogate_in_a_batch_line_is_a_400(gateway, wired, slices_mode):
    wired.budget(amount="1")
    r = _upload(gateway, [_line(LONE)])
    assert_openai_400(r)
    assert "line 1" in r.json()["error"]["message"]
    assert_nothing_held()


def test_a_batch_line_whose_url_is_a_list_is_a_400(gateway, wired, slices_mode):
    wired.budget(amount="1")
    r = _upload(gateway, [_line(url=["/v1/chat/completions"])])
    assert_openai_400(r)
    assert_nothing_held()


@pytest.mark.parametrize("endpoint", [["/v1/chat/completions"], {"a": 1}, 7])
def test_a_batch_whose_endpoint_is_not_a_string_is_a_400(gateway, wired, slices_mode, endpoint):
    # given: an uploaded batch file, under a blocking cap
    wired.budget(amount="1")
    up = _upload(gateway, [_line()])
    assert up.status_code == 200, up.text
    # when
    r = post(
        gateway, "/v1/batches", {"input_file_id": up.json()["id"], "endpoint": endpoint, "completion_window": "24h"}
    )
    # then
    assert_openai_400(r, param="endpoint")
    assert_nothing_held()
