"""Per-organization bounds on provider jobs: jobs live at once (jobs/quotas.py, 429 before
admission, in the endpoint's shape, nothing reserved or sent; held under concurrency), and the bytes one echo batch may
write to Redis as its output (echo/batches.py: an OpenAI batch ends failed with an error the
client reads, a message batch is refused with 413; never a 5xx, never a truncated output)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import anthropic
import openai
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from alerts.audit import audit_counters
from gateway.http.errors import GatewayError
from jobs import quotas
from jobs.models import Job, JobSubmission
from jobs.poll import poll_jobs
from ledger.models import Reservation, UsageRecord, Window
from tests.gateway.conftest import wait_settled
from tests.jobs.conftest import an, oa, upload

MESSAGE_PARAMS = {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def _clean() -> None:
    report = audit_counters()
    assert not report.drifts and not report.request_drifts, report


def _batch(client: openai.OpenAI, lines: int, **kw):
    f = upload(client, lines, **kw)
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def _settle_all() -> None:
    for _ in range(5):
        Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
        poll_jobs()
        if not Job.objects.exclude(state=Job.State.SETTLED).exists():
            return
    raise AssertionError(f"jobs not settled: {list(Job.objects.values_list('state', flat=True))}")


def _drained(timeout: float = 10.0) -> None:
    """Every usage record applied (live jobs keep their holds, so wait_settled would wait for them)."""
    deadline = time.monotonic() + timeout
    while UsageRecord.objects.filter(applied=False).exists():
        assert time.monotonic() < deadline, "records were not applied in time"
        time.sleep(0.05)


def _echo_keys(pattern: str) -> set[bytes]:
    r = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        return set(r.scan_iter(f"capgate-echo:{pattern}"))
    finally:
        r.close()


# --- jobs live at once --------------------------------------------------------------------------


def test_jobs_past_the_orgs_live_jobs_are_refused_with_429_and_nothing_reserved(
    gateway, jobs_org, upstream, settings, slices_mode
):
    # given: an organization allowed one live job, which runs at the provider
    settings.CAPGATE = {**settings.CAPGATE, "ORG_LIVE_JOBS": 1}
    budget = jobs_org.budget(amount="5")
    client = oa(gateway)
    first = _batch(client, 2)
    file_id = upload(client, 2).id
    held = set(Reservation.objects.values_list("request_id", "amount_nano"))
    window = Window.objects.get(budget=budget)
    # when: a second batch, a message batch and a video
    with pytest.raises(openai.RateLimitError) as batch_err:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(anthropic.RateLimitError) as message_err:
        an(gateway).messages.batches.create(requests=[{"custom_id": "a", "params": MESSAGE_PARAMS}])
    with pytest.raises(openai.RateLimitError) as video_err:
        client.videos.create(model="sora-test", prompt="a cat", seconds="4")
    # then: 429 in each endpoint's shape, and nothing reserved, recorded or sent
    for err in (batch_err, video_err):
        body = err.value.body
        assert body["code"] == "too_many_live_jobs" and body["type"] and "1 provider jobs" in body["message"]
    assert message_err.value.status_code == 429
    assert message_err.value.body["type"] == "error"
    assert message_err.value.body["error"]["type"] == "rate_limit_error"
    assert message_err.value.body["error"]["code"] == "too_many_live_jobs"
    assert set(Reservation.objects.values_list("request_id", "amount_nano")) == held
    assert list(Job.objects.values_list("provider_job_id", flat=True)) == [first.id]
    assert not UsageRecord.objects.exists() and not JobSubmission.objects.exists()
    assert [j["id"] for j in upstream.jobs()] == [first.id]
    window.refresh_from_db()
    assert window.reserved_nano == sum(amount for _, amount in held) and window.spent_nano == 0
    # and once the live job has finished, the next one is taken
    upstream.job(first.id, "completed")
    _settle_all()
    assert client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h").id
    _drained()
    _clean()


def test_a_background_response_past_the_orgs_live_jobs_is_refused_and_its_hold_released(
    gateway, jobs_org, upstream, settings, slices_mode
):
    # given: an organization allowed one live job, which runs at the provider
    settings.CAPGATE = {**settings.CAPGATE, "ORG_LIVE_JOBS": 1}
    budget = jobs_org.budget(amount="5")
    client = oa(gateway)
    first = _batch(client, 2)
    held = Reservation.objects.get().amount_nano
    # when: a background response (admitted by the proxy before the jobs app sees it)
    with pytest.raises(openai.RateLimitError) as err:
        client.responses.create(model="gpt-test", input="hi", background=True, max_output_tokens=200)
    # then: 429 in OpenAI's shape, not sent, its hold released at zero
    assert err.value.body["code"] == "too_many_live_jobs"
    assert [j["id"] for j in upstream.jobs()] == [first.id]
    assert upstream.stats()["by_path"].get("/v1/responses", 0) == 0
    _drained()
    assert list(Job.objects.values_list("provider_job_id", flat=True)) == [first.id]
    rec = UsageRecord.objects.get()
    assert rec.status == "failed_upstream" and rec.cost_nano == 0 and not JobSubmission.objects.exists()
    window = Window.objects.get(budget=budget)
    assert window.reserved_nano == held and window.spent_nano == 0
    _clean()


def _race(organization_id: int, n: int) -> int:
    """n submissions of one organization take a slot at once; how many got one."""
    barrier = threading.Barrier(n)

    def attempt(i: int) -> bool:
        try:
            connection.ensure_connection()
            barrier.wait()
            quotas.take_slot(organization_id=organization_id, request_id=f"race-{i}")
            return True
        except GatewayError:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return sum(pool.map(attempt, range(n)))


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_pass_the_orgs_live_jobs(jobs_org, settings):
    # given: room for 5 jobs
    settings.CAPGATE = {**settings.CAPGATE, "ORG_LIVE_JOBS": 5}
    # when: 20 submissions take a slot at once
    taken = _race(jobs_org.org.id, 20)
    # then: exactly 5
    assert taken == 5 and JobSubmission.objects.count() == 5


@pytest.mark.django_db(transaction=True)
def test_slot_lock_removal_lets_concurrent_submissions_pass_the_bound(jobs_org, settings, monkeypatch):
    monkeypatch.setattr(quotas.GUARDS, "serialize_slots", False)
    settings.CAPGATE = {**settings.CAPGATE, "ORG_LIVE_JOBS": 5}
    overshoot = 0
    for _ in range(3):  # counted apart from inserting, concurrent submissions see the same room
        JobSubmission.objects.all().delete()
        overshoot = max(overshoot, _race(jobs_org.org.id, 20) - 5)
        if overshoot:
            break
    assert overshoot > 0


def test_a_slot_a_dead_process_left_stops_counting_once_its_reservation_is_gone(jobs_org, settings):
    # given: room for one job, and the slot of a submission whose process died, a lease ago
    settings.CAPGATE = {**settings.CAPGATE, "ORG_LIVE_JOBS": 1}
    old = timezone.now() - settings.CAPGATE["LEASE"] - timedelta(seconds=1)
    JobSubmission.objects.create(organization_id=jobs_org.org.id, request_id="dead", created_at=old)
    # when
    quotas.take_slot(organization_id=jobs_org.org.id, request_id="next")
    # then: the slot is taken, and the dead one is gone
    assert list(JobSubmission.objects.values_list("request_id", flat=True)) == ["next"]
    # and a live slot counts: the bound holds
    with pytest.raises(GatewayError) as err:
        quotas.take_slot(organization_id=jobs_org.org.id, request_id="third")
    assert err.value.status == 429 and err.value.code == "too_many_live_jobs"


# --- echo's output per batch ----------------------------------------------------------------------


def _echo_batch_output_bytes(client: openai.OpenAI, lines: int) -> int:
    batch = _batch(client, lines, model="echo-1", max_tokens=100)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id and done.error_file_id is None
    return len(client.files.content(done.output_file_id).content)


def test_an_echo_batch_past_its_output_bound_ends_failed_with_an_error_the_client_reads(gateway, jobs_org, settings):
    # given: the exact size of a 4-line echo batch's output, kept whole at that bound
    jobs_org.budget(amount="5")
    client = oa(gateway)
    size = _echo_batch_output_bytes(client, 4)
    settings.CAPGATE = {**settings.CAPGATE, "ECHO_MAX_OUTPUT_BYTES": size}
    assert _echo_batch_output_bytes(client, 4) == size
    _settle_all()
    # when: the same batch with a bound one byte smaller
    settings.CAPGATE = {**settings.CAPGATE, "ECHO_MAX_OUTPUT_BYTES": size - 1}
    batch = _batch(client, 4, model="echo-1", max_tokens=100)
    # then: it ends failed, with the reason in its errors, and no output kept in part
    assert batch.status == "validating"
    done = client.batches.retrieve(batch.id)
    assert done.status == "failed" and done.output_file_id is None and done.error_file_id is None
    assert done.errors is not None and done.errors.data is not None
    [error] = done.errors.data
    assert error.code == "output_too_large" and f"{size - 1} bytes" in (error.message or "")
    assert not _echo_keys(f"file*{batch.id}*")
    # and the job settles at zero: nothing was answered, nothing is charged
    _settle_all()
    job = Job.objects.get(provider_job_id=batch.id)
    assert job.provider_status == "failed" and job.cost_nano == 0
    assert UsageRecord.objects.get(request_id=job.request_id).cost_nano == 0
    wait_settled()
    _clean()


def test_an_echo_message_batch_past_its_output_bound_is_refused_with_413(gateway, jobs_org, settings):
    # given: a bound below one message batch result
    settings.CAPGATE = {**settings.CAPGATE, "ECHO_MAX_OUTPUT_BYTES": 200}
    jobs_org.budget(amount="5")
    before = _echo_keys("msgbatch*")
    params = {**MESSAGE_PARAMS, "model": "echo-1"}
    # when
    with pytest.raises(anthropic.APIStatusError) as err:
        an(gateway).messages.batches.create(requests=[{"custom_id": f"m{i}", "params": params} for i in range(3)])
    # then: 413 in Anthropic's shape, no job, nothing kept in Redis, the hold released at zero
    assert err.value.status_code == 413
    assert err.value.body["error"]["type"] == "request_too_large"
    assert "200 bytes" in err.value.body["error"]["message"]
    assert not Job.objects.exists() and _echo_keys("msgbatch*") == before
    wait_settled()
    rec = UsageRecord.objects.get()
    assert rec.status == "failed_upstream" and rec.cost_nano == 0
    assert not Reservation.objects.exists() and not JobSubmission.objects.exists()
    _clean()
