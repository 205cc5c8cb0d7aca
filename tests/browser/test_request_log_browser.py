"""A real browser follows one refused request: from the gateway's 402, to its row in the
request log, to its detail page, to the alert that it caused. The screenshot of the log lands
in test-artifacts/request-log.png (docs/request-log.png is a copy)."""

from __future__ import annotations

import io
import re
import time

import httpx
import pytest
from django.core.management import call_command

from alerts.models import AlertEvent
from catalog.models import Connection
from ledger.models import Budget
from requestlog.models import RequestLogEntry
from tenants.models import Organization, Project
from tests.browser.test_dashboard_browser import DEMO, DEMO_KEY, page, shot  # noqa: F401  (fixture)
from tests.gateway.conftest import gateway, upstream, wait_settled  # noqa: F401  (fixtures)


def until(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)
    return found


@pytest.mark.django_db(transaction=True)
def test_one_refused_request_from_402_to_log_row_to_alert(gateway, page):  # noqa: F811
    # given: the demo organization, each echo call billing $0.099, under a $0.25 daily project cap
    call_command("apply", str(DEMO), stdout=io.StringIO())
    org = Organization.objects.get(slug="demo")
    echo = Connection.objects.get(organization=org, name="echo")
    echo.options = {**echo.options, "prompt_tokens": 100, "completion_tokens": 1300}
    echo.save()
    project = Project.objects.get(organization=org, name="Default")
    budget = Budget.objects.create(
        organization=org,
        scope="project",
        project=project,
        name="Browser cap",
        period="day",
        mode="block",
        amount_nano=250_000_000,
    )
    base = gateway.url
    body = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1600}
    headers = {"authorization": f"Bearer {DEMO_KEY}", "x-capgate-customer": "shop-42", "x-capgate-run": "nightly-7"}

    # when: calls go through the gateway until the cap refuses one
    for _ in range(5):
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)
        if r.status_code == 402:
            break
        assert r.status_code == 200
        wait_settled()
    assert r.status_code == 402 and r.json()["error"]["code"] == "project_budget"
    request_id = r.headers["x-capgate-request-id"]
    until(lambda: RequestLogEntry.objects.filter(request_id=request_id).exists())
    alert = until(lambda: AlertEvent.objects.filter(kind="refusal", tipped_by__request_id=request_id).first())

    # then: the owner finds it in the request log by its id
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", "demo@capgate.localhost")
    page.fill("#id_password", "demo-password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/o/demo/$"))
    assert "project_budget" in page.inner_text("#refusals")  # the overview counts it
    page.goto(f"{base}/o/demo/requests/")
    assert page.locator(f'tr[data-request-id="{request_id}"]').count() == 1
    shot(page, "request-log")
    page.fill("#id_request_id", request_id)
    page.click("button[type=submit]")
    row = page.locator("#request-log tr[data-request-id]")
    assert row.count() == 1
    text = row.inner_text()
    assert "refused" in text and "project_budget" in text and "shop-42" in text and "nightly-7" in text

    # and its detail names the ceiling and the budget, and the alert it caused
    row.locator("a").first.click()
    page.wait_for_url(re.compile(rf"/o/demo/requests/{request_id}/$"))
    detail = page.inner_text("#request-detail")
    assert "project_budget" in detail and "Browser cap" in detail and "HTTP 402" in detail
    alerts = page.locator("#request-alerts")
    assert "Browser cap" in alerts.inner_text() and "refusal" in alerts.inner_text()
    shot(page, "request-detail")
    alerts.locator("a", has_text="Browser cap").click()
    page.wait_for_url(re.compile(rf"/o/demo/budgets/{budget.id}/$"))
    assert alert.budget_id == budget.id
