"""OpenAI batches through the SDK: admission at submission, the hold moved to the job and kept
counted past the request's lease, settlement from per-line usage, cancel, expiry and gone."""

from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import timedelta

import openai
import pytest
from django.utils import timezone

from alerts.audit import audit_counters
from catalog.models import Connection
from jobs import service, settle
from jobs.models import Job, JobFile
from jobs.poll import poll_jobs
from ledger.models import Reservation, UsageRecord, Window
from ledger.recording import expire
from tests.conftest import usd
from tests.gateway.conftest import wait_settled
from tests.jobs.conftest import oa, upload


def _clean() -> None:
    report = audit_counters()
    assert not report.drifts and not report.request_drifts, report


def _budget(org, amount: str):
    return org.budget(amount=amount)


def _line_bound() -> int:
    row = JobFile.objects.order_by("-id").first()
    assert row is not None
    return row.line_bounds[0]


def _poll_until(state: str, *, now=None, tries: int = 5) -> Job:
    for _ in range(tries):
        Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
        poll_jobs(now=now)
        job = Job.objects.get()
        if job.state == state:
            return job
    raise AssertionError(f"job is {Job.objects.get().state}, not {state}")


def test_upload_bounds_each_line_at_the_batch_price(gateway, jobs_org):
    client = oa(gateway)
    f = upload(client, 3)
    row = JobFile.objects.get(file_id=f.id)
    assert row.line_count == 3 and row.kind == "chat" and row.route == "gpt-test"
    assert len(row.line_bounds) == 3 and all(b > 0 for b in row.line_bounds)
    # 1000 output tokens at $75/M at half price alone is $0.0375 per line.
    assert all(b >= usd("0.0375") for b in row.line_bounds)


def test_batch_over_the_remaining_budget_is_refused_at_submission(gateway, jobs_org, upstream):
    client = oa(gateway)
    f = upload(client, 3)
    budget = _budget(jobs_org, "0.10")  # three lines need > $0.1125
    with pytest.raises(openai.APIStatusError) as err:
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert err.value.status_code == 402
    assert err.value.body["code"] == "organization_budget"
    assert not Reservation.objects.exists() and not Job.objects.exists()
    assert upstream.jobs() == []  # nothing reached the provider
    assert Window.objects.get(budget=budget).reserved_nano == 0
    # the refusal is in the request log under the id the answer names
    from requestlog.models import RequestLogEntry

    request_id = err.value.response.headers["x-capgate-request-id"]
    for _ in range(100):
        entry = RequestLogEntry.objects.filter(request_id=request_id).first()
        if entry is not None:
            break
        time.sleep(0.1)
    assert entry is not None and entry.status == "refused" and entry.code == "organization_budget"


def test_submission_admission_removal_lets_it_through(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(service.GUARDS, "admit_at_submission", False)
    client = oa(gateway)
    f = upload(client, 3)
    _budget(jobs_org, "0.10")
    client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert len(upstream.jobs()) == 1  # without the guard the over-budget batch runs


def _submit(client, lines: int):
    f = upload(client, lines)
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def _long_batch(gateway, jobs_org, upstream) -> None:
    """A batch that completes long after the submitting request's lease would have lapsed:
    at every step, the job is counted (held, or settled) and the audit is clean."""
    client = oa(gateway)
    _budget(jobs_org, "5")
    batch = _submit(client, 4)
    res = Reservation.objects.get()
    assert res.job_id == batch.id and res.owner_id is None and res.amount_nano == 4 * _line_bound()
    _clean()
    t0 = timezone.now()
    for minutes in (5, 14, 28, 55):  # the request's lease is 2 min, the job's 15 min
        now = t0 + timedelta(minutes=minutes)
        Job.objects.update(next_poll_at=now - timedelta(seconds=1))
        poll_jobs(now=now)
        expire(now=now + timedelta(minutes=1))
        assert Reservation.objects.filter(request_id=res.request_id).exists(), f"hold gone at {minutes} min"
        assert not UsageRecord.objects.exists()
        _clean()
    upstream.job(batch.id, "completed")
    job = _poll_until(Job.State.SETTLED, now=t0 + timedelta(minutes=56))
    rec = UsageRecord.objects.get()
    assert rec.status == "served" and rec.request_id == job.request_id
    billed = upstream.jobs()[0]["billed"]
    assert billed["lines"] == 4
    assert (rec.input_tokens, rec.output_tokens) == (billed["input_tokens"], billed["output_tokens"])
    wait_settled()
    _clean()


def test_batch_is_counted_past_the_request_lease(gateway, jobs_org, upstream):
    _long_batch(gateway, jobs_org, upstream)


def test_lease_renewal_removal_lets_the_hold_lapse(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(settle.GUARDS, "renew_leases", False)
    with pytest.raises(AssertionError, match="hold gone"):
        _long_batch(gateway, jobs_org, upstream)


def test_hand_to_job_removal_leaves_the_hold_with_the_request(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(service.GUARDS, "hand_to_job", False)
    with pytest.raises(AssertionError):
        _long_batch(gateway, jobs_org, upstream)


def _cancelled_after_billing(gateway, jobs_org, upstream) -> None:
    client = oa(gateway)
    _budget(jobs_org, "5")
    batch = _submit(client, 4)
    client.batches.cancel(batch.id)
    assert Reservation.objects.filter(job_id=batch.id).exists(), "hold released on the cancel request"
    upstream.job(batch.id, "cancelled", done=2)
    job = _poll_until(Job.State.SETTLED)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    billed = upstream.jobs()[0]["billed"]
    assert billed["lines"] == 2
    assert (rec.input_tokens, rec.output_tokens) == (billed["input_tokens"], billed["output_tokens"])
    assert rec.output_tokens > 0 and rec.cost_nano > 0
    wait_settled()
    _clean()


def test_cancelled_after_billing_is_charged_what_was_billed(gateway, jobs_org, upstream):
    _cancelled_after_billing(gateway, jobs_org, upstream)


def test_no_release_on_cancel_removal_undercharges(gateway, jobs_org, upstream, monkeypatch):
    monkeypatch.setattr(service.GUARDS, "keep_hold_on_cancel", False)
    with pytest.raises(AssertionError):
        _cancelled_after_billing(gateway, jobs_org, upstream)


def test_gone_job_is_charged_worst_case(gateway, jobs_org, upstream):
    client = oa(gateway)
    _budget(jobs_org, "5")
    batch = _submit(client, 2)
    upstream.job(batch.id, "gone")
    job = _poll_until(Job.State.ESTIMATED)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.status == "estimated" and rec.cost_nano == job.worst_nano
    wait_settled()
    _clean()


def test_lapsed_job_is_charged_worst_case_then_corrected_once(gateway, jobs_org, upstream):
    client = oa(gateway)
    _budget(jobs_org, "5")
    batch = _submit(client, 2)
    job = Job.objects.get()
    expire(now=job.deadline_at + timedelta(seconds=1))  # past its hard deadline, no final report
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.status == "estimated" and rec.cost_nano == job.worst_nano
    _clean()
    upstream.job(batch.id, "completed")
    job = _poll_until(Job.State.SETTLED)
    rec.refresh_from_db()
    assert rec.status == "served" and rec.cost_nano < job.worst_nano and rec.cost_nano == job.cost_nano
    Job.objects.update(state=Job.State.ESTIMATED)  # a second report changes nothing
    _poll_until(Job.State.SETTLED)
    assert UsageRecord.objects.get(pk=rec.pk).cost_nano == rec.cost_nano
    _clean()


def test_ids_of_another_organization_are_404(gateway, jobs_org, outsider):
    from tenants.models import ApiKey

    client = oa(gateway)
    f = upload(client, 1)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    raw, prefix, digest = ApiKey.generate()
    ApiKey.objects.create(organization=outsider.org, project=outsider.project, name="x", prefix=prefix, key_hash=digest)
    other = openai.OpenAI(api_key=raw, base_url=gateway.url + "/v1", max_retries=0)
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.files.retrieve(f.id),
        lambda: other.files.content(f.id),
        lambda: other.files.delete(f.id),
        lambda: other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.batches.retrieve(batch.id).id == batch.id
    assert [b.id for b in client.batches.list()] == [batch.id]
    assert list(other.batches.list()) == []


def test_concurrent_submissions_admit_at_most_the_cap(gateway, jobs_org, upstream):
    client = oa(gateway)
    files = [upload(client, 2) for _ in range(6)]
    worst = 2 * _line_bound()
    budget = jobs_org.budget(amount=str((2 * worst + worst // 2) / 1e9))  # room for k=2 batches
    barrier = threading.Barrier(len(files))
    results: list[str] = []

    def go(file_id: str) -> None:
        c = oa(gateway)
        barrier.wait()
        try:
            c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
            results.append("ok")
        except openai.APIStatusError as exc:
            results.append(str(exc.status_code))

    threads = [threading.Thread(target=go, args=(f.id,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results.count("ok") == 2 and results.count("402") == 4
    assert len(upstream.jobs()) == 2
    assert Window.objects.get(budget=budget).reserved_nano == 2 * worst
    _clean()


def test_output_file_of_a_finished_batch_is_the_owners_only(gateway, jobs_org, upstream, outsider):
    from tenants.models import ApiKey

    client = oa(gateway)
    batch = _submit(client, 2)
    upstream.job(batch.id, "completed")
    _poll_until(Job.State.SETTLED)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id
    lines = client.files.content(done.output_file_id).text.strip().splitlines()
    assert len(lines) == 2 and all('"custom_id"' in line for line in lines)
    raw, prefix, digest = ApiKey.generate()
    ApiKey.objects.create(organization=outsider.org, project=outsider.project, name="x", prefix=prefix, key_hash=digest)
    other = openai.OpenAI(api_key=raw, base_url=gateway.url + "/v1", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id)


def test_list_shows_a_batch_its_provider_cannot_answer_for_as_last_known_and_logs_it(
    gateway, jobs_org, upstream, caplog
):
    client = oa(gateway)
    batch = _submit(client, 1)
    job = Job.objects.get()
    with socket.socket() as s:  # a port nothing listens on: the provider's read fails to connect
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    Connection.objects.filter(pk=jobs_org.openai.pk).update(base_url=f"http://127.0.0.1:{closed}/v1")
    with caplog.at_level(logging.WARNING, logger="capgate.jobs"):
        [listed] = client.batches.list().data
    assert listed.id == batch.id and listed.status == (job.provider_status or "unknown")
    assert listed.input_file_id == job.input_file_id
    assert f"listing job {job.id} ({batch.id}): its provider could not be read (ConnectError)" in caplog.text
