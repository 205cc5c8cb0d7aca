"""The job endpoints accept exactly their fields in the billing inventory (gateway/billing/jobs.py),
and a field the inventory refuses under a blocking cap is refused in the endpoint's own shape
before anything is reserved or sent. Through the official SDKs, against the fake upstream."""

from __future__ import annotations

import io
import json

import anthropic
import httpx
import openai
import pytest

from catalog.pricing import video_nano
from gateway import billing
from jobs.models import Job, JobFile
from ledger.models import Budget, Reservation, UsageRecord, Window
from tests.gateway.conftest import KEY
from tests.jobs.conftest import an, oa, upload

_FRAME = ("frame.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "image/png")
_EXPIRY = {"anchor": "created_at", "seconds": 3600}


def _requests(n: int = 1, **params) -> list[dict]:
    return [
        {
            "custom_id": f"m{i}",
            "params": {
                "model": "claude-test",
                "max_tokens": 200,
                "messages": [{"role": "user", "content": f"hi {i}"}],
                **params,
            },
        }
        for i in range(n)
    ]


def _nothing_changed(upstream, *, path: str) -> None:
    assert upstream.stats()["by_path"].get(path, 0) == 0, f"{path} reached the provider"
    assert upstream.jobs() == []
    assert not Reservation.objects.exists() and not Job.objects.exists() and not UsageRecord.objects.exists()
    assert all(w.reserved_nano == 0 and w.spent_nano == 0 for w in Window.objects.all())


# -- every field the inventory lists is accepted ----------------------------------------------


def _files_all(gw, upstream):
    f = oa(gw).files.create(file=("batch.jsonl", io.BytesIO(_line())), purpose="batch", expires_after=_EXPIRY)
    assert f.expires_at == f.created_at + 3600  # expires_after reached the provider
    return {"file", "purpose", "expires_after"}


def _batches_all(gw, upstream):
    client = oa(gw)
    f = upload(client, 1)
    batch = client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "search"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert batch.metadata == {"team": "search"}
    assert upstream.last("/v1/batches")["body"]["output_expires_after"]["seconds"] == 7200
    return {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}


def _message_batches_all(gw, upstream):
    an(gw).messages.batches.create(requests=_requests())
    return {"requests"}


def _videos_all(gw, upstream):
    oa(gw).videos.create(model="sora-test", prompt="a cat", seconds="8", size="1280x720", input_reference=_FRAME)
    sent = upstream.last("/v1/videos")["body"]
    assert (sent["size"], sent["seconds"]) == ("1280x720", "8")
    return {"model", "prompt", "seconds", "size", "input_reference"}


_ALL = {"files": _files_all, "batches": _batches_all, "message_batches": _message_batches_all, "videos": _videos_all}


def _line(**body) -> bytes:
    req = {"model": "gpt-test", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **body}
    return json.dumps({"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": req}).encode()


@pytest.mark.parametrize("kind", sorted(billing.JOB_FIELDS))
def test_each_job_endpoint_accepts_every_field_its_inventory_lists(gateway, jobs_org, upstream, kind):
    # when: one call that sends every field the inventory lists for the endpoint
    sent = _ALL[kind](gateway, upstream)
    # then: it was accepted (no 400 above), and the call above sends exactly the inventory's fields
    assert sent == set(billing.JOB_FIELDS[kind]), "exercise each listed field here"


# -- a field the inventory does not list is refused ------------------------------------------


def _refuse_unlisted(gw, kind: str, name: str, value):
    extra = {name: value}
    if kind == "files":
        return oa(gw).files.create(file=("batch.jsonl", io.BytesIO(_line())), purpose="batch", extra_body=extra)
    if kind == "batches":
        return oa(gw).batches.create(
            input_file_id="file-x", endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
        )
    if kind == "message_batches":
        return an(gw).messages.batches.create(requests=_requests(), extra_body=extra)
    return oa(gw).videos.create(model="sora-test", prompt="a cat", extra_body=extra)


@pytest.mark.parametrize("kind", sorted(billing.JOB_FIELDS))
def test_a_field_the_inventory_does_not_list_is_refused_in_the_endpoints_shape(gateway, jobs_org, upstream, kind):
    jobs_org.budget(amount="5")
    sdk = anthropic if kind == "message_batches" else openai
    with pytest.raises(sdk.BadRequestError) as err:
        _refuse_unlisted(gateway, kind, "not_in_the_inventory", "1")
    body = err.value.body
    if kind == "message_batches":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "unsupported_parameter" and "not_in_the_inventory" in body["error"]["message"]
    else:
        assert (body["code"], body["param"], body["type"]) == (
            "unsupported_parameter",
            "not_in_the_inventory",
            "invalid_request_error",
        )
    _nothing_changed(upstream, path=billing.JOB_ENDPOINTS[kind])
    assert not JobFile.objects.exists()


_DROPPED = {"files": "expires_after", "batches": "metadata", "message_batches": "requests", "videos": "size"}


@pytest.mark.parametrize("kind", sorted(billing.JOB_FIELDS))
def test_each_endpoints_allowlist_is_its_inventory(gateway, jobs_org, upstream, kind, monkeypatch):
    # given: a field the endpoint accepts (above) taken out of the inventory
    name = _DROPPED[kind]
    monkeypatch.setitem(billing.JOB_FIELDS, kind, {k: v for k, v in billing.JOB_FIELDS[kind].items() if k != name})
    value = _EXPIRY if kind == "files" else _requests() if kind == "message_batches" else "1280x720"
    sdk = anthropic if kind == "message_batches" else openai
    # when / then: the endpoint refuses it, with nothing else changed
    with pytest.raises(sdk.BadRequestError) as err:
        _refuse_unlisted(gateway, kind, name, value)
    assert f"'{name}'" in str(err.value)
    _nothing_changed(upstream, path=billing.JOB_ENDPOINTS[kind])


# -- a field the inventory refuses under a blocking cap --------------------------------------


def test_batch_whose_file_has_a_refused_line_is_refused_under_a_blocking_cap(gateway, jobs_org, upstream):
    client = oa(gateway)
    budget = jobs_org.budget(amount="5")
    # the upload reserves nothing, so it is taken; the file remembers why a cap would refuse it
    f = client.files.create(file=("b.jsonl", io.BytesIO(_line(web_search_options={}))), purpose="batch")
    assert JobFile.objects.get(file_id=f.id).refused_code == "web_search_options_under_budget"
    with pytest.raises(openai.APIStatusError) as err:
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert err.value.status_code == 402
    body = err.value.body
    assert body["code"] == "web_search_options_under_budget" and body["message"] and "type" in body
    _nothing_changed(upstream, path="/v1/batches")
    # the same batch under an alert budget only: admitted (the refusal is the blocking cap's)
    Budget.objects.filter(pk=budget.pk).update(mode=Budget.Mode.ALERT)
    client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert len(upstream.jobs()) == 1


def test_message_batch_with_a_refused_request_is_refused_in_anthropic_shape(gateway, jobs_org, upstream):
    jobs_org.budget(amount="5")
    plain, with_container = _requests(2)
    with_container["params"]["container"] = "container_1"  # code execution, billed by the hour
    with pytest.raises(anthropic.APIStatusError) as err:
        an(gateway).messages.batches.create(requests=[plain, with_container])
    assert err.value.status_code == 402
    body = err.value.body
    assert body["type"] == "error" and body["error"]["code"] == "container_under_budget"
    assert body["error"]["type"] and body["error"]["message"]
    _nothing_changed(upstream, path="/v1/messages/batches")


def _larger_video(gateway, upstream) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        oa(gateway).videos.create(model="sora-test", prompt="a cat", seconds="4", size="1792x1024")
    assert err.value.status_code == 402
    body = err.value.body
    assert body["code"] == "size_under_budget" and body["type"] and body["message"]


def test_video_of_a_size_the_catalog_price_is_not_for_is_refused_under_a_blocking_cap(gateway, jobs_org, upstream):
    budget = jobs_org.budget(amount="5")
    _larger_video(gateway, upstream)
    _nothing_changed(upstream, path="/v1/videos")
    # a priced size, or no size (the provider's default), is admitted at the catalog price
    for size in ({"size": billing.VIDEO_PRICED_SIZES[1]}, {}):
        video = oa(gateway).videos.create(model="sora-test", prompt="a cat", seconds="4", **size)
        assert Reservation.objects.get(job_id=video.id).amount_nano == video_nano(
            model=jobs_org.model, seconds=4, worst=True
        )
    # under an alert budget only, the larger size is admitted too
    Budget.objects.filter(pk=budget.pk).update(mode=Budget.Mode.ALERT)
    oa(gateway).videos.create(model="sora-test", prompt="a cat", seconds="4", size="1792x1024")
    assert len(upstream.jobs()) == 3


def test_video_size_refusal_removal_admits_a_size_billed_above_its_bound(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(billing, "VIDEO_PRICED_SIZES", ("720x1280", "1280x720", "1024x1792", "1792x1024"))
    jobs_org.budget(amount="5")
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _larger_video(gateway, upstream)
    assert len(upstream.jobs()) == 1  # reserved at the 720p price, billed at the larger size's


def test_files_refuse_what_the_inventory_refuses_in_openai_shape_under_a_blocking_cap(gateway, jobs_org, upstream):
    # An upload reserves nothing, so no /v1/files field is refused only under a blocking cap: a
    # file whose lines a cap would refuse is refused at /v1/batches (above). What the inventory
    # refuses outright is refused here, in OpenAI's shape, with nothing stored or sent.
    jobs_org.budget(amount="5")
    client = oa(gateway)
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("notes.jsonl", io.BytesIO(_line())), purpose="assistants")
    assert (err.value.body["code"], err.value.body["param"]) == ("unsupported_purpose", "purpose")
    _nothing_changed(upstream, path="/v1/files")
    assert not JobFile.objects.exists()


def test_video_input_reference_is_an_upload_never_a_reference(gateway, jobs_org, upstream):
    jobs_org.budget(amount="5")
    # multipart: a reference object's form field, input_reference[image_url]
    with pytest.raises(openai.BadRequestError) as err:
        oa(gateway).videos.create(
            model="sora-test", prompt="a cat", extra_body={"input_reference": {"image_url": "https://x/y.png"}}
        )
    assert err.value.body["param"] == "input_reference"
    # JSON
    resp = httpx.post(
        gateway.url + "/v1/videos",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "sora-test", "prompt": "a cat", "input_reference": {"file_id": "file-abc"}},
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_reference"
    _nothing_changed(upstream, path="/v1/videos")
