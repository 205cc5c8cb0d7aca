"""A real browser (Debian's Chromium, driven by Playwright) against a live server: log in as the
demo owner, create a blocking budget, spend until it refuses, see the spend and the cap on the
overview, export the usage CSV. Screenshots land in test-artifacts/.

`spend_until_refused` drives admission + recording + drain in-process for now; when the live
gateway runs in tests it becomes HTTP calls to /v1/chat/completions with the demo key.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from budgets.admission import AdmissionRequest, Subject, admit
from budgets.errors import BudgetExceeded
from tenants.models import ApiKey, Organization
from usage.drain import drain_all
from usage.recording import Outcome, record

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo.yaml"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="run scripts/browser-deps.sh for Chromium")
_ids = itertools.count()


@pytest.fixture
def page(monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(15_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()


def spend_until_refused(*, key: ApiKey, worst_nano: int, cost_nano: int, limit: int = 100) -> tuple[int, str]:
    """Send requests (worst case reserved, actual cost recorded and drained) until one is refused.
    Returns (served, refusal code)."""
    subject = Subject(organization_id=key.organization_id, project_id=key.project_id, member_id=key.member_id,
                      api_key_id=key.id)
    for served in range(limit):
        try:
            admitted = admit(request=AdmissionRequest(subject=subject, request_id=f"browser-{next(_ids)}",
                                                      worst_nano=worst_nano, model="echo-1"))
        except BudgetExceeded as refusal:
            return served, refusal.code
        record(reservation=admitted.reservation, outcome=Outcome(status="served", cost_nano=cost_nano))
        drain_all()
    raise AssertionError("never refused")


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


@pytest.mark.django_db(transaction=True)
def test_owner_caps_spend_sees_it_and_exports_csv(live_server, page):
    # given: the demo organization (owner demo@capgate.localhost / demo-password)
    call_command("apply", str(DEMO), stdout=io.StringIO())
    org = Organization.objects.get(slug="demo")
    key = ApiKey.objects.get(organization=org, name="demo")

    # when: the owner logs in
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", "demo@capgate.localhost")
    page.fill("#id_password", "demo-password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/o/demo/$"))
    assert "Demo monthly cap" in page.inner_text("main")

    # and creates a $0.50 daily blocking budget on the demo project
    page.goto(f"{live_server.url}/o/demo/budgets/new/")
    page.fill("#id_name", "Browser cap")
    page.select_option("#id_scope", "project")
    page.select_option("#id_project", label="Default")
    page.select_option("#id_period", "day")
    page.select_option("#id_mode", "block")
    page.fill("#id_amount_usd", "0.50")
    page.fill("#id_thresholds", "50, 80, 100")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/o/demo/budgets/$"))
    assert "Budget “Browser cap” created." in page.inner_text("main")

    # and traffic runs until the cap refuses: $0.12 worst case, $0.10 billed -> 4 served, the 5th refused
    served, code = spend_until_refused(key=key, worst_nano=120_000_000, cost_nano=100_000_000)
    assert (served, code) == (4, "project_budget")

    # then: the overview shows the spend against the cap, in numbers
    page.goto(f"{live_server.url}/o/demo/")
    row = page.locator(".budget-row", has_text="Browser cap")
    text = row.inner_text()
    assert "$0.40" in text and "$0.50" in text and "80.0%" in text and "blocks" in text
    monthly = page.locator(".budget-row", has_text="Demo monthly cap").inner_text()
    assert "$0.40" in monthly and "$5.00" in monthly
    shot(page, "overview")

    # and the usage page totals it and exports it as CSV
    page.goto(f"{live_server.url}/o/demo/usage/")
    assert page.inner_text("#usage-total") == "$0.40"
    shot(page, "usage")
    with page.expect_download() as download_info:
        page.click("#csv-export")
    download = download_info.value
    target = ARTIFACTS / "usage.csv"
    download.save_as(str(target))
    rows = list(csv.DictReader(target.open()))
    assert len(rows) == 4 and {r["cost_usd"] for r in rows} == {"0.1"} and {r["key"] for r in rows} == {"demo"}
