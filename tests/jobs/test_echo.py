"""The demo path: provider jobs on the built-in echo connection (route `echo-1`), through capgate
and the official SDKs, with no provider account. echo finishes a job when it is created, so the
first poll settles it from echo's priced usage."""

from __future__ import annotations

import json
from datetime import timedelta

from django.utils import timezone

from alerts.audit import audit_counters
from jobs.models import Job
from jobs.poll import poll_jobs
from ledger.models import UsageRecord
from tests.conftest import usd
from tests.gateway.conftest import wait_settled
from tests.jobs.conftest import an, oa, upload


def _settle() -> Job:
    Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
    poll_jobs()
    job = Job.objects.get()
    assert job.state == Job.State.SETTLED, job.state
    wait_settled()
    report = audit_counters()
    assert not report.drifts and not report.request_drifts, report
    return job


def test_echo_batch_settles_from_its_output_file(gateway, jobs_org):
    jobs_org.budget(amount="5")
    client = oa(gateway)
    f = upload(client, 3, model="echo-1", max_tokens=100)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating"
    job = _settle()
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.usage is not None and done.output_file_id
    lines = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert len(lines) == 3 and all(x["response"]["status_code"] == 200 for x in lines)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.status == "served" and rec.cost_nano > 0
    assert (rec.input_tokens, rec.output_tokens) == (done.usage.input_tokens, done.usage.output_tokens)
    assert rec.output_tokens == 3 * 16  # echo's default completion, under each line's ceiling


def test_echo_message_batch_background_response_and_video(gateway, jobs_org):
    jobs_org.budget(amount="5")
    params = {"model": "echo-1", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    mb = an(gateway).messages.batches.create(requests=[{"custom_id": "a", "params": params}])
    assert mb.processing_status == "in_progress"
    job = _settle()
    [result] = list(an(gateway).messages.batches.results(mb.id))
    assert result.result.type == "succeeded"
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.status == "served" and rec.output_tokens == result.result.message.usage.output_tokens == 16
    Job.objects.all().delete()

    queued = oa(gateway).responses.create(model="echo-1", input="hi", background=True, max_output_tokens=40)
    assert queued.status == "queued"
    job = _settle()
    done = oa(gateway).responses.retrieve(queued.id)
    assert done.status == "completed" and done.usage is not None
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert (rec.input_tokens, rec.output_tokens) == (done.usage.input_tokens, done.usage.output_tokens)
    Job.objects.all().delete()

    video = oa(gateway).videos.create(model="echo-1", prompt="a fox", seconds="8")
    assert video.status == "queued"
    job = _settle()
    assert oa(gateway).videos.retrieve(video.id).status == "completed"
    assert oa(gateway).videos.download_content(video.id).content.startswith(b"\x00\x00\x00\x18ftyp")
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.status == "served" and rec.cost_nano == usd("0.80")  # 8 s at $0.10 per second
