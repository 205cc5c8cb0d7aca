"""One pagination style: every list endpoint of the schema answers ?limit=&offset= with
{count, next, previous, results}, except the request log, which pages by cursor (?limit=&cursor=,
{next, previous, results}: tests/requestlog/test_pages.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model
from rest_framework import mixins

from catalog.classifications import classify
from config.api_urls import router
from tenants.audit import Actor

from .conftest import Org, client

ENVELOPE = {"count", "next", "previous", "results"}
CURSOR_PAGED = {"/api/orgs/{org_slug}/requests/"}
_CLASS = {"endpoint": "chat", "what": "field", "cls": "free"}


def list_paths(schema: dict) -> list[str]:
    return sorted(
        path for path, ops in schema["paths"].items() if "get" in ops and ops["get"]["operationId"].endswith("_list")
    )


@pytest.mark.django_db
def test_every_list_endpoint_pages_by_limit_and_offset(org_a: Org):
    c = client(user=org_a.owner)
    paths = list_paths(c.get("/api/schema/", {"format": "json"}).json())
    # the walk covers every registered list view, so a new one cannot slip past it
    listed = sum(1 for _, viewset, _ in router.registry if issubclass(viewset, mixins.ListModelMixin))
    assert len(paths) == listed >= 16, paths
    # the operator's classifications are the deployment's, not an organization's: a staff user reads them
    staff = get_user_model().objects.create_user("ops@example.com", "ops@example.com", "pw", is_staff=True)
    classify(actor=Actor("ops", operator=True), organization=None, **_CLASS, name="a", reason="r")
    classify(actor=Actor("ops", operator=True), organization=None, **_CLASS, name="b", reason="r")
    paged = set()
    for path in paths:
        url = path.replace("{org_slug}", org_a.slug)
        c = client(user=staff) if path == "/api/classifications/" else client(user=org_a.owner)
        body = c.get(url, {"limit": 1}).json()
        if path in CURSOR_PAGED:
            assert set(body) == {"next", "previous", "results"} and len(body["results"]) == 1, (path, body)
            second = c.get(body["next"]).json()
            assert second["previous"] is not None and second["results"] != body["results"], path
            paged.add(path.rstrip("/").rsplit("/", 1)[-1])
            continue
        assert set(body) == ENVELOPE, (path, body)
        assert len(body["results"]) == min(1, body["count"]) and body["previous"] is None, path
        if body["count"] > 1:
            paged.add(path.rstrip("/").rsplit("/", 1)[-1])
            assert parse_qs(urlparse(body["next"]).query) == {"limit": ["1"], "offset": ["1"]}, path
            second = c.get(url, {"limit": 1, "offset": 1}).json()
            assert second["previous"] is not None and second["results"] != body["results"], path
        else:
            assert body["next"] is None, path
    assert {"usage", "requests", "classifications"} <= paged  # next and previous were really followed


@pytest.mark.django_db
def test_usage_and_request_log_pages_neither_repeat_nor_skip(org_a: Org):
    c = client(user=org_a.owner)
    url = f"/api/orgs/{org_a.slug}/usage/"
    whole = [row["id"] for row in c.get(url).json()["results"]]
    pages = [
        row["id"]
        for offset in range(len(whole))
        for row in c.get(url, {"limit": 1, "offset": offset}).json()["results"]
    ]
    assert len(whole) >= 2 and pages == whole
    url = f"/api/orgs/{org_a.slug}/requests/"
    whole, pages, page = [row["request_id"] for row in c.get(url).json()["results"]], [], url + "?limit=1"
    while page:
        body = c.get(page).json()
        pages += [row["request_id"] for row in body["results"]]
        page = body["next"]
    assert len(whole) >= 2 and pages == whole


@pytest.mark.django_db
def test_a_page_is_at_most_1000_rows(org_a: Org, settings):
    from core.pagination import Pagination

    assert Pagination.max_limit == 1000
    body = client(user=org_a.owner).get(f"/api/orgs/{org_a.slug}/prices/", {"limit": 10**9}).json()
    assert set(body) == ENVELOPE


@pytest.mark.django_db
def test_outsider_gets_404_on_every_list_endpoint(org_a: Org, org_b: Org):
    paths = [
        p
        for p in list_paths(client(user=org_a.owner).get("/api/schema/", {"format": "json"}).json())
        if "{org_slug}" in p
    ]
    assert paths
    for path in paths:
        r = client(token=org_b.token_read).get(path.replace("{org_slug}", org_a.slug), {"limit": 1})
        assert r.status_code == 404, path
