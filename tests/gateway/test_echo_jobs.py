"""echo's job endpoints (echo/jobs.py), called the way the jobs app calls a provider:
`send(connection, method, path, body=/files=/data=)`. Real Redis holds echo's objects; the
answers are validated with the pinned SDKs' own types and read back with the gateway's usage
parsers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from django.test import override_settings
from openai.types import Batch, FileObject, Video
from openai.types.responses import Response

from catalog.models import Connection
from echo import jobs as echo_jobs
from echo import provider as echo
from gateway.admission.bounds import SHAPERS
from gateway.providers import usage_anthropic, usage_openai, usage_responses

CHAT = "/v1/chat/completions"


def connection(**options: Any) -> Connection:
    return Connection(name="echo", kind="echo", base_url="", options=options)  # never saved: echo reads options only


def call(conn: Connection, method: str, path: str, **kw: Any) -> httpx.Response:
    return asyncio.run(echo_jobs.send(conn, method, path, **kw))


def upload(conn: Connection, lines: list[dict[str, Any]], purpose: str = "batch") -> str:
    content = "\n".join(json.dumps(line) for line in lines).encode()
    r = call(
        conn,
        "POST",
        "/v1/files",
        data={"purpose": purpose},
        files={"file": ("in.jsonl", content, "application/jsonl")},
    )
    assert r.status_code == 200, r.text
    return FileObject.model_validate(r.json()).id


def chat_line(custom_id: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"hello {custom_id}"}],
        **extra,
    }
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def batch(conn: Connection, lines: list[dict[str, Any]], endpoint: str = CHAT) -> httpx.Response:
    return call(
        conn,
        "POST",
        "/v1/batches",
        body={
            "input_file_id": upload(conn, lines),
            "endpoint": endpoint,
            "completion_window": "24h",
        },
    )


def live_usage(kind: str, body: dict[str, Any], **options: Any) -> dict[str, Any]:
    """What echo answers the same request live (echo/transport.py's entry point for a live call)."""
    opts = connection(**options).options
    return json.loads(asyncio.run(echo.echo_response(opts, kind, body, SHAPERS[kind](body).text_tokens)))["usage"]


def test_files_upload_retrieve_content_delete() -> None:
    conn = connection()
    file_id = upload(conn, [{"a": 1}])
    got = FileObject.model_validate(call(conn, "GET", f"/v1/files/{file_id}").json())
    assert got.purpose == "batch" and got.bytes == len(b'{"a": 1}') and got.filename == "in.jsonl"
    assert call(conn, "GET", f"/v1/files/{file_id}/content").content == b'{"a": 1}'
    assert call(conn, "DELETE", f"/v1/files/{file_id}").json() == {
        "id": file_id,
        "object": "file",
        "deleted": True,
    }
    gone = call(conn, "GET", f"/v1/files/{file_id}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    refused = call(conn, "POST", "/v1/files", data={"purpose": "nope"}, files={"file": ("x", b"{}")})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "purpose"


def test_batch_completes_on_first_read_with_the_usage_echo_gives_live() -> None:
    conn = connection(completion_tokens=9)
    lines = [chat_line("a", max_tokens=4), chat_line("b"), chat_line("c", max_completion_tokens=30)]
    created = Batch.model_validate(batch(conn, lines).json())
    assert created.status == "validating" and created.output_file_id is None
    done = Batch.model_validate(call(conn, "GET", f"/v1/batches/{created.id}").json())
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 3
    assert done.error_file_id is None and done.output_file_id is not None
    out = [json.loads(x) for x in call(conn, "GET", f"/v1/files/{done.output_file_id}/content").text.splitlines()]
    assert [x["custom_id"] for x in out] == ["a", "b", "c"]
    for line, sent in zip(out, lines, strict=True):
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["usage"] == live_usage("chat", sent["body"], completion_tokens=9)
        assert usage_openai(line["response"]["body"]["usage"]) is not None
    assert [x["response"]["body"]["usage"]["completion_tokens"] for x in out] == [4, 9, 9]
    assert done.usage is not None and done.usage.output_tokens == 22
    assert done.usage.input_tokens == sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in out)
    cancelled = call(conn, "POST", f"/v1/batches/{created.id}/cancel")  # too late: it finished
    assert cancelled.json() == call(conn, "GET", f"/v1/batches/{created.id}").json()


def test_batch_failed_lines_validation_and_refusals() -> None:
    conn = connection(prompt_tokens=7)
    emb = [
        {
            "custom_id": "ok",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "e", "input": "x"},
        },
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "e", "input": 5},
        },
    ]
    done = Batch.model_validate(
        call(conn, "GET", f"/v1/batches/{batch(conn, emb, '/v1/embeddings').json()['id']}").json()
    )
    assert done.request_counts is not None and (
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (1, 1)
    assert done.usage is not None and done.usage.input_tokens == 7
    [bad] = [json.loads(x) for x in call(conn, "GET", f"/v1/files/{done.error_file_id}/content").text.splitlines()]
    assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 400

    wrong = batch(conn, [chat_line("a"), {**chat_line("b"), "url": "/v1/embeddings"}]).json()
    failed = Batch.model_validate(call(conn, "GET", f"/v1/batches/{wrong['id']}").json())
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert [e.line for e in failed.errors.data] == [2] and failed.output_file_id is None
    assert batch(conn, [chat_line("a")], "/v1/completions").status_code == 400
    no_file = call(
        conn,
        "POST",
        "/v1/batches",
        body={"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h"},
    )
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "input_file_id"
    assert call(conn, "GET", "/v1/batches/batch_nope").status_code == 404


def test_message_batch_results_with_message_usage() -> None:
    conn = connection(completion_tokens=12)
    params = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    requests = [
        {"custom_id": "a", "params": params},
        {"custom_id": "b", "params": {**params, "max_tokens": 50}},
        {"custom_id": "bad", "params": {"model": "claude-x", "max_tokens": 5, "messages": []}},
    ]
    r = call(conn, "POST", "/v1/messages/batches", body={"requests": requests})
    created = MessageBatch.model_validate(r.json())
    assert created.processing_status == "in_progress" and created.request_counts.processing == 3
    ended = MessageBatch.model_validate(call(conn, "GET", f"/v1/messages/batches/{created.id}").json())
    assert (
        ended.processing_status == "ended"
        and ended.results_url
        and ended.results_url.endswith(f"/v1/messages/batches/{created.id}/results")
    )
    assert (ended.request_counts.succeeded, ended.request_counts.errored) == (2, 1)
    raw = call(conn, "GET", f"/v1/messages/batches/{created.id}/results").text.splitlines()
    results = {x.custom_id: x.result for x in map(MessageBatchIndividualResponse.model_validate_json, raw)}
    assert results["bad"].type == "errored"
    a, b = results["a"], results["b"]
    assert a.type == "succeeded" and b.type == "succeeded"
    assert (a.message.usage.output_tokens, b.message.usage.output_tokens) == (5, 12)
    assert usage_anthropic(a.message.usage.model_dump()) is not None
    assert call(conn, "POST", f"/v1/messages/batches/{created.id}/cancel").json()["processing_status"] == "ended"
    refused = call(conn, "POST", "/v1/messages/batches", body={"requests": []})
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert call(conn, "GET", "/v1/messages/batches/msgbatch_nope").json()["error"]["type"] == "not_found_error"


def test_background_response_queued_then_completed() -> None:
    conn = connection(completion_tokens=20)
    body = {"model": "gpt-4o-mini", "input": "hi", "background": True, "max_output_tokens": 6}
    queued = Response.model_validate(call(conn, "POST", "/v1/responses", body=body).json())
    assert queued.status == "queued" and queued.usage is None and queued.background is True
    done = call(conn, "GET", f"/v1/responses/{queued.id}").json()
    assert Response.model_validate(done).status == "completed"
    assert done["usage"] == live_usage("responses", body, completion_tokens=20) and done["usage"]["output_tokens"] == 6
    assert usage_responses(done) is not None
    assert call(conn, "POST", f"/v1/responses/{queued.id}/cancel").json() == done
    assert call(conn, "DELETE", f"/v1/responses/{queued.id}").json()["deleted"] is True
    assert call(conn, "GET", f"/v1/responses/{queued.id}").status_code == 404
    plain = call(conn, "POST", "/v1/responses", body={"model": "gpt-4o-mini", "input": "hi"}).json()
    assert plain["status"] == "completed" and call(conn, "GET", f"/v1/responses/{plain['id']}").status_code == 404


def test_video_queued_then_completed_with_billed_seconds() -> None:
    conn = connection()
    r = call(
        conn,
        "POST",
        "/v1/videos",
        data={"prompt": "a fox", "seconds": "8", "model": "sora-2"},
        files={},
    )
    queued = Video.model_validate(r.json())
    assert queued.status == "queued" and queued.seconds == "8"
    done = Video.model_validate(call(conn, "GET", f"/v1/videos/{queued.id}").json())
    assert done.status == "completed" and done.progress == 100 and done.seconds == "8"
    content = call(conn, "GET", f"/v1/videos/{queued.id}/content")
    assert content.headers["content-type"] == "video/mp4" and content.content.startswith(b"\x00\x00\x00\x18ftyp")
    assert (
        call(conn, "GET", f"/v1/videos/{queued.id}/content?variant=thumbnail").headers["content-type"] == "image/webp"
    )
    as_parts = call(conn, "POST", "/v1/videos", files={"prompt": (None, b"p"), "seconds": (None, "12")})
    assert as_parts.status_code == 200 and as_parts.json()["seconds"] == "12"
    assert call(conn, "POST", "/v1/videos", body={"prompt": "p", "seconds": "5"}).status_code == 400
    assert call(conn, "POST", "/v1/videos", body={"seconds": "4"}).status_code == 400
    assert call(conn, "DELETE", f"/v1/videos/{queued.id}").json()["deleted"] is True
    assert call(conn, "GET", f"/v1/videos/{queued.id}").status_code == 404


def test_a_job_created_in_one_process_is_read_in_another() -> None:
    """uvicorn runs one worker per core: a poll may land on a worker that did not create the job."""
    conn = connection()
    batch_id = batch(conn, [chat_line("a")]).json()["id"]
    script = (
        "import asyncio, django, json; django.setup()\n"
        "from catalog.models import Connection\nfrom echo import jobs as echo_jobs\n"
        "conn = Connection(name='echo', kind='echo', base_url='', options={})\n"
        f"r = asyncio.run(echo_jobs.send(conn, 'GET', '/v1/batches/{batch_id}'))\n"
        "print(json.dumps([r.status_code, r.json()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    status, other = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == 200 and other["status"] == "completed"
    assert other == call(conn, "GET", f"/v1/batches/{batch_id}").json()


def test_store_unavailable_and_unknown_paths_answer_in_the_provider_shape() -> None:
    conn = connection()
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        down = call(conn, "GET", "/v1/batches/batch_x")
        down_anthropic = call(conn, "GET", "/v1/messages/batches/msgbatch_x")
    assert down.status_code == 503 and down.json()["error"]["code"] == "unavailable"
    assert down_anthropic.status_code == 503 and down_anthropic.json()["error"]["type"] == "overloaded_error"
    unknown = call(conn, "GET", "/v1/batches")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"


def test_line_output_is_capped_by_its_own_ceiling_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: echo never reports more output than the line asked for (the gateway's bound)."""
    conn = connection(completion_tokens=50)
    lines = [chat_line("a", max_tokens=3)]

    def billed() -> int:
        done = call(conn, "GET", f"/v1/batches/{batch(conn, lines).json()['id']}").json()
        return done["usage"]["output_tokens"]

    assert billed() == 3
    monkeypatch.setattr(echo, "usage_numbers", lambda opts, bound, ceiling: (1, int(opts["completion_tokens"])))
    assert billed() == 50  # without the cap a line bills past its ceiling
