"""Live jobs in the API and the dashboard (hold, age, status), org-scoped, and the request log's
link from a settled job's record to the job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job
from ledger.admission import hand_to_job
from ledger.drain import drain
from ledger.recording import Outcome, record
from requestlog.models import RequestLogEntry
from tests.api.conftest import Org, client
from tests.dashboard.test_dashboard import browser


def _job(org: Org, request_id: str, provider_id: str, worst: int) -> Job:
    admitted = org.tenant.admit(request_id=request_id, worst_nano=worst)
    deadline = timezone.now() + timedelta(hours=26)
    job = Job.objects.create(
        organization=org.tenant.org,
        kind=Job.Kind.BATCH,
        provider_job_id=provider_id,
        route="echo-1",
        api_key=org.tenant.key,
        request_id=request_id,
        worst_nano=worst,
        provider_status="in_progress",
        deadline_at=deadline,
        next_poll_at=timezone.now(),
    )
    hand_to_job(request_id=request_id, job_id=provider_id, deadline_at=deadline)
    assert admitted.reservation.amount_nano == worst
    return job


@pytest.mark.django_db
def test_api_lists_live_jobs_with_their_hold_for_the_org_only(org_a: Org, org_b: Org):
    job = _job(org_a, "req_a1", "batch_a1", 3_000_000)
    other = _job(org_b, "req_b1", "batch_b1", 5_000_000)
    rows = client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/jobs/?live=true").json()["results"]
    assert [r["provider_job_id"] for r in rows] == ["batch_a1"]
    row = rows[0]
    assert row["held_usd"] == "0.003000000" and row["state"] == "live" and row["request_id"] == "req_a1"
    assert row["lease_expires_at"] is not None and row["age_seconds"] >= 0
    assert client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/jobs/{other.id}/").status_code == 404
    assert client(token=org_b.token_read).get(f"/api/orgs/{org_a.slug}/jobs/").status_code == 404
    assert client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/jobs/{job.id}/").json()["kind"] == "batch"
    bad = client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/jobs/?state=nope")
    assert bad.status_code == 400 and "state" in bad.json()["errors"]


@pytest.mark.django_db
def test_dashboard_lists_live_jobs_and_the_request_log_links_the_settled_one(org_a: Org, org_b: Org):
    _job(org_a, "req_a2", "batch_a2", 2_000_000)
    _job(org_b, "req_b2", "batch_b2", 2_000_000)
    c = browser(org_a.owner)
    url = reverse("dashboard:jobs", args=[org_a.slug])
    html = c.get(url).content.decode()
    assert "batch_a2" in html and "$0.002" in html and "batch_b2" not in html
    assert c.get(url, HTTP_HX_REQUEST="true").content.decode().lstrip().startswith('<div id="jobs-live"')
    assert browser(org_b.owner).get(url).status_code == 404
    # settled: the request's usage record carries the job, and the request log shows it
    from ledger.models import Reservation

    record(
        reservation=Reservation.objects.get(request_id="req_a2"), outcome=Outcome(status="served", cost_nano=1_000_000)
    )
    drain(request_ids=["req_a2"])
    Job.objects.filter(request_id="req_a2").update(state=Job.State.SETTLED, cost_nano=1_000_000)
    assert RequestLogEntry.objects.get(request_id="req_a2").job_id == "batch_a2"
    assert "batch_a2" not in c.get(url).content.decode()  # no longer live
    everything = c.get(url + "?all=1").content.decode()
    assert "batch_a2" in everything and reverse("dashboard:request_detail", args=[org_a.slug, "req_a2"]) in everything
    detail = c.get(reverse("dashboard:request_detail", args=[org_a.slug, "req_a2"])).content.decode()
    assert "batch_a2" in detail
