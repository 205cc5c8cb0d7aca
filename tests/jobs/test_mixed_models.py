"""A batch whose lines name different models, on one connection: each line is bounded at
submission and settled from the provider's report at its own model's batch price. Three batches
mixing a cheap and an expensive model on a blocking cap record exactly what the provider billed
(OpenAI batches and Anthropic message batches, headroom slices off and on); priced at the first
line's model instead, the window showed a fraction of the bill."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from alerts.audit import audit_counters
from catalog.models import Model
from catalog.pricing import Usage, batch_rates, cost_nano, rates_for
from jobs.models import Job, JobFile
from jobs.poll import poll_jobs
from ledger.models import Hold, Reservation, UsageRecord
from tests.conftest import window_of
from tests.jobs.conftest import an, oa, upload

pytestmark = pytest.mark.django_db(transaction=True)
BATCHES = 3
PRICEY_LINES, PRICEY_MAX_TOKENS = 10, 100


@pytest.fixture
def mixed(jobs_org, upstream):
    """Beside `gpt-test` / `claude-test` ($15 / $75 per 1M), `*-pricey` routes on the same
    connections to a model at ten times that; both at half price in batches. The fake upstream
    bills every output token a line allows."""
    pricey = Model.objects.create(
        provider=jobs_org.model.provider,
        name="pricey-1",
        input_usd_per_mtok=Decimal("150"),
        output_usd_per_mtok=Decimal("750"),
        max_output_tokens=4096,
        batch_multiplier=Decimal("0.5"),
    )
    jobs_org.route("gpt-pricey", jobs_org.openai, model=pricey)
    jobs_org.route("claude-pricey", jobs_org.anthropic, model=pricey)
    upstream.control(completion_tokens="max")
    return jobs_org


def _lines(cheap: str, pricey: str) -> list[tuple[str, str, int]]:
    """(custom_id, route, max_tokens): one cheap line first, then the expensive ones."""
    return [("r0", cheap, 10)] + [(f"r{i + 1}", pricey, PRICEY_MAX_TOKENS) for i in range(PRICEY_LINES)]


def _openai_file(lines):
    import io
    import json

    rows = [
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": route, "max_tokens": mt, "messages": [{"role": "user", "content": f"q {cid}"}]},
            }
        )
        for cid, route, mt in lines
    ]
    return io.BytesIO(("\n".join(rows) + "\n").encode())


def _provider_bill(job: dict, connection) -> int:
    """What the provider billed for a job: each billed line's usage at its model's batch price."""
    total = 0
    for usage, name in zip(job["billed"]["usage"], job["billed"]["models"], strict=True):
        model = Model.objects.get(name=name)
        rates = batch_rates(rates=rates_for(model=model, connection=connection), model=model)
        used = Usage(
            input_tokens=usage.get("prompt_tokens", usage.get("input_tokens", 0)),
            output_tokens=usage.get("completion_tokens", usage.get("output_tokens", 0)),
        )
        total += cost_nano(usage=used, rates=rates)
    return total


def _settle_all(upstream) -> None:
    for job in Job.objects.all():
        upstream.job(job.provider_job_id, "completed")
    for _ in range(5):
        Job.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
        poll_jobs()
        if not Job.objects.exclude(state=Job.State.SETTLED).exists():
            return
    raise AssertionError(list(Job.objects.values_list("state", flat=True)))


def _check_books(budget, upstream, connection) -> None:
    jobs = {j["id"]: j for j in upstream.jobs()}
    assert len(jobs) == BATCHES
    total = 0
    for job in Job.objects.all():
        bill = _provider_bill(jobs[job.provider_job_id], connection)
        rec = UsageRecord.objects.get(request_id=job.request_id)
        # each batch recorded at exactly what the provider billed, within what it reserved
        assert (rec.status, rec.cost_nano, rec.excess_nano) == ("served", bill, 0), rec.error
        assert job.cost_nano == bill
        assert rec.provider_model == "echo-1, pricey-1"
        total += bill
    w = window_of(budget)
    assert (w.spent_nano, w.reserved_nano) == (total, 0)
    assert not Reservation.objects.exists() and not Hold.objects.exists()
    report = audit_counters(record=False)
    assert not report.drifts and not report.request_drifts, report


def test_openai_batches_of_two_models_record_the_providers_bill(gateway, mixed, upstream, slices_mode):
    # given: a $2 cap; each batch is one cheap line and ten expensive ones
    budget = mixed.budget(amount="2")
    client = oa(gateway)
    # when: three batches are submitted and completed
    for _ in range(BATCHES):
        f = client.files.create(file=("batch.jsonl", _openai_file(_lines("gpt-test", "gpt-pricey"))), purpose="batch")
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert Job.objects.count() == BATCHES and all(j.line_models for j in Job.objects.all())
    # each line was bounded at its own model at submission: an expensive line's bound is above
    # anything the cheap model could bill it
    row = JobFile.objects.order_by("-id").first()
    assert row is not None and len(set(row.line_models.values())) == 2
    assert all(bound > 10 * row.line_bounds[0] for bound in row.line_bounds[1:])
    assert sum(r.amount_nano for r in Reservation.objects.all()) == BATCHES * sum(row.line_bounds)
    _settle_all(upstream)
    # then: the window holds the provider's bill, line by line at each line's model
    _check_books(budget, upstream, mixed.openai)


def test_anthropic_message_batches_of_two_models_record_the_providers_bill(gateway, mixed, upstream, slices_mode):
    budget = mixed.budget(amount="2")
    client = an(gateway)
    for _ in range(BATCHES):
        client.messages.batches.create(
            requests=[
                {
                    "custom_id": cid,
                    "params": {"model": route, "max_tokens": mt, "messages": [{"role": "user", "content": f"q {cid}"}]},
                }
                for cid, route, mt in _lines("claude-test", "claude-pricey")
            ]
        )
    _settle_all(upstream)
    _check_books(budget, upstream, mixed.anthropic)


def test_a_batch_of_one_model_is_priced_at_it_without_a_line_map(gateway, mixed, upstream):
    # given: every line on the expensive model (the first line's model prices them all)
    budget = mixed.budget(amount="2")
    client = oa(gateway)
    f = upload(client, 3, model="gpt-pricey", max_tokens=PRICEY_MAX_TOKENS)
    client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    job = Job.objects.get()
    assert job.line_models == {} and job.model is not None and job.model.name == "pricey-1"
    _settle_all(upstream)
    [bill] = [_provider_bill(j, mixed.openai) for j in upstream.jobs()]
    assert UsageRecord.objects.get().cost_nano == bill == window_of(budget).spent_nano
