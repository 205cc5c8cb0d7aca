"""Live pages: the overview and live reservations poll with htmx (served by the dashboard itself);
a poll gets the fragment only, never another organization's reservations, and an outsider's
poll is 404 and changes nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.api.conftest import Org

from ..api.test_isolation import state
from .test_dashboard import browser

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.mark.django_db
def test_htmx_script_is_served_without_a_static_step(client):
    r = client.get(reverse("dashboard:htmx_js"))
    assert r.status_code == 200 and r["Content-Type"].startswith("text/javascript")
    assert b"htmx" in r.content and len(r.content) > 10_000
    assert "max-age=86400" in r["Cache-Control"]


@pytest.mark.django_db
def test_live_reservations_page_and_its_fragment(org_a: Org, org_b: Org):
    # given: a held reservation in each organization
    org_a.tenant.admit(request_id="acme-held", worst_nano=2_000_000)
    org_b.tenant.admit(request_id="globex-held", worst_nano=3_000_000)
    c = browser(org_a.owner)
    url = reverse("dashboard:reservations", args=[org_a.slug])
    # when: the page, then an htmx poll
    page = c.get(url).content.decode()
    poll = c.get(url, **HTMX).content.decode()
    # then
    assert "<html" in page and reverse("dashboard:htmx_js") in page
    assert 'hx-trigger="every 5s' in page and f'hx-get="{url}"' in page
    assert "<html" not in poll and poll.lstrip().startswith('<div id="reservations-live"')
    for html in (page, poll):
        assert "acme-held" in html and "$0.002" in html and "globex-held" not in html


@pytest.mark.django_db
def test_overview_refreshes_its_live_block(org_a: Org):
    c = browser(org_a.owner)
    url = reverse("dashboard:overview", args=[org_a.slug])
    html = c.get(url + "?by=model").content.decode()
    assert f'<div id="overview-live" hx-get="{url}?by=model"' in html
    assert 'hx-select="#overview-live"' in html
    assert reverse("dashboard:reservations", args=[org_a.slug]) in html


@pytest.mark.django_db
def test_outsider_polls_get_404_and_change_nothing(org_a: Org, org_b: Org):
    org_a.tenant.admit(request_id="acme-held", worst_nano=2_000_000)
    c = browser(org_b.owner)
    before = state()
    for name in ("reservations", "overview"):
        for headers in ({}, HTMX):
            r = c.get(reverse(f"dashboard:{name}", args=[org_a.slug]), **headers)
            assert r.status_code == 404 and b"acme-held" not in r.content
    assert state() == before
