"""Pages of the request log are read by keyset, each side (usage records, refusals) under its
own ordered LIMIT: newest first with ties broken by (source, row id), a cursor walk sees every
row once while rows are added, each side's first-page read is an index scan under a LIMIT, and
a cursor the log did not write is a 400 in the API's and the dashboard's shapes."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from itertools import count

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import UsageRecord
from requestlog.filters import RequestLogFilter
from requestlog.models import Refusal, RequestLogEntry
from requestlog.pages import FILTERS, Cursor
from tests.api.conftest import Org, client
from tests.api.test_isolation import state

pytestmark = pytest.mark.django_db
_ids = count()


def usage(o: Org, at: datetime, *, status: str = "served", **kw) -> UsageRecord:
    values = {"project": o.tenant.project, "api_key": o.tenant.key, "model": "echo-1", **kw}
    return UsageRecord.objects.create(
        request_id=f"u-{next(_ids)}", organization=o.tenant.org, status=status, admitted_at=at, applied=True, **values
    )


def refusal(o: Org, at: datetime, *, status: str = "refused", **kw) -> Refusal:
    values = {"project": o.tenant.project, "api_key": o.tenant.key, "model": "echo-1", **kw}
    return Refusal.objects.create(
        request_id=f"r-{next(_ids)}",
        organization=o.tenant.org,
        endpoint="chat",
        status=status,
        code="organization_budget" if status == "refused" else "rate_limit_exceeded",
        http_status=402 if status == "refused" else 429,
        created_at=at,
        **values,
    )


def mixed_log(o: Org, *, n: int, start: datetime) -> list[str]:
    """`n` rows alternating usage and refusal, every third pair at the same instant as the one
    before (ties across and within sides); their request ids, newest first by the log's order."""
    rows: list[tuple[datetime, int, int, str]] = []
    at = start
    for i in range(n):
        if i % 3:
            at -= timedelta(seconds=1)
        row = usage(o, at) if i % 2 else refusal(o, at)
        rows.append((at, 1 if i % 2 else 0, row.id, row.request_id))
    return [r[3] for r in sorted(rows, reverse=True)]


def api_ids(o: Org, **params) -> tuple[list[str], dict]:
    body = client(token=o.token_read).get(f"/api/orgs/{o.slug}/requests/", params).json()
    return [row["request_id"] for row in body["results"]], body


def walk(o: Org, *, limit: int, between=None) -> list[str]:
    """Every page of the API's log from the newest, following `next`; `between(page)` runs
    after each page is read."""
    c, seen, url, pages = client(token=o.token_read), [], f"/api/orgs/{o.slug}/requests/?limit={limit}", 0
    while url:
        body = c.get(url).json()
        seen += [row["request_id"] for row in body["results"]]
        url, pages = body["next"], pages + 1
        assert pages < 100, "the walk does not end"
        if between:
            between(pages)
    return seen


def test_newest_first_ties_by_source_then_row_id_same_as_the_view_sorted(org_a: Org):
    # given: the cast's two usage records and a mixed log with equal times across both sides
    expected = ["acme-u0", *mixed_log(org_a, n=12, start=timezone.now() - timedelta(hours=1)), "acme-u1"]
    # when: the first page is read through the API, and through the view sorted whole
    ids, body = api_ids(org_a, limit=100)
    whole = list(
        RequestLogEntry.objects.filter(organization=org_a.tenant.org)
        .order_by("-at", "-source", "-row_id")
        .values_list("request_id", flat=True)
    )
    # then: the same rows in the same order: time, then usage before refusal, then row id
    assert ids == whole == expected
    assert set(body) == {"next", "previous", "results"} and body["next"] is None and body["previous"] is None


def test_each_filter_selects_the_same_rows_as_the_filtered_view(org_a: Org, org_b: Org):
    # given: both sides with every filterable column set on some rows, and another organization
    now = timezone.now()
    key2 = org_a.tenant.add_key("second")
    for i in range(6):
        usage(org_a, now - timedelta(minutes=i), run_id="run-1" if i % 2 else None, end_customer=org_a.customer)
        refusal(org_a, now - timedelta(minutes=i, seconds=30), status="rate_limited" if i % 2 else "refused")
    usage(org_a, now - timedelta(hours=3), api_key=key2, status="released", model="other")
    refusal(org_a, now - timedelta(hours=4), api_key=key2, run_id="run-1", end_customer=org_a.customer)
    usage(org_b, now)
    since, until = (now - timedelta(minutes=3)).isoformat(), (now - timedelta(minutes=1)).isoformat()
    queries = [
        {"status": "served"},
        {"status": "released"},
        {"status": "rate_limited"},
        {"code": "organization_budget"},
        {"run": "run-1"},
        {"api_key": key2.id},
        {"project": org_a.tenant.project.id},
        {"customer": "cust-1"},
        {"model": "other"},
        {"request_id": "acme-u1"},
        {"since": since, "until": until},
        {"status": "refused", "customer": "cust-1", "api_key": key2.id},
    ]
    assert FILTERS == set(RequestLogFilter.base_filters)  # pages.py reads every filter of the set
    for query in queries:
        # when: the API's page and the dashboard's are read with the filter
        ids, _ = api_ids(org_a, limit=1000, **query)
        page = browser(org_a.owner).get(reverse("dashboard:requests", args=[org_a.slug]), query)
        fs = RequestLogFilter(
            query,
            queryset=RequestLogEntry.objects.filter(organization=org_a.tenant.org),
            organization=org_a.tenant.org,
        )
        assert fs.is_valid(), fs.errors
        expected = list(fs.qs.order_by("-at", "-source", "-row_id").values_list("request_id", flat=True))
        # then: each gives the rows the view filtered whole gives, in order
        assert expected and ids == expected, (query, ids, expected)
        assert (
            page.status_code == 200
            and [line.split('"')[1] for line in page.content.decode().split("data-request-id=")[1:]] == expected
        ), query


def test_a_cursor_walk_sees_every_row_once_while_rows_are_added(org_a: Org):
    # given: a log of 41 rows over both sides (and the cast's two records)
    before = set(mixed_log(org_a, n=41, start=timezone.now() - timedelta(minutes=1)))
    before |= {"acme-u0", "acme-u1"}
    added: list[str] = []

    def add(page: int) -> None:  # rows arrive between pages: newer than any, on both sides
        at = timezone.now()
        added.extend([usage(org_a, at).request_id, refusal(org_a, at).request_id])

    # when: the log is walked 5 rows at a time from the newest, following `next`
    seen = walk(org_a, limit=5, between=add)
    # then: every row there at the start is seen exactly once; nothing is seen twice
    assert len(seen) == len(set(seen)) and before <= set(seen) and set(seen) <= before | set(added)
    assert len(added) >= 16


def test_previous_links_walk_back_to_the_same_pages(org_a: Org):
    # given: 23 rows and the first three pages of 5 by `next`
    mixed_log(org_a, n=21, start=timezone.now())
    c, pages = client(token=org_a.token_read), []
    body = c.get(f"/api/orgs/{org_a.slug}/requests/", {"limit": 5}).json()
    for _ in range(3):
        pages.append(body)
        body = c.get(body["next"]).json()
    # when: `previous` is followed back from the third page
    second = c.get(pages[2]["previous"]).json()
    first = c.get(second["previous"]).json()
    # then: the same rows as the way down; the top page has no `previous`
    assert second["results"] == pages[1]["results"] and first["results"] == pages[0]["results"]
    assert first["previous"] is None and pages[0]["previous"] is None and pages[1]["previous"] is not None


def test_a_newer_page_at_the_top_is_the_first_page_full(org_a: Org):
    # given: 12 rows and the second page of 5
    order = ["acme-u0", *mixed_log(org_a, n=10, start=timezone.now() - timedelta(hours=1))]
    _, first = api_ids(org_a, limit=5)
    c = client(token=org_a.token_read)
    second = c.get(first["next"]).json()
    # when: three newer rows arrive and `previous` is followed from the second page, twice
    at = timezone.now() + timedelta(seconds=5)
    new = [usage(org_a, at + timedelta(seconds=i)).request_id for i in range(3)]
    back = c.get(second["previous"]).json()
    top = c.get(back["previous"]).json()
    # then: first the five rows just above the second page, then the first page as it is now:
    # the newest five (fewer than five newer rows would leave a short page), no `previous`
    assert [r["request_id"] for r in back["results"]] == order[:5]
    assert [r["request_id"] for r in top["results"]] == new[::-1] + order[:2] and top["previous"] is None


def _plan_nodes(plan: dict) -> list[dict]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


@pytest.mark.parametrize(
    "query, side_index",
    [
        ({}, {"usage_usagerecord": None, "requestlog_refusal": None}),
        ({"status": "served"}, {"usage_usagerecord": None}),
        ({"status": "released"}, {"usage_usagerecord": "usage_status_time_idx"}),
        ({"status": "refused"}, {"requestlog_refusal": None}),
        ({"api_key": "KEY"}, {"usage_usagerecord": None, "requestlog_refusal": "refusal_key_time_idx"}),
        ({"customer": "cust-1"}, {"usage_usagerecord": None, "requestlog_refusal": "refusal_customer_time_idx"}),
    ],
)
def test_first_page_reads_each_side_by_index_under_a_limit(org_a: Org, query: dict, side_index: dict):
    # given: a long history on both sides, a tenth of it by a second key, a tenth for a customer
    now, key2 = timezone.now(), org_a.tenant.add_key("second")

    def subject(i: int) -> dict:
        return {
            "api_key": key2 if i % 10 == 0 else org_a.tenant.key,
            "end_customer": org_a.customer if i % 10 == 1 else None,
        }

    UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=f"h-{i}",
            organization=org_a.tenant.org,
            status="released" if i % 10 == 2 else "served",
            admitted_at=now - timedelta(minutes=i),
            applied=True,
            **subject(i),
        )
        for i in range(12_000)
    )
    Refusal.objects.bulk_create(
        Refusal(
            request_id=f"hr-{i}",
            organization=org_a.tenant.org,
            status="refused",
            code="organization_budget",
            http_status=402,
            created_at=now - timedelta(minutes=i, seconds=30),
            **subject(i),
        )
        for i in range(3_000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE usage_usagerecord")
        cursor.execute("ANALYZE requestlog_refusal")
    params = {k: (key2.id if v == "KEY" else v) for k, v in query.items()}
    # when: the API's first page is read
    with CaptureQueriesContext(connection) as queries:
        ids, _ = api_ids(org_a, limit=50, **params)
    assert len(ids) == 50
    # then: each side is one read of its own table: a LIMIT over an index scan, no sort of the history
    reads = {
        table: q["sql"]
        for q in queries.captured_queries
        for table in ("usage_usagerecord", "requestlog_refusal")
        if q["sql"].startswith("SELECT") and "LIMIT 51" in q["sql"] and f'FROM "{table}"' in q["sql"]
    }
    assert set(reads) == set(side_index), queries.captured_queries
    for table, sql in reads.items():
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0][0]["Plan"]
        nodes = _plan_nodes(plan)
        assert plan["Node Type"] == "Limit", plan
        shape = [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in nodes]
        assert not [n for n in nodes if n["Node Type"] == "Sort"], (table, shape)  # an Incremental Sort of ties only
        scans = [n for n in nodes if n.get("Relation Name") == table]
        assert scans and all(n["Node Type"] == "Index Scan" for n in scans), plan
        if side_index[table]:  # the filter's own index, not the organization's history filtered
            assert {n["Index Name"] for n in scans} == {side_index[table]}, plan
        assert sum(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) for n in scans) <= 200, plan


def _token(raw: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


GOOD_AT = "2026-12-05T10:00:00+00:00"
BAD_CURSORS = [
    "garbage!",
    "",
    "x" * 300,
    base64.urlsafe_b64encode(b"not json").decode(),
    _token({"at": GOOD_AT}),
    _token([GOOD_AT, "usage", 1]),
    _token(["yesterday", "usage", 1, 0]),
    _token(["2026-12-05T10:00:00", "usage", 1, 0]),  # no time zone
    _token([GOOD_AT, "audit", 1, 0]),
    _token([GOOD_AT, "usage", -1, 0]),
    _token([GOOD_AT, "usage", 2**63, 0]),
    _token([GOOD_AT, "usage", "1", 0]),
    _token([GOOD_AT, "usage", 1, 2]),
    _token([GOOD_AT, "usage", 1, True]),
    _token([GOOD_AT, "usage", 1.5, 0]),
    "٣٣٣٣",
]


@pytest.mark.parametrize("token", BAD_CURSORS)
def test_a_cursor_the_log_did_not_write_is_a_400_and_changes_nothing(org_a: Org, token: str):
    before = state(), Refusal.objects.count()
    r = client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/requests/", {"cursor": token})
    assert r.status_code == 400 and r.json()["code"] == "invalid" and "cursor" in r.json()["errors"], r.content
    page = browser(org_a.owner).get(reverse("dashboard:requests", args=[org_a.slug]), {"cursor": token})
    assert page.status_code == 400 and "The cursor is not valid." in page.content.decode()
    assert "data-request-id" not in page.content.decode()
    assert (state(), Refusal.objects.count()) == before


def test_a_cursor_round_trips_and_offset_is_refused(org_a: Org):
    cursor = Cursor(at=timezone.now(), source="refusal", row_id=7, newer=True)
    assert Cursor.decode(cursor.encode()) == cursor
    r = client(token=org_a.token_read).get(f"/api/orgs/{org_a.slug}/requests/", {"offset": 5})
    assert r.status_code == 400 and r.json()["code"] == "invalid" and "offset" in r.json()["errors"]


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_a_viewer_pages_the_dashboard_log_by_older_and_newer_links(org_a: Org, role_users):
    # given: 60 rows and acme's viewer
    order = ["acme-u0", *mixed_log(org_a, n=58, start=timezone.now() - timedelta(hours=1)), "acme-u1"]
    c = browser(role_users["viewer"][0])
    url = reverse("dashboard:requests", args=[org_a.slug])

    def rows(html: str) -> list[str]:
        return [part.split('"')[1] for part in html.split("data-request-id=")[1:]]

    def link(html: str, rel: str) -> str | None:
        marker = f'" rel="{rel}"'
        if marker not in html:
            return None
        return html[: html.index(marker)].rsplit('href="', 1)[1].replace("&amp;", "&")

    # when: the viewer reads the first page, follows "older", then "newer"
    first = c.get(url)
    html = first.content.decode()
    older = c.get(url + link(html, "next"))
    back = c.get(url + link(older.content.decode(), "prev"))
    # then: 50 rows, then the 10 older ones, then the first 50 again; no count of the history
    assert first.status_code == older.status_code == back.status_code == 200
    assert rows(html) == order[:50] and link(html, "prev") is None
    assert rows(older.content.decode()) == order[50:] and link(older.content.decode(), "next") is None
    assert rows(back.content.decode()) == order[:50]
    assert "page 1 of" not in html
    # and a filter is kept by the links
    refused = c.get(url, {"status": "refused"}).content.decode()
    assert "status=refused" in (link(refused, "next") or "status=refused")
