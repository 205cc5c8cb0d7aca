"""Charts: spend, tokens, requests and refusals over a range, grouped by project, key, model or
customer; bad parameters are a form error; the outsider gets 404."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import UsageRecord
from requestlog.models import Refusal
from tenants.models import EndCustomer
from tests.api.conftest import Org

from ..api.test_isolation import state
from .test_dashboard import browser


def url(o: Org) -> str:
    return reverse("dashboard:charts", args=[o.slug])


def chart(html: str, name: str) -> str:
    found = re.search(rf'<div class="card chart" id="chart-{name}">(.*?)</div>\s*</div>', html, re.S)
    assert found, name
    return found.group(1)


def titles(html: str, name: str) -> list[str]:
    return re.findall(r"<title>(.*?)</title>", chart(html, name))


@pytest.fixture
def history(org_a: Org) -> Org:
    """Besides the fixtures' two records (today, yesterday; key "default", model echo-1): a
    record 20 days ago on key "batch" and model big-1 for customer "vip", and one refusal today."""
    now = timezone.now()
    batch = org_a.tenant.add_key("batch")
    vip = EndCustomer.objects.create(project=org_a.tenant.project, external_id="vip")
    UsageRecord.objects.create(
        request_id="acme-old",
        organization=org_a.tenant.org,
        project=org_a.tenant.project,
        api_key=batch,
        end_customer=vip,
        model="big-1",
        status="served",
        input_tokens=1000,
        output_tokens=500,
        cost_nano=4 * 10**9,
        admitted_at=now - timedelta(days=20),
        applied=True,
    )
    Refusal.objects.create(
        request_id="acme-refused",
        organization=org_a.tenant.org,
        project=org_a.tenant.project,
        api_key=org_a.tenant.key,
        model="echo-1",
        status="refused",
        code="organization_budget",
        http_status=402,
        created_at=now,
    )
    return org_a


@pytest.mark.django_db
def test_the_page_draws_four_charts_from_usage_and_the_request_log(history: Org, org_b: Org):
    # when: the default range (last 7 days), by project
    r = browser(history.owner).get(url(history))
    # then
    assert r.status_code == 200
    html = r.content.decode()
    assert all(f'id="chart-{name}"' in html for name in ("spend", "tokens", "requests", "refusals"))
    assert "($0.0035)" in chart(html, "spend")  # $0.001 today + $0.0025 yesterday; globex's never counts
    assert "(60)" in chart(html, "tokens")  # 2 x (10 in + 20 out)
    assert "(3)" in chart(html, "requests")  # two served, one refused
    today = timezone.now().date().isoformat()
    assert titles(html, "refusals") == [f"{today} main: 1"]
    assert "<svg" in chart(html, "spend") and "main" in chart(html, "spend")


@pytest.mark.parametrize(
    ("params", "spend", "requests"),
    [
        ({"range": "day"}, "$0.001", "2"),  # today's record and the refusal
        ({"range": "week"}, "$0.0035", "3"),
        ({"range": "month"}, "$4.0035", "4"),  # the record 20 days ago too
        ("custom-20", "$4.00", "1"),  # only the day 20 days ago (drawn by hour)
    ],
)
@pytest.mark.django_db
def test_the_range_filters_every_chart(history: Org, params, spend, requests):
    if params == "custom-20":
        day = (timezone.now() - timedelta(days=20)).date().isoformat()
        params = {"range": "custom", "start": day, "end": day}
    html = browser(history.owner).get(url(history), params).content.decode()
    assert f"({spend})" in chart(html, "spend") and f"({requests})" in chart(html, "requests")


@pytest.mark.parametrize(
    ("by", "names"),
    [
        ("project", {"main"}),
        ("key", {"default", "batch"}),
        ("model", {"echo-1", "big-1"}),
        ("customer", {"cust-1", "vip", "(none)"}),
    ],
)
@pytest.mark.django_db
def test_the_grouping_names_the_stacks(history: Org, by, names):
    html = browser(history.owner).get(url(history), {"range": "month", "by": by}).content.decode()
    legend = set(re.findall(r"</i>([^<]+)</span>", chart(html, "spend")))
    assert legend == names
    assert all(t.split(" ")[1].rstrip(":") in names for t in titles(html, "spend"))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"range": "year"}, "range"),
        ({"by": "colour"}, "by"),
        ({"range": "custom"}, None),
        ({"range": "custom", "start": "2026-11-02", "end": "2026-11-01"}, "end"),
        ({"range": "custom", "start": "2024-01-01", "end": "2026-01-01"}, "end"),
        ({"range": "custom", "start": "yesterday", "end": "2026-11-01"}, "start"),
    ],
)
@pytest.mark.django_db
def test_bad_parameters_are_a_form_error_and_draw_nothing(history: Org, params, field):
    r = browser(history.owner).get(url(history), params)
    assert r.status_code == 400
    form = r.context["form"]
    assert (field in form.errors) if field else form.non_field_errors()
    assert 'class="errorlist' in r.content.decode() and "<svg" not in r.content.decode()


@pytest.mark.django_db
def test_outsider_gets_404_and_changes_nothing(history: Org, org_b: Org):
    before = state()
    for params in ({}, {"range": "month", "by": "customer"}, {"range": "year"}):
        assert browser(org_b.owner).get(url(history), params).status_code == 404
    assert state() == before


@pytest.mark.django_db
def test_queries_do_not_grow_with_groups_or_records(history: Org):
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert browser(history.owner).get(url(history), {"range": "month", "by": "key"}).status_code == 200
        return len(ctx)

    few = queries()
    # given: 30 more keys and customers, each with a record and a refusal
    now = timezone.now()
    for i in range(30):
        key = history.tenant.add_key(f"k{i}")
        customer = EndCustomer.objects.create(project=history.tenant.project, external_id=f"c{i}")
        UsageRecord.objects.create(
            request_id=f"more-{i}",
            organization=history.tenant.org,
            project=history.tenant.project,
            api_key=key,
            end_customer=customer,
            model="m",
            status="served",
            cost_nano=i,
            admitted_at=now - timedelta(days=i % 25),
            applied=True,
        )
        Refusal.objects.create(
            request_id=f"ref-{i}",
            organization=history.tenant.org,
            api_key=key,
            status="refused",
            code="key_budget",
            http_status=402,
            created_at=now - timedelta(hours=i),
        )
    # then: the same number of queries (two grouped reads, whatever the groups)
    assert queries() == few


def picked(html: str) -> dict[str, str]:
    """What the range picker shows: the selected range and grouping, and the two dates."""
    form = re.search(r'<form method="get" class="card filters" novalidate id="chart-form">(.*?)</form>', html, re.S)
    assert form
    shown = {}
    for name in ("range", "by"):
        select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', form.group(1), re.S)
        assert select, name
        chosen = re.findall(r'<option value="([^"]*)" selected>', select.group(1))
        shown[name] = chosen[0] if len(chosen) == 1 else f"{len(chosen)} selected"
    for name in ("start", "end"):
        field = re.search(rf'<input type="date" name="{name}"([^>]*)>', form.group(1))
        assert field, name
        value = re.search(r'value="([^"]*)"', field.group(1))
        shown[name] = value.group(1) if value else ""
    return shown


def drawn_since(html: str) -> str:
    """The day the charts start at, from the line above them."""
    found = re.search(r'<p class="muted small" id="chart-range">(\S+) ', html)
    assert found
    return found.group(1)


@pytest.mark.parametrize(
    ("params", "range_", "days"),
    [
        ({}, "week", 7),  # nothing chosen: the default range, shown as chosen
        ({"range": "month", "by": "model"}, "month", 30),
        ({"range": "week", "start": "2020-01-01", "end": "2020-01-31"}, "week", 7),  # dates a preset ignores
        ("custom", "custom", 3),
    ],
)
@pytest.mark.django_db
def test_the_range_picker_shows_the_range_it_draws(history: Org, params, range_, days):
    # given: a preset ends today; the custom range is 5 to 3 days ago
    today = timezone.now().date()
    last = today if range_ != "custom" else today - timedelta(days=3)
    first = last - timedelta(days=days - 1)
    if params == "custom":
        params = {"range": "custom", "start": first.isoformat(), "end": last.isoformat()}
    # when
    r = browser(history.owner).get(url(history), params)
    # then: the picker names the range and grouping drawn, and its dates are the first and last day drawn
    assert r.status_code == 200
    html = r.content.decode()
    assert picked(html) == {
        "range": range_,
        "by": params.get("by", "project"),
        "start": first.isoformat(),
        "end": last.isoformat(),
    }
    assert drawn_since(html) == first.isoformat()
