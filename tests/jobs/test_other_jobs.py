"""Anthropic message batches, background responses and videos through the official SDKs: each
admitted at submission, held by its job, settled from what the provider reports."""

from __future__ import annotations

from datetime import timedelta

import anthropic
import openai
import pytest
from django.utils import timezone

from alerts.audit import audit_counters
from catalog.pricing import video_nano
from gateway.admission import subjects
from jobs.models import Job
from jobs.poll import poll_jobs
from ledger.models import Budget, Reservation, UsageRecord
from tests.conftest import usd
from tests.gateway.conftest import wait_settled
from tests.jobs.conftest import an, oa


def _clean() -> None:
    report = audit_counters()
    assert not report.drifts and not report.request_drifts, report


def _poll_until(state: str, tries: int = 5) -> Job:
    for _ in range(tries):
        Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
        poll_jobs()
        job = Job.objects.get()
        if job.state == state:
            return job
    raise AssertionError(f"job is {Job.objects.get().state}, not {state}")


def _requests(n: int, model: str = "claude-test") -> list[dict]:
    return [
        {
            "custom_id": f"m{i}",
            "params": {"model": model, "max_tokens": 500, "messages": [{"role": "user", "content": f"hello {i}"}]},
        }
        for i in range(n)
    ]


def test_message_batch_is_admitted_held_and_settled_per_line(gateway, jobs_org, upstream):
    client = an(gateway)
    jobs_org.budget(amount="5")
    batch = client.messages.batches.create(requests=_requests(3))
    res = Reservation.objects.get(job_id=batch.id)
    assert res.owner_id is None and res.amount_nano > 0
    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    upstream.job(batch.id, "completed")
    job = _poll_until(Job.State.SETTLED)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    billed = upstream.jobs()[0]["billed"]
    assert billed["lines"] == 3 and (rec.input_tokens, rec.output_tokens) == (
        billed["input_tokens"],
        billed["output_tokens"],
    )
    assert 0 < rec.cost_nano <= res.amount_nano
    results = list(client.messages.batches.results(batch.id))
    assert len(results) == 3
    wait_settled()
    _clean()


def test_message_batch_over_budget_is_refused_in_anthropic_shape(gateway, jobs_org, upstream):
    client = an(gateway)
    jobs_org.budget(amount="0.01")
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.batches.create(requests=_requests(3))
    assert err.value.status_code == 402
    assert err.value.body["error"]["code"] == "organization_budget"
    assert upstream.jobs() == [] and not Reservation.objects.exists()


_RUN = {"X-Capgate-Run": "run-1", "X-Capgate-Run-Budget-Usd": "1"}


def _refused_first_job_of_a_run(gateway, jobs_org) -> Budget:
    cap = jobs_org.budget(amount="0.01")
    with pytest.raises(anthropic.APIStatusError) as err:
        an(gateway).messages.batches.create(requests=_requests(3), extra_headers=_RUN)
    assert err.value.status_code == 402
    assert not Budget.objects.filter(scope=Budget.Scope.RUN).exists()
    return cap


def test_a_refused_first_job_of_a_run_leaves_no_run_budget(gateway, jobs_org, upstream):
    cap = _refused_first_job_of_a_run(gateway, jobs_org)
    Budget.objects.filter(pk=cap.pk).update(amount_nano=usd("5"))
    an(gateway).messages.batches.create(requests=_requests(1), extra_headers=_RUN)
    assert Budget.objects.get(scope=Budget.Scope.RUN).amount_nano == usd("1")


def test_run_budget_transaction_removal_leaves_a_refused_runs_budget_behind(gateway, jobs_org, upstream, monkeypatch):
    # what the guard prevents: the budget committed on its own, before the admission refuses
    monkeypatch.setattr(subjects.GUARDS, "found_in_admission", False)
    with pytest.raises(AssertionError):
        _refused_first_job_of_a_run(gateway, jobs_org)


def test_message_batch_of_another_organization_is_404(gateway, jobs_org, outsider):
    from tenants.models import ApiKey

    batch = an(gateway).messages.batches.create(requests=_requests(1))
    raw, prefix, digest = ApiKey.generate()
    ApiKey.objects.create(organization=outsider.org, project=outsider.project, name="x", prefix=prefix, key_hash=digest)
    other = anthropic.Anthropic(api_key=raw, base_url=gateway.url, max_retries=0)
    for call in (
        lambda: other.messages.batches.retrieve(batch.id),
        lambda: other.messages.batches.cancel(batch.id),
        lambda: list(other.messages.batches.results(batch.id)),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()


def test_background_response_is_held_by_its_job_and_settled_from_its_usage(gateway, jobs_org, upstream):
    client = oa(gateway)
    jobs_org.budget(amount="5")
    resp = client.responses.create(model="gpt-test", input="write a poem", background=True, max_output_tokens=200)
    assert resp.status in ("queued", "in_progress")
    res = Reservation.objects.get(job_id=resp.id)
    assert res.owner_id is None
    assert client.responses.retrieve(resp.id).id == resp.id  # the owner can read it
    upstream.job(resp.id, "completed")
    job = _poll_until(Job.State.SETTLED)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    billed = upstream.jobs()[0]["billed"]
    assert rec.status == "served" and (rec.input_tokens, rec.output_tokens) == (
        billed["input_tokens"],
        billed["output_tokens"],
    )
    assert 0 < rec.cost_nano <= res.amount_nano
    wait_settled()
    _clean()


def test_background_response_over_budget_is_refused(gateway, jobs_org, upstream):
    jobs_org.budget(amount="0.001")
    with pytest.raises(openai.APIStatusError) as err:
        oa(gateway).responses.create(model="gpt-test", input="hi", background=True, max_output_tokens=2000)
    assert err.value.status_code == 402 and upstream.jobs() == []


def test_video_is_priced_per_second_and_settled_from_billed_seconds(gateway, jobs_org, upstream):
    client = oa(gateway)
    jobs_org.budget(amount="5")
    video = client.videos.create(model="sora-test", prompt="a cat", seconds="8")
    res = Reservation.objects.get(job_id=video.id)
    assert res.amount_nano == video_nano(model=jobs_org.model, seconds=8, worst=True)  # $0.80
    upstream.job(video.id, "completed")
    job = _poll_until(Job.State.SETTLED)
    rec = UsageRecord.objects.get(request_id=job.request_id)
    assert rec.cost_nano == video_nano(
        model=jobs_org.model, seconds=upstream.jobs()[0]["billed"]["seconds"], worst=False
    )
    assert client.videos.retrieve(video.id).status == "completed"
    wait_settled()
    _clean()


def test_video_over_budget_is_refused(gateway, jobs_org, upstream):
    jobs_org.budget(amount="0.50")
    with pytest.raises(openai.APIStatusError) as err:
        oa(gateway).videos.create(model="sora-test", prompt="a cat", seconds="8")  # $0.80
    assert err.value.status_code == 402 and upstream.jobs() == []


def test_failed_video_is_charged_nothing(gateway, jobs_org, upstream):
    jobs_org.budget(amount="5")
    video = oa(gateway).videos.create(model="sora-test", prompt="a cat", seconds="4")
    upstream.job(video.id, "failed")
    job = _poll_until(Job.State.SETTLED)
    assert UsageRecord.objects.get(request_id=job.request_id).cost_nano == 0
    wait_settled()
    _clean()
