"""Beat's poll: two runs at once poll a job once; bad batch input is refused with nothing kept;
a gone job charged at worst case is corrected once when the provider reports after all."""

from __future__ import annotations

import threading
from datetime import timedelta

import openai
import pytest
from django.db import connection
from django.utils import timezone

from alerts.audit import audit_counters
from gateway.admission.routing import Target
from gateway.http.errors import GatewayError
from jobs import poll, sizing
from jobs.models import Job, JobFile
from ledger.models import UsageRecord
from tests.gateway.conftest import wait_settled
from tests.jobs.conftest import oa, upload


def _two_polls_at_once() -> None:
    barrier = threading.Barrier(2)

    def run() -> None:
        try:
            barrier.wait()
            poll.poll_jobs()
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def _polled_once(gateway, jobs_org, upstream) -> None:
    client = oa(gateway)
    f = upload(client, 1)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
    before = upstream.app.by_path.get(f"/v1/batches/{batch.id}", 0)
    _two_polls_at_once()
    assert upstream.app.by_path.get(f"/v1/batches/{batch.id}", 0) - before == 1
    assert Job.objects.get().polls == 1


def test_two_polls_at_once_ask_about_a_job_once(gateway, jobs_org, upstream):
    _polled_once(gateway, jobs_org, upstream)


def test_claim_guard_removal_polls_twice(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(poll.GUARDS, "claim_exclusive", False)
    with pytest.raises(AssertionError):
        _polled_once(gateway, jobs_org, upstream)


def test_bad_batch_input_is_refused_and_nothing_is_kept(gateway, jobs_org, upstream):
    client = oa(gateway)
    bad = (
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
        b'"body": {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}}\n{"custom_id": "a"}\n'
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("b.jsonl", bad), purpose="batch")
    assert "line 2" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("b.jsonl", b"{}"), purpose="assistants")
    assert err.value.body["code"] == "unsupported_purpose"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    assert not JobFile.objects.exists() and not Job.objects.exists()
    assert not [j for j in upstream.jobs()]


def test_a_batch_runs_only_on_a_connection_of_its_batch_apis_provider(jobs_org):
    # Called directly: routing (gateway/admission/routing.py, the adapters' `serves`) already routes a batch's lines to
    # connections of a compatible kind, so no upload through the endpoints reaches the refusal.
    def lines(conn) -> sizing.SizedLines:
        return sizing.SizedLines(kind="chat", route="m", target=Target(connection=conn, model=jobs_org.model))

    assert sizing.batch_connection(lines(jobs_org.openai), "openai") == jobs_org.openai
    assert sizing.batch_connection(lines(jobs_org.anthropic), "anthropic") == jobs_org.anthropic
    assert sizing.batch_connection(lines(jobs_org.echo), "openai") == jobs_org.echo
    for conn, kind, says in (
        (jobs_org.anthropic, "openai", "'m' is not served by an OpenAI connection; batches run on"),
        (jobs_org.openai, "anthropic", "'m' is not served by an Anthropic connection; message batches run on"),
    ):
        with pytest.raises(GatewayError) as err:
            sizing.batch_connection(lines(conn), kind)
        assert err.value.code == "batch_unsupported_connection" and says in err.value.message


def test_gone_job_is_corrected_once_when_a_report_arrives(gateway, jobs_org, upstream):
    client = oa(gateway)
    jobs_org.budget(amount="5")
    f = upload(client, 2)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    upstream.job(batch.id, "gone")
    Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
    poll.poll_jobs()
    job = Job.objects.get()
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert job.state == Job.State.ESTIMATED and rec.status == "estimated" and rec.cost_nano == job.worst_nano
    upstream.job(batch.id, "completed")  # the provider finds it after all
    for _ in range(2):
        Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
        poll.poll_jobs()
    rec.refresh_from_db()
    assert Job.objects.get().state == Job.State.SETTLED
    assert rec.status == "served" and 0 < rec.cost_nano < job.worst_nano
    assert UsageRecord.objects.count() == 1
    wait_settled()
    report = audit_counters()
    assert not report.drifts and not report.request_drifts
