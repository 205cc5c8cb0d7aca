"""A real browser (Debian's Chromium, driven by Playwright) against a live capgate — the same
ASGI app that serves /v1 and the dashboard: log in as the demo owner, create a blocking budget,
send requests through the gateway until it refuses, see the spend and the cap on the overview,
export the usage CSV. Screenshots land in test-artifacts/ and are checked for their numbers.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from catalog.models import Connection
from tenants.models import Organization
from tests.gateway.conftest import gateway, upstream, wait_settled  # noqa: F401  (fixtures)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo.yaml"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

DEMO_KEY = "cg_demo_key_do_not_use_in_production"


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


def spend_until_refused(url: str, *, max_tokens: int, limit: int = 50) -> tuple[int, str]:
    """Send chat requests through the live gateway with the demo key until one is refused,
    letting each settle first. Returns (served, refusal code)."""
    body = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    for served in range(limit):
        r = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30
        )
        if r.status_code == 402:
            return served, r.json()["error"]["code"]
        assert r.status_code == 200, r.text
        wait_settled()
    raise AssertionError("never refused")


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


@pytest.mark.django_db(transaction=True)
def test_owner_caps_spend_sees_it_and_exports_csv(gateway, page):  # noqa: F811
    # given: the demo organization (owner demo@capgate.localhost / demo-password), its echo
    # connection billing exactly 100 input + 1,300 output tokens = $0.099 a request
    call_command("apply", str(DEMO), stdout=io.StringIO())
    org = Organization.objects.get(slug="demo")
    echo = Connection.objects.get(organization=org, name="echo")
    echo.options = {**echo.options, "prompt_tokens": 100, "completion_tokens": 1300}
    echo.save()
    base = gateway.url

    # when: the owner logs in
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", "demo@capgate.localhost")
    page.fill("#id_password", "demo-password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/o/demo/$"))
    assert "Demo monthly cap" in page.inner_text("main")

    # and creates a $0.50 daily blocking budget on the demo project
    page.goto(f"{base}/o/demo/budgets/new/")
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

    # and traffic runs through the gateway until the cap refuses: max_tokens 1,600 makes the
    # worst case ~$0.121, each request bills $0.099 -> 4 served ($0.396), the 5th refused
    served, code = spend_until_refused(base, max_tokens=1600)
    assert (served, code) == (4, "project_budget")

    # then: the overview shows the spend against the cap, in numbers
    page.goto(f"{base}/o/demo/")
    row = page.locator(".budget-row", has_text="Browser cap")
    text = row.inner_text()
    assert "$0.396" in text and "$0.50" in text and "79.2%" in text and "blocks" in text
    monthly = page.locator(".budget-row", has_text="Demo monthly cap").inner_text()
    assert "$0.396" in monthly and "$25.00" in monthly
    shot(page, "overview")

    # and the usage page totals it and exports it as CSV
    page.goto(f"{base}/o/demo/usage/")
    assert page.inner_text("#usage-total") == "$0.396"
    shot(page, "usage")
    with page.expect_download() as download_info:
        page.click("#csv-export")
    download = download_info.value
    target = ARTIFACTS / "usage.csv"
    download.save_as(str(target))
    rows = list(csv.DictReader(target.open()))
    assert len(rows) == 4 and {r["cost_usd"] for r in rows} == {"0.099"} and {r["key"] for r in rows} == {"demo"}
