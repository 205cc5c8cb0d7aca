"""The request log in the API and the dashboard: filters (the same FilterSet), search by
request id, customer and run, a detail page, a streamed CSV, the overview's refusals by code;
an outsider gets 404 everywhere and changes nothing; bad filters get each endpoint's error."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.urls import reverse
from django.utils import timezone

from requestlog.models import Refusal, RequestLogEntry
from tests.api.conftest import Org, client
from tests.api.test_isolation import state

pytestmark = pytest.mark.django_db


def refusal(
    o: Org,
    request_id: str,
    *,
    code: str = "organization_budget",
    status: str = "refused",
    customer=None,
    run_id: str = "",
    minutes_ago: int = 1,
    **kw,
) -> Refusal:
    return Refusal.objects.create(
        request_id=request_id,
        organization=o.tenant.org,
        project=o.tenant.project,
        api_key=o.tenant.key,
        end_customer=customer,
        run_id=run_id,
        model="echo-1",
        endpoint="chat",
        status=status,
        code=code,
        http_status=402 if status == "refused" else 429,
        budget=o.budget if status == "refused" else None,
        reserved_nano=7_500_000,
        latency_ms=3,
        message="Refused by organization budget",
        created_at=timezone.now() - timedelta(minutes=minutes_ago),
        **kw,
    )


@pytest.fixture
def logged(org_a: Org, org_b: Org) -> Org:
    """acme: its two usage records (acme-u0, acme-u1 for cust-1) and three refusals; globex: one."""
    refusal(org_a, "req_refused_1", customer=org_a.customer, run_id="run-9")
    refusal(org_a, "req_refused_2", minutes_ago=2)
    refusal(org_a, "req_limited_1", code="rate_limit_exceeded", status="rate_limited")
    refusal(org_b, "req_globex_1")
    return org_a


def api(o: Org, query: str = "", **kw):
    return client(token=o.token_read).get(f"/api/orgs/{o.slug}/requests/{query}", **kw)


def test_api_lists_usage_and_refusals_as_one_log(logged: Org):
    r = api(logged)
    assert r.status_code == 200
    ids = [row["request_id"] for row in r.json()["results"]]
    assert sorted(ids) == ["acme-u0", "acme-u1", "req_limited_1", "req_refused_1", "req_refused_2"]
    row = next(x for x in r.json()["results"] if x["request_id"] == "req_refused_1")
    assert (row["status"], row["code"], row["http_status"], row["budget"]) == (
        "refused",
        "organization_budget",
        402,
        logged.budget.id,
    )
    assert (row["customer"], row["run_id"], row["reserved_usd"], row["cost_usd"]) == (
        "cust-1",
        "run-9",
        "0.007500000",
        "0.000000000",
    )


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?status=refused", ["req_refused_1", "req_refused_2"]),
        ("?code=rate_limit_exceeded", ["req_limited_1"]),
        ("?request_id=req_refused_2", ["req_refused_2"]),
        ("?customer=cust-1", ["acme-u1", "req_refused_1"]),
        ("?run=run-9", ["req_refused_1"]),
        ("?status=served&model=echo-1", ["acme-u0", "acme-u1"]),
        ("?request_id=req_globex_1", []),
    ],
)
def test_api_filters(logged: Org, query: str, expected: list[str]):
    r = api(logged, query)
    assert r.status_code == 200, r.json()
    assert sorted(row["request_id"] for row in r.json()["results"]) == expected


def test_api_filters_by_project_and_key_of_the_org_only(logged: Org, org_b: Org):
    assert (
        len(api(logged, f"?project={logged.tenant.project.id}&api_key={logged.tenant.key.id}").json()["results"]) == 5
    )
    r = api(logged, f"?project={org_b.tenant.project.id}")
    assert r.status_code == 400 and r.json()["code"] == "invalid" and "project" in r.json()["errors"]


@pytest.mark.parametrize("query", ["?status=bogus", "?since=yesterday", "?project=abc", "?request_id=" + "x" * 101])
def test_api_bad_filters_get_the_api_error_shape_and_change_nothing(logged: Org, query: str):
    before = state(), Refusal.objects.count()
    r = api(logged, query)
    assert r.status_code == 400 and r.json()["code"] == "invalid", r.content
    assert (state(), Refusal.objects.count()) == before


def test_api_detail_by_request_id(logged: Org):
    r = client(token=logged.token_read).get(f"/api/orgs/{logged.slug}/requests/req_refused_1/")
    assert r.status_code == 200 and r.json()["code"] == "organization_budget"


def test_outsider_gets_404_from_the_api_and_changes_nothing(logged: Org, org_b: Org):
    before = state(), Refusal.objects.count()
    for c in (client(token=org_b.token_read), client(user=org_b.owner)):
        assert c.get(f"/api/orgs/{logged.slug}/requests/").status_code == 404
        assert c.get(f"/api/orgs/{logged.slug}/requests/req_refused_1/").status_code == 404
        assert c.delete(f"/api/orgs/{logged.slug}/requests/req_refused_1/").status_code == 404
        # and under its own organization, acme's request ids do not exist
        assert c.get(f"/api/orgs/{org_b.slug}/requests/req_refused_1/").status_code == 404
    assert (state(), Refusal.objects.count()) == before


def test_the_filters_are_in_the_openapi_schema(logged: Org):
    schema = client(token=logged.token_read).get("/api/schema/?format=json").json()
    params = {p["name"] for p in schema["paths"]["/api/orgs/{org_slug}/requests/"]["get"]["parameters"]}
    assert {
        "request_id",
        "customer",
        "run",
        "status",
        "code",
        "model",
        "project",
        "api_key",
        "since",
        "until",
    } <= params


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_dashboard_log_filters_and_links_each_request_to_its_detail(logged: Org):
    c = browser(logged.owner)
    url = reverse("dashboard:requests", args=[logged.slug])
    page = c.get(url).content.decode()
    for request_id in ("acme-u0", "acme-u1", "req_refused_1", "req_refused_2", "req_limited_1"):
        assert f'data-request-id="{request_id}"' in page
    assert "req_globex_1" not in page
    found = c.get(url, {"customer": "cust-1", "status": "refused"}).content.decode()
    assert 'data-request-id="req_refused_1"' in found and 'data-request-id="acme-u1"' not in found
    assert reverse("dashboard:request_detail", args=[logged.slug, "req_refused_1"]) in found
    detail = c.get(reverse("dashboard:request_detail", args=[logged.slug, "req_refused_1"])).content.decode()
    assert "organization_budget" in detail and "run-9" in detail and "cust-1" in detail
    assert reverse("dashboard:budget_edit", args=[logged.slug, logged.budget.id]) in detail


def test_dashboard_bad_filter_is_a_400_with_the_error_and_no_rows(logged: Org):
    r = browser(logged.owner).get(reverse("dashboard:requests", args=[logged.slug]), {"status": "bogus"})
    assert r.status_code == 400
    assert "Select a valid choice" in r.content.decode() and "data-request-id" not in r.content.decode()


def test_outsider_gets_404_on_the_log_pages_and_changes_nothing(logged: Org, org_b: Org):
    c = browser(org_b.owner)
    before = state(), Refusal.objects.count()
    for name, args in [("requests", []), ("requests_csv", []), ("request_detail", ["req_refused_1"])]:
        assert c.get(reverse(f"dashboard:{name}", args=[logged.slug, *args])).status_code == 404
        assert c.post(reverse(f"dashboard:{name}", args=[logged.slug, *args])).status_code == 404
    # acme's request under globex's own log is not found either
    assert c.get(reverse("dashboard:request_detail", args=[org_b.slug, "req_refused_1"])).status_code == 404
    assert (state(), Refusal.objects.count()) == before


def test_csv_export_is_an_async_stream_of_the_filtered_log(logged: Org):
    async def fetch():
        c = AsyncClient()
        await c.aforce_login(logged.owner)
        response = await c.get(reverse("dashboard:requests_csv", args=[logged.slug]), {"status": "refused"})
        chunks = [chunk async for chunk in response.streaming_content]
        return response, chunks

    response, chunks = async_to_sync(fetch)()
    # then: served chunk by chunk from an async iterator (so ASGI does not collect it first)
    assert response.status_code == 200 and response.is_async and len(chunks) == 3
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert [r["request_id"] for r in rows] == ["req_refused_2", "req_refused_1"]  # oldest first
    assert rows[1]["customer"] == "cust-1" and rows[1]["budget"] == logged.budget.name


def test_overview_counts_refused_requests_by_code(logged: Org):
    refusal(logged, "req_refused_3")
    refusal(logged, "req_old", minutes_ago=60 * 24 * 8)  # older than the panel's week
    page = browser(logged.owner).get(reverse("dashboard:overview", args=[logged.slug])).content.decode()
    panel = page[page.index('id="refusals"') :]
    panel = panel[: panel.index("</table>")]
    assert '<code>organization_budget</code></a></td><td>refused</td><td class="num">3</td>' in panel
    assert '<code>rate_limit_exceeded</code></a></td><td>rate_limited</td><td class="num">1</td>' in panel


def test_the_view_has_one_row_per_request(logged: Org):
    assert RequestLogEntry.objects.count() == 2 + 2 + 4  # both orgs' usage records and refusals
