"""The fake upstream's files and job endpoints, driven by the official SDKs (openai, anthropic)
exactly as capgate's clients call them, through every state the control plane can set.
Plain pytest: no database, no Django."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from .server import UpstreamHandle, run_in_thread

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamHandle]:
    handle = run_in_thread()
    yield handle
    handle.stop()


@pytest.fixture
def oai(upstream: UpstreamHandle) -> Iterator[openai.OpenAI]:
    upstream.reset()
    with openai.OpenAI(base_url=upstream.url + "/v1", api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def ant(upstream: UpstreamHandle) -> Iterator[anthropic.Anthropic]:
    upstream.reset()
    with anthropic.Anthropic(base_url=upstream.url, api_key="test", max_retries=0) as client:
        yield client


def chat_line(custom_id: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], **extra}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def upload(oai: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    content = "\n".join(json.dumps(line) for line in lines).encode()
    return oai.files.create(file=("batch.jsonl", content), purpose="batch").id


def batch(oai: openai.OpenAI, lines: list[dict[str, Any]], endpoint: Any = CHAT) -> Any:
    return oai.batches.create(input_file_id=upload(oai, lines), endpoint=endpoint, completion_window="24h")


def jsonl(oai: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in oai.files.content(file_id).text.splitlines()]


def msg_request(custom_id: str, **params: Any) -> dict[str, Any]:
    base = {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return {"custom_id": custom_id, "params": {**base, **params}}


# -- files ----------------------------------------------------------------------------------


def test_files_upload_retrieve_content_list_delete(oai: openai.OpenAI) -> None:
    created = oai.files.create(file=("in.jsonl", b'{"a": 1}\n'), purpose="batch")
    assert created.object == "file" and created.purpose == "batch" and created.bytes == 9
    assert created.filename == "in.jsonl" and created.status == "processed"
    assert oai.files.retrieve(created.id) == created
    assert oai.files.content(created.id).content == b'{"a": 1}\n'
    assert [f.id for f in oai.files.list()] == [created.id]
    deleted = oai.files.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.files.content(created.id)


def test_file_upload_refusals(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    with pytest.raises(openai.BadRequestError, match="purpose"):
        oai.files.create(file=("in.jsonl", b"{}"), purpose="nonsense")  # type: ignore[arg-type]
    r = httpx.post(f"{upstream.url}/v1/files", data={"purpose": "batch"}, files={})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# -- OpenAI batches -------------------------------------------------------------------------


def test_batch_lifecycle_completed_bills_every_line_as_plain_requests_would(
    oai: openai.OpenAI, upstream: UpstreamHandle
) -> None:
    upstream.control(completion_tokens="max")  # per line: the line's own max_tokens
    created = batch(oai, [chat_line("a", max_tokens=7), chat_line("b", max_tokens=11)])
    assert created.status == "validating" and created.request_counts is not None
    assert created.request_counts.total == 2 and created.output_file_id is None
    running = oai.batches.retrieve(created.id)
    assert running.status == "in_progress" and running.usage is not None and running.usage.input_tokens == 0

    done = upstream.job(created.id, "completed")
    assert done["status"] == "completed"
    finished = oai.batches.retrieve(created.id)
    assert finished.status == "completed" and finished.completed_at is not None
    assert finished.request_counts is not None and finished.request_counts.completed == 2
    assert finished.error_file_id is None and finished.model == "gpt-4o-mini"
    out = jsonl(oai, finished.output_file_id)
    assert [line["custom_id"] for line in out] == ["a", "b"]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in out)
    plain = oai.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=7)
    assert plain.usage is not None
    assert (
        out[0]["response"]["body"]["usage"]
        == plain.usage.model_dump(exclude_none=True)
        == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
    )
    assert out[1]["response"]["body"]["usage"]["completion_tokens"] == 11
    assert finished.usage is not None
    assert (
        finished.usage.input_tokens,
        finished.usage.output_tokens,
        finished.usage.total_tokens,
    ) == (20, 18, 38)
    [row] = upstream.jobs()
    assert row["state"] == "completed" and row["billed"]["lines"] == 2
    assert (row["billed"]["input_tokens"], row["billed"]["output_tokens"]) == (20, 18)


def test_batch_usage_for_responses_and_embeddings_and_failed_lines(
    oai: openai.OpenAI, upstream: UpstreamHandle
) -> None:
    upstream.control(job_auto_complete=True, prompt_tokens=12, completion_tokens=3)
    lines = [
        {
            "custom_id": "r",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "gpt-4o-mini", "input": "hi"},
        }
    ]
    resp = oai.batches.retrieve(batch(oai, lines, "/v1/responses").id)
    assert resp.status == "completed" and resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (12, 3)
    [line] = jsonl(oai, resp.output_file_id)
    assert line["response"]["body"]["object"] == "response" and line["response"]["body"]["status"] == "completed"

    emb = [
        {
            "custom_id": "ok",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": "x"},
        },
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": 5},
        },
    ]
    finished = oai.batches.retrieve(batch(oai, emb, "/v1/embeddings").id)
    assert finished.status == "completed" and finished.request_counts is not None
    assert (finished.request_counts.completed, finished.request_counts.failed) == (1, 1)
    assert finished.usage is not None and (
        finished.usage.input_tokens,
        finished.usage.output_tokens,
    ) == (12, 0)
    [ok] = jsonl(oai, finished.output_file_id)
    [bad] = jsonl(oai, finished.error_file_id)
    assert ok["custom_id"] == "ok" and ok["response"]["body"]["usage"] == {
        "prompt_tokens": 12,
        "total_tokens": 12,
    }
    assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["type"] == "invalid_request_error"


def test_batch_cancel_keeps_cancelling_until_the_provider_reports_what_it_billed(
    oai: openai.OpenAI, upstream: UpstreamHandle
) -> None:
    created = batch(oai, [chat_line(f"l{i}") for i in range(4)])
    cancelling = oai.batches.cancel(created.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    assert oai.batches.retrieve(created.id).status == "cancelling"
    upstream.job(created.id, "cancelled", done=3)
    cancelled = oai.batches.retrieve(created.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.usage is not None and (
        cancelled.usage.input_tokens,
        cancelled.usage.output_tokens,
    ) == (30, 15)
    assert [x["custom_id"] for x in jsonl(oai, cancelled.output_file_id)] == ["l0", "l1", "l2"]
    [cut] = jsonl(oai, cancelled.error_file_id)
    assert cut["custom_id"] == "l3" and cut["response"] is None and cut["error"]["code"] == "batch_cancelled"
    assert oai.batches.cancel(created.id).status == "cancelled"  # a finished batch stays as it is
    assert upstream.jobs()[0]["billed"]["lines"] == 3


def test_batch_cancelled_and_expired_default_to_nothing_billed(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    a, b = (
        batch(oai, [chat_line("x"), chat_line("y")]),
        batch(oai, [chat_line("x"), chat_line("y")]),
    )
    upstream.job(a.id, "cancelled")
    upstream.job(b.id, "expired", done=1)
    cancelled, expired = oai.batches.retrieve(a.id), oai.batches.retrieve(b.id)
    assert cancelled.status == "cancelled" and cancelled.output_file_id is None
    assert cancelled.usage is not None and cancelled.usage.total_tokens == 0
    assert [x["error"]["code"] for x in jsonl(oai, cancelled.error_file_id)] == ["batch_cancelled"] * 2
    assert expired.status == "expired" and expired.expired_at is not None
    assert expired.usage is not None and expired.usage.total_tokens == 15
    assert [x["error"]["code"] for x in jsonl(oai, expired.error_file_id)] == ["batch_expired"]
    billed = {row["id"]: row["billed"]["lines"] for row in upstream.jobs()}
    assert billed == {a.id: 0, b.id: 1}


def test_batch_failed_gone_and_back(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    created = batch(oai, [chat_line("x")])
    upstream.job(created.id, "failed")
    failed = oai.batches.retrieve(created.id)
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data
    assert failed.output_file_id is None and failed.usage is not None and failed.usage.total_tokens == 0
    upstream.job(created.id, "gone")
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.batches.cancel(created.id)
    assert [b.id for b in oai.batches.list()] == []
    assert upstream.jobs()[0]["state"] == "gone"
    upstream.job(created.id, "completed")  # a report arriving later
    assert oai.batches.retrieve(created.id).status == "completed"
    upstream.job(created.id, "in_progress")
    assert oai.batches.retrieve(created.id).status == "in_progress"


def test_batch_validation_fails_the_batch_or_refuses_the_request(oai: openai.OpenAI) -> None:
    wrong_url = {**chat_line("x"), "url": "/v1/embeddings"}
    created = batch(oai, [chat_line("ok"), wrong_url, chat_line("ok")])
    failed = oai.batches.retrieve(created.id)
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert [(e.line, e.code) for e in failed.errors.data] == [
        (2, "invalid_request"),
        (3, "invalid_request"),
    ]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        batch(oai, [chat_line("x")], "/v1/completions")
    with pytest.raises(openai.BadRequestError, match="input_file_id"):
        oai.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    not_batch = oai.files.create(file=("x.jsonl", b"{}"), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        oai.batches.create(input_file_id=not_batch.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_unknown")


def test_batch_auto_complete_and_list(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    upstream.control(job_auto_complete=True)
    first, second = batch(oai, [chat_line("a")]), batch(oai, [chat_line("b")])
    assert first.status == second.status == "validating"
    assert oai.batches.cancel(second.id).status == "cancelling"  # a cancel is not a status read
    assert oai.batches.retrieve(first.id).status == "completed"
    assert oai.batches.retrieve(second.id).status == "cancelled"
    page = oai.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    assert [b.id for b in oai.batches.list()] == [second.id, first.id]
    upstream.control(job_auto_complete=False)
    assert oai.batches.retrieve(batch(oai, [chat_line("c")]).id).status == "in_progress"


def test_control_plane_refusals(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    created = batch(oai, [chat_line("x")])
    base = f"{upstream.url}/_control/jobs"
    assert httpx.post(f"{base}/batch_nope", json={"state": "completed"}).status_code == 404
    assert httpx.post(f"{base}/{created.id}", json={"state": "done"}).status_code == 400
    for done in (-1, "2", True):
        assert httpx.post(f"{base}/{created.id}", json={"state": "cancelled", "done": done}).status_code == 400
    assert httpx.get(f"{base}/{created.id}").json()["state"] == "in_progress"
    assert (
        httpx.post(f"{upstream.url}/_control", json={"job_auto_complete": "yes"}).json()["settings"][
            "job_auto_complete"
        ]
        is True
    )


# -- Anthropic message batches --------------------------------------------------------------


def test_message_batch_completed_results_carry_message_usage(
    ant: anthropic.Anthropic, upstream: UpstreamHandle
) -> None:
    upstream.control(completion_tokens="max")
    created = ant.messages.batches.create(requests=[msg_request("a", max_tokens=9), msg_request("b")])
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 2
    assert ant.messages.batches.retrieve(created.id).processing_status == "in_progress"
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        ant.messages.batches.results(created.id)  # the SDK refuses: no results_url yet
    early = httpx.get(f"{upstream.url}/v1/messages/batches/{created.id}/results")
    assert early.status_code == 400 and early.json()["error"]["type"] == "invalid_request_error"
    upstream.job(created.id, "completed")
    ended = ant.messages.batches.retrieve(created.id)
    assert ended.processing_status == "ended" and ended.ended_at is not None
    assert ended.request_counts.succeeded == 2 and ended.request_counts.processing == 0
    results = {r.custom_id: r.result for r in ant.messages.batches.results(created.id)}
    a, b = results["a"], results["b"]
    assert a.type == "succeeded" and b.type == "succeeded"
    assert (a.message.usage.input_tokens, a.message.usage.output_tokens) == (10, 9)
    assert b.message.usage.output_tokens == 64
    [row] = upstream.jobs()
    assert (row["billed"]["input_tokens"], row["billed"]["output_tokens"]) == (20, 73)


def test_message_batch_cancel_expire_fail_errored_lines(ant: anthropic.Anthropic, upstream: UpstreamHandle) -> None:
    created = ant.messages.batches.create(requests=[msg_request(f"r{i}") for i in range(3)])
    canceling = ant.messages.batches.cancel(created.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    upstream.job(created.id, "cancelled", done=1)
    ended = ant.messages.batches.retrieve(created.id)
    assert ended.processing_status == "ended"
    assert (ended.request_counts.succeeded, ended.request_counts.canceled) == (1, 2)
    assert [r.result.type for r in ant.messages.batches.results(created.id)] == [
        "succeeded",
        "canceled",
        "canceled",
    ]

    bad = {"custom_id": "bad", "params": {"model": "claude-test", "messages": []}}
    expiring = ant.messages.batches.create(requests=[bad, msg_request("ok"), msg_request("late")])  # type: ignore[list-item]
    upstream.job(expiring.id, "expired", done=2)
    kinds = {r.custom_id: r.result.type for r in ant.messages.batches.results(expiring.id)}
    assert kinds == {"bad": "errored", "ok": "succeeded", "late": "expired"}
    counts = ant.messages.batches.retrieve(expiring.id).request_counts
    assert (counts.errored, counts.succeeded, counts.expired) == (1, 1, 1)

    failing = ant.messages.batches.create(requests=[msg_request("x")])
    upstream.job(failing.id, "failed")
    assert [r.result.type for r in ant.messages.batches.results(failing.id)] == ["errored"]
    billed = {row["id"]: row["billed"]["lines"] for row in upstream.jobs()}
    assert billed == {created.id: 1, expiring.id: 1, failing.id: 0}


def test_message_batch_gone_auto_list_and_refusals(ant: anthropic.Anthropic, upstream: UpstreamHandle) -> None:
    created = ant.messages.batches.create(requests=[msg_request("x")])
    upstream.job(created.id, "gone")
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.batches.retrieve(created.id)
    upstream.control(job_auto_complete=True)
    auto = ant.messages.batches.create(requests=[msg_request("x")])
    assert auto.processing_status == "in_progress"
    assert ant.messages.batches.retrieve(auto.id).processing_status == "ended"
    assert [b.id for b in ant.messages.batches.list()] == [auto.id]
    with pytest.raises(anthropic.BadRequestError, match="custom_id"):
        ant.messages.batches.create(requests=[msg_request("same"), msg_request("same")])
    with pytest.raises(anthropic.BadRequestError, match="non-empty"):
        ant.messages.batches.create(requests=[])


# -- background responses -------------------------------------------------------------------


def test_background_response_queued_then_completed_with_the_usage_of_a_plain_request(
    oai: openai.OpenAI, upstream: UpstreamHandle
) -> None:
    upstream.control(prompt_tokens=21, completion_tokens=4)
    queued = oai.responses.create(model="gpt-4o-mini", input="hi", background=True)
    assert queued.status == "queued" and queued.background is True and queued.usage is None
    running = oai.responses.retrieve(queued.id)
    assert running.status == "in_progress" and running.usage is None and running.output == []
    upstream.job(queued.id, "completed")
    done = oai.responses.retrieve(queued.id)
    assert done.status == "completed" and done.output_text and done.usage is not None
    plain = oai.responses.create(model="gpt-4o-mini", input="hi")
    assert plain.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (plain.usage.input_tokens, 4) == (21, 4)
    [row] = upstream.jobs()
    assert row["kind"] == "response" and row["billed"]["input_tokens"] == 21


def test_background_response_cancel_expire_fail_gone(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    first = oai.responses.create(model="gpt-4o-mini", input="hi", background=True)
    cancelled = oai.responses.cancel(first.id)
    assert cancelled.status == "cancelled" and cancelled.usage is None
    assert oai.responses.retrieve(first.id).status == "cancelled"
    upstream.job(first.id, "cancelled", done=1)  # the provider billed what it had run
    billed = oai.responses.retrieve(first.id)
    assert billed.status == "cancelled" and billed.usage is not None and billed.usage.total_tokens == 15

    second = oai.responses.create(model="gpt-4o-mini", input="hi", background=True)
    upstream.job(second.id, "expired")
    expired = oai.responses.retrieve(second.id)
    assert expired.status == "failed" and expired.usage is None and expired.error is not None
    upstream.job(second.id, "failed")
    assert oai.responses.retrieve(second.id).status == "failed"
    upstream.job(second.id, "gone")
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.cancel(second.id)
    billed_lines = {row["id"]: row["billed"]["lines"] for row in upstream.jobs()}
    assert billed_lines == {first.id: 1, second.id: 0}


def test_background_response_auto_complete_and_delete(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    upstream.control(job_auto_complete=True)
    queued = oai.responses.create(model="gpt-4o-mini", input="hi", background=True)
    assert queued.status == "queued"
    assert oai.responses.retrieve(queued.id).status == "completed"
    oai.responses.delete(queued.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(queued.id)
    plain = oai.responses.create(model="gpt-4o-mini", input="hi")  # not a job: answered at once
    assert plain.status == "completed" and [row["id"] for row in upstream.jobs()] == [queued.id]


# -- videos ---------------------------------------------------------------------------------


def test_video_lifecycle_bills_seconds_when_completed(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    queued = oai.videos.create(model="sora-2", prompt="a fox", seconds="8", size="1280x720")
    assert queued.status == "queued" and queued.progress == 0 and queued.seconds == "8"
    running = oai.videos.retrieve(queued.id)
    assert running.status == "in_progress" and 0 < running.progress < 100
    with pytest.raises(openai.BadRequestError, match="not ready"):
        oai.videos.download_content(queued.id)
    upstream.job(queued.id, "completed")
    done = oai.videos.retrieve(queued.id)
    assert done.status == "completed" and done.progress == 100 and done.completed_at is not None
    content = oai.videos.download_content(queued.id)
    assert content.content.startswith(b"\x00\x00\x00\x18ftyp")
    assert oai.videos.download_content(queued.id, variant="thumbnail").content.startswith(b"RIFF")
    assert [v.id for v in oai.videos.list()] == [queued.id]
    assert oai.videos.delete(queued.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        oai.videos.retrieve(queued.id)
    [row] = upstream.jobs()
    assert row["billed"]["seconds"] == 8 and row["deleted"] is True


def test_video_failed_states_bill_nothing_and_bad_input_is_refused(
    oai: openai.OpenAI, upstream: UpstreamHandle
) -> None:
    ids = [oai.videos.create(prompt="p").id for _ in range(3)]
    for vid, state in zip(ids, ("cancelled", "expired", "failed"), strict=True):
        upstream.job(vid, state)
    codes = []
    for vid in ids:
        video = oai.videos.retrieve(vid)
        assert video.status == "failed" and video.error is not None
        codes.append(video.error.code)
    assert codes == ["cancelled", "expired", "generation_failed"]
    assert [row["billed"]["seconds"] for row in upstream.jobs()] == [0, 0, 0]
    upstream.job(ids[0], "gone")
    with pytest.raises(openai.NotFoundError):
        oai.videos.retrieve(ids[0])
    with pytest.raises(openai.BadRequestError, match="seconds"):
        oai.videos.create(prompt="p", seconds="5")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="size"):
        oai.videos.create(prompt="p", size="1x1")  # type: ignore[arg-type]
    as_json = httpx.post(f"{upstream.url}/v1/videos", json={"prompt": "p", "seconds": "12"})
    assert as_json.status_code == 200 and as_json.json()["seconds"] == "12"


def test_video_auto_complete(oai: openai.OpenAI, upstream: UpstreamHandle) -> None:
    upstream.control(job_auto_complete=True)
    video = oai.videos.create(prompt="p", seconds="4")
    assert video.status == "queued"
    assert oai.videos.retrieve(video.id).status == "completed"
    assert upstream.jobs()[0]["billed"]["seconds"] == 4
