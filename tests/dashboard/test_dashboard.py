"""The dashboard: every page 404s for an outsider and changes nothing; roles; forms show errors;
secrets are shown once or never; CSV streams."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import warnings

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core import mail
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from django.urls import reverse

from catalog.models import Connection
from dashboard.views import records
from ledger.models import Budget
from tenants.models import ApiKey, ApiToken, AuditLogEntry, EndCustomer, Member, Project, hash_key
from tests.api.conftest import Org

from ..api.test_isolation import state

MANAGER_FORM = re.compile(r"/new/$|/(budgets|projects|connections)/\d+/$")


def browser(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def pages(o: Org) -> list[tuple[str, str]]:
    """(method, url) for every dashboard page of acme, with acme's object ids."""
    s = o.slug
    u = lambda name, *a: reverse(f"dashboard:{name}", args=[s, *a])  # noqa: E731
    return [
        ("get", u("overview")),
        ("get", u("budgets")),
        ("get", u("budget_new")),
        ("post", u("budget_new")),
        ("get", u("budget_edit", o.budget.id)),
        ("post", u("budget_edit", o.budget.id)),
        ("post", u("budget_delete", o.budget.id)),
        ("get", u("keys")),
        ("post", u("keys")),
        ("post", u("key_revoke", o.tenant.key.id)),
        ("get", u("projects")),
        ("post", u("projects")),
        ("get", u("project_edit", o.tenant.project.id)),
        ("post", u("project_edit", o.tenant.project.id)),
        ("post", u("customer_delete", o.customer.id)),
        ("get", u("members")),
        ("post", u("members")),
        ("post", u("member_role", o.member_row.id)),
        ("post", u("member_remove", o.member_row.id)),
        ("get", u("connections")),
        ("post", u("connections")),
        ("get", u("connection_new")),
        ("get", u("connection_edit", o.connection.id)),
        ("post", u("connection_edit", o.connection.id)),
        ("post", u("connection_delete", o.connection.id)),
        ("get", u("tokens")),
        ("post", u("tokens")),
        ("get", u("usage")),
        ("get", u("usage_csv")),
        ("get", u("alerts")),
        ("get", u("audit")),
        ("get", u("charts")),
        ("get", u("inventory")),
        ("post", u("inventory")),
    ]


@pytest.mark.django_db
def test_outsider_gets_404_on_every_page_and_changes_nothing(org_a: Org, org_b: Org):
    c = browser(org_b.owner)
    before = state()
    for method, url in pages(org_a):
        r = getattr(c, method)(url, {"name": "x", "amount_usd": "1", "scope": "organization", "role": "viewer"})
        assert r.status_code == 404, (method, url, r.status_code)
    assert c.get(reverse("dashboard:switch") + "?org=acme").status_code == 404
    assert state() == before


@pytest.mark.django_db
def test_objects_of_another_org_are_404_under_your_own_org(org_a: Org, org_b: Org):
    # acme's owner, with globex's object ids in acme's URLs
    c = browser(org_a.owner)
    before = state()
    for method, url in pages(org_a):
        foreign = url
        for mine, theirs in [
            (org_a.budget.id, org_b.budget.id),
            (org_a.tenant.key.id, org_b.tenant.key.id),
            (org_a.tenant.project.id, org_b.tenant.project.id),
            (org_a.customer.id, org_b.customer.id),
            (org_a.member_row.id, org_b.member_row.id),
            (org_a.connection.id, org_b.connection.id),
        ]:
            foreign = foreign.replace(f"/{mine}/", f"/{theirs}/")
        if foreign != url:
            assert getattr(c, method)(foreign, {"role": "viewer"}).status_code == 404, foreign
    assert state() == before


@pytest.mark.django_db
def test_anonymous_is_sent_to_login(org_a: Org):
    r = Client().get(reverse("dashboard:overview", args=[org_a.slug]))
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


@pytest.mark.django_db
def test_viewer_reads_everything_and_changes_nothing(org_a: Org, role_users):
    c = browser(role_users["viewer"][0])
    before = state()
    for method, url in pages(org_a):
        r = getattr(c, method)(
            url,
            {
                "name": "x",
                "amount_usd": "1",
                "scope": "organization",
                "role": "viewer",
                "project": org_a.tenant.project.id,
            },
        )
        if method == "get" and not MANAGER_FORM.search(url):
            assert r.status_code == 200, url
        else:  # writes, and the create/edit forms (owners and admins only)
            assert r.status_code == 403, (url, r.status_code)
    assert state() == before


@pytest.mark.django_db
def test_member_creates_and_revokes_own_keys_only(org_a: Org, role_users):
    user, member = role_users["member"]
    c = browser(user)
    r = c.post(reverse("dashboard:keys", args=[org_a.slug]), {"name": "mine", "project": org_a.tenant.project.id})
    assert r.status_code == 200
    key = ApiKey.objects.get(name="mine")
    assert key.member == member
    assert c.post(reverse("dashboard:key_revoke", args=[org_a.slug, org_a.tenant.key.id])).status_code == 403
    assert c.post(reverse("dashboard:key_revoke", args=[org_a.slug, key.id])).status_code == 302
    assert (
        c.post(
            reverse("dashboard:budget_new", args=[org_a.slug]), {"scope": "organization", "amount_usd": "1"}
        ).status_code
        == 403
    )


@pytest.mark.django_db
def test_create_blocking_budget_then_see_it_on_overview(org_a: Org):
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:budget_new", args=[org_a.slug]),
        {
            "name": "Hard cap",
            "scope": "project",
            "project": org_a.tenant.project.id,
            "period": "day",
            "timezone": "Europe/Paris",
            "mode": "block",
            "amount_usd": "12.34",
            "thresholds": "50, 90",
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    budget = Budget.objects.get(name="Hard cap")
    assert (budget.amount_nano, budget.thresholds, budget.timezone) == (12_340_000_000, [50, 90], "Europe/Paris")
    page = c.get(reverse("dashboard:overview", args=[org_a.slug])).content.decode()
    assert "Hard cap" in page and "$12.34" in page and "blocks" in page
    # spend shows: the monthly budget has $0.001 + $0.0025 recorded this month (at most; day 2 may be last month)
    assert "$5.00" in page
    assert AuditLogEntry.objects.filter(object_type="budget", action="create", actor="owner@acme.test").exists()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"scope": "key", "amount_usd": "1"}, "api_key", "A key budget names its api key."),
        ({"scope": "organization", "amount_usd": "-5"}, "amount_usd", "greater than or equal to 0"),
        ({"scope": "organization", "amount_usd": "ten"}, "amount_usd", "Enter a number."),
        ({"scope": "organization", "amount_usd": "1", "timezone": "Moon/Base"}, "timezone", "Unknown timezone"),
        ({"scope": "organization", "amount_usd": "1", "thresholds": "fifty"}, "thresholds", "Whole percentages"),
        ({"scope": "organization", "amount_usd": "1", "recipients": "a@b.c, nope"}, "recipients", "not an email"),
    ],
)
@pytest.mark.django_db
def test_budget_form_shows_errors_and_changes_nothing(org_a: Org, data, field, message):
    c = browser(org_a.owner)
    before = Budget.objects.count()
    r = c.post(
        reverse("dashboard:budget_new", args=[org_a.slug]),
        {"period": "month", "mode": "block", "timezone": "UTC", **data},
    )
    assert r.status_code == 200
    assert message in r.context["form"].errors[field][0]
    assert message.replace("'", "&#x27;") in r.content.decode()
    assert Budget.objects.count() == before


@pytest.mark.django_db
def test_budget_edit_keeps_subject_and_records_audit(org_a: Org):
    c = browser(org_a.owner)
    url = reverse("dashboard:budget_edit", args=[org_a.slug, org_a.budget.id])
    assert "5" in c.get(url).content.decode()
    r = c.post(
        url,
        {
            "name": "monthly",
            "period": "month",
            "timezone": "UTC",
            "mode": "alert",
            "amount_usd": "7",
            "thresholds": "80",
            "scope": "key",
        },
    )  # scope is disabled: ignored
    assert r.status_code == 302
    org_a.budget.refresh_from_db()
    assert (org_a.budget.scope, org_a.budget.mode, org_a.budget.amount_nano) == ("organization", "alert", 7 * 10**9)
    audit = c.get(reverse("dashboard:audit", args=[org_a.slug])).content.decode()
    assert "amount_nano" in audit and "7000000000" in audit


@pytest.mark.django_db
def test_key_secret_is_shown_once(org_a: Org):
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:keys", args=[org_a.slug]),
        {"name": "ci", "project": org_a.tenant.project.id, "allowed_models": "echo-1, gpt-x"},
    )
    raw = r.context["created"][1]
    assert raw in r.content.decode()
    key = ApiKey.objects.get(name="ci")
    assert key.key_hash == hash_key(raw) and key.allowed_models == ["echo-1", "gpt-x"]
    assert raw not in c.get(reverse("dashboard:keys", args=[org_a.slug])).content.decode()


@pytest.mark.django_db
def test_connection_secret_is_write_only(org_a: Org):
    c = browser(org_a.owner)
    url = reverse("dashboard:connection_edit", args=[org_a.slug, org_a.connection.id])
    page = c.get(url).content.decode()
    assert "sk-secret" not in page
    # saving without a secret keeps it
    r = c.post(url, {"name": "echo", "kind": "echo", "options": '{"delay_ms": 5}', "enabled": "on"})
    assert r.status_code == 302
    conn = Connection.objects.get(pk=org_a.connection.id)
    assert conn.plain_secret == "sk-secret" and conn.options == {"delay_ms": 5}
    r = c.post(url, {"name": "echo", "kind": "echo", "secret": "sk-other", "options": "{}", "enabled": "on"})
    assert Connection.objects.get(pk=org_a.connection.id).plain_secret == "sk-other"
    assert "sk-" not in c.get(reverse("dashboard:connections", args=[org_a.slug])).content.decode()
    assert "sk-" not in c.get(reverse("dashboard:audit", args=[org_a.slug])).content.decode()


@pytest.mark.django_db
def test_projects_customers_members_tokens(org_a: Org):
    c = browser(org_a.owner)
    s = org_a.slug
    r = c.post(
        reverse("dashboard:projects", args=[s]),
        {
            "create_project": "1",
            "slug": "research",
            "name": "R",
            "default_customer_budget_usd": "0.5",
            "default_customer_budget_period": "day",
            "default_customer_budget_mode": "block",
        },
    )
    assert r.status_code == 302
    assert Project.objects.get(slug="research").default_customer_budget_nano == 500_000_000
    r = c.post(
        reverse("dashboard:projects", args=[s]),
        {
            "create_project": "1",
            "slug": "research",
            "name": "R2",
            "default_customer_budget_period": "day",
            "default_customer_budget_mode": "block",
        },
    )
    assert r.status_code == 200 and "exists" in r.context["project_form"].errors["slug"][0]
    r = c.post(
        reverse("dashboard:projects", args=[s]),
        {"create_customer": "1", "project": org_a.tenant.project.id, "external_id": "cust-77"},
    )
    assert EndCustomer.objects.filter(external_id="cust-77").exists()
    # invite: a member with an unusable password and an email with a set-password link
    r = c.post(reverse("dashboard:members", args=[s]), {"email": "new@acme.test", "role": "viewer"})
    assert r.status_code == 302
    assert Member.objects.get(user__email="new@acme.test").role == "viewer"
    assert len(mail.outbox) == 1 and "/accounts/reset/" in mail.outbox[0].body
    # the last owner cannot be demoted
    c.post(reverse("dashboard:member_role", args=[s, org_a.member_row.id]), {"role": "viewer"})
    assert Member.objects.get(pk=org_a.member_row.id).role == "owner"
    # API token: shown once
    r = c.post(reverse("dashboard:tokens", args=[s]), {"name": "ci", "scope": "write"})
    raw = r.context["created"][1]
    assert ApiToken.objects.get(name="ci").token_hash == hash_key(raw)


@pytest.mark.django_db
def test_usage_filters_and_streamed_csv(org_a: Org, org_b: Org):
    c = browser(org_a.owner)
    r = c.get(reverse("dashboard:usage", args=[org_a.slug]), {"end_customer": "cust-1"})
    page = r.content.decode()
    assert "acme-u1" in page and "acme-u0" not in page and "$0.0025" in page
    status, headers, chunks, _ = asgi_get(org_a.owner, reverse("dashboard:usage_csv", args=[org_a.slug]))
    assert status == 200 and headers[b"content-type"] == b"text/csv", headers
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert list(rows[0]) == records.CSV_COLUMNS
    assert {row["request_id"] for row in rows} == {"acme-u0", "acme-u1"}  # never globex's
    assert sorted(row["cost_usd"] for row in rows) == ["0.001", "0.0025"]


def asgi_get(user, path: str, on_chunk=None) -> tuple[int, dict[bytes, bytes], list[bytes], list[str]]:
    """GET `path` as `user` through Django's real ASGI handler: (status, headers, the body as the
    chunks it was sent in, warnings raised meanwhile). `on_chunk` runs as each chunk is sent."""
    cookie = browser(user).cookies[settings.SESSION_COOKIE_NAME].value
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []

    requested = False

    async def receive():
        nonlocal requested
        if requested:  # the client stays connected: Django's disconnect listener waits here
            await asyncio.Event().wait()
        requested = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body") and on_chunk:
            on_chunk(message["body"])
        sent.append(message)

    # As Django's test client does: the test's connection (and its transaction) must stay open.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async_to_sync(ASGIHandler())(scope, receive, send)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    start = next(m for m in sent if m["type"] == "http.response.start")
    chunks = [m["body"] for m in sent if m["type"] == "http.response.body" and m.get("body")]
    return start["status"], {k.lower(): v for k, v in start["headers"]}, chunks, [str(w.message) for w in caught]


@pytest.mark.django_db
def test_usage_csv_is_streamed_row_by_row_under_asgi(org_a: Org, org_b: Org, monkeypatch):
    # given: a hook counting rows formatted so far (three amounts per row)
    formatted: list[int] = []
    real = records.nano_to_usd
    monkeypatch.setattr(records, "nano_to_usd", lambda n: formatted.append(n) or real(n))
    amounts_when_sent: list[int] = []
    # when: the export is fetched through the ASGI handler
    status, _, chunks, caught = asgi_get(
        org_a.owner,
        reverse("dashboard:usage_csv", args=[org_a.slug]),
        on_chunk=lambda _: amounts_when_sent.append(len(formatted)),
    )
    # then: header and each row are separate chunks, each sent before the next row was read
    # (a sync iterator would be read whole first: [6, 6, 6], with Django's warning)
    assert status == 200 and len(chunks) == 3
    assert amounts_when_sent == [0, 3, 6]
    assert not [w for w in caught if "synchronous iterators" in w]
    # and an outsider gets 404 through the same handler
    assert asgi_get(org_b.owner, reverse("dashboard:usage_csv", args=[org_a.slug]))[0] == 404


@pytest.mark.django_db
def test_login_logout_and_password_reset(org_a: Org):
    org_a.owner.set_password("correct horse")
    org_a.owner.save()
    c = Client()
    r = c.post(reverse("login"), {"username": "owner@acme.test", "password": "correct horse"})
    assert r.status_code == 302
    r = c.get("/", follow=True)
    assert r.redirect_chain[-1][0] == reverse("dashboard:overview", args=[org_a.slug])
    assert c.post(reverse("logout")).status_code == 302
    assert c.get(reverse("dashboard:overview", args=[org_a.slug])).status_code == 302
    r = c.post(reverse("password_reset"), {"email": "owner@acme.test"})
    assert r.status_code == 302 and len(mail.outbox) == 1 and "/accounts/reset/" in mail.outbox[0].body
