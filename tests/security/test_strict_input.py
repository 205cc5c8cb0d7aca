"""No request shape gives a 5xx: a content part whose `type` is not a string, a NUL character
anywhere a string can reach SQL (a JSON string, a path, a query string, a form field), a number
written in other than ASCII digits and a money amount written as anything but ASCII digits with at
most one decimal point are each refused with a 4xx in the endpoint's own shape, and change nothing.
Through the gateway (OpenAI's and Anthropic's shapes), the management API and the dashboard."""

from __future__ import annotations

import httpx
import pytest
from django.urls import reverse

from core.money import usd_to_nano
from ledger.models import Budget, Reservation, UsageRecord
from tests.api.conftest import Org, client
from tests.dashboard.test_dashboard import browser, pages
from tests.gateway.conftest import KEY

AUTH = {"authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi"}]


def _part(kind: object) -> list:
    return [{"role": "user", "content": [{"type": kind, "text": "hi"}]}]


def post(gateway, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(gateway.url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=30)


def assert_openai_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and err["type"], err
    return err


def assert_anthropic_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]


def assert_nothing_held() -> None:
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()


# --- the gateway: content parts ------------------------------------------------------------------

CHAT = {"model": "echo-1", "max_tokens": 5}
PART_TYPES = [
    ("/v1/chat/completions", {**CHAT, "messages": _part([])}, "openai", "messages[0].content[0].type"),
    ("/v1/messages", {**CHAT, "messages": _part([])}, "anthropic", "messages[0].content[0].type"),
    ("/v1/messages", {**CHAT, "messages": HI, "system": [{"type": [], "text": "hi"}]}, "anthropic", "system[0].type"),
    ("/v1/messages", {**CHAT, "messages": _part({"a": 1})}, "anthropic", "messages[0].content[0].type"),
    (
        "/v1/messages",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": [{"type": [1]}]}]}]},
        "anthropic",
        "messages[0].content[0].content[0].type",
    ),
    (
        "/v1/responses",
        {"model": "echo-1", "max_output_tokens": 5, "input": _part([])},
        "openai",
        "input[0].content[0].type",
    ),
    ("/v1/messages/count_tokens", {"model": "echo-1", "messages": _part([])}, "anthropic", None),
    ("/v1/reservations", {**CHAT, "messages": _part([])}, "openai", "messages[0].content[0].type"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("path", "body", "flavor", "param"), PART_TYPES)
def test_a_content_part_type_that_is_not_a_string_is_a_400(gateway, wired, path, body, flavor, param):
    # when: a part's (or a nested part's) type is a list or an object
    r = post(gateway, path, body)
    # then: a 400 in the endpoint's shape naming where, not a 500; nothing reserved
    if flavor == "anthropic":
        err = assert_anthropic_error(r, 400, "invalid_request")
        assert "type must be a string" in err["message"], err
    else:
        err = assert_openai_error(r, 400, "invalid_request")
        assert err["param"] == param, err
    if param and flavor == "anthropic":
        assert err["message"].startswith(param), err
    assert_nothing_held()


# --- the gateway: NUL ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("path", "body", "flavor"),
    [
        ("/v1/chat/completions", {**CHAT, "model": "a\u0000b", "messages": HI}, "openai"),
        ("/v1/messages", {**CHAT, "model": "a\u0000b", "messages": HI}, "anthropic"),
        ("/v1/messages", {**CHAT, "messages": HI, "metadata": {"user_id": "\u0000"}}, "anthropic"),
        ("/v1/responses", {"model": "echo-1", "input": "hi", "user": "x\u0000"}, "openai"),
        ("/v1/messages/count_tokens", {"model": "a\u0000", "messages": HI}, "anthropic"),
        ("/v1/reservations", {**CHAT, "messages": HI, "request_id": "a\u0000b"}, "openai"),
        ("/v1/reservations", {**CHAT, "messages": HI, "\u0000": 1}, "openai"),
    ],
)
def test_a_nul_in_a_json_string_is_a_400_not_an_outage(gateway, wired, path, body, flavor):
    # A 503 budget_unavailable would be retried by the SDKs as an outage; this is the caller's.
    r = post(gateway, path, body)
    if flavor == "anthropic":
        assert_anthropic_error(r, 400, "nul_character")
    else:
        assert_openai_error(r, 400, "nul_character")
    assert r.headers["x-should-retry"] == "false"
    assert_nothing_held()


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_a_gateway_path_is_a_404_and_in_its_query_a_400(gateway, wired):
    get = lambda path: httpx.get(gateway.url + path, headers=AUTH, timeout=30)  # noqa: E731
    assert_openai_error(get("/v1/responses/resp_x%00"), 404, "not_found")
    r = httpx.post(gateway.url + "/v1/reservations/r%00/settle", json={}, headers=AUTH, timeout=30)
    assert_openai_error(r, 404, "not_found")
    assert_anthropic_error(get("/v1/messages/batches/b%00"), 404, "not_found")
    assert_openai_error(get("/v1/files?after=file-%00"), 400, "nul_character")
    assert_anthropic_error(get("/v1/messages/batches?after_id=%00"), 400, "nul_character")
    # the same lists without the NUL answer
    assert get("/v1/files?after=file-x").status_code == 200
    assert get("/v1/files?limit=%C2%B2").status_code == 400  # a superscript two is not a number


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_an_uploaded_form_field_is_a_400(gateway, wired):
    r = httpx.post(
        gateway.url + "/v1/files",
        headers=AUTH,
        data={"purpose": "batch\u0000"},
        files={"file": ("b\u0000.jsonl", b"{}", "application/jsonl")},
        timeout=30,
    )
    assert_openai_error(r, 400, "nul_character")


# --- the gateway: money headers and fields -------------------------------------------------------

NOT_MONEY = ["1_000", "1e3", "1E3", "+5", "5 0", "NaN", "Infinity", "0x10", "\u0661", "5.5.5", ".", "", "1,000"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("amount", NOT_MONEY)
def test_a_run_budget_header_is_ascii_digits_and_one_point(gateway, wired, amount):
    # httpx sends header values as latin-1: the Arabic-Indic digit goes as its UTF-8 bytes.
    value = amount.encode() if not amount.isascii() else amount
    r = post(
        gateway,
        "/v1/chat/completions",
        {**CHAT, "messages": HI},
        {"x-capgate-run": "run-1", "x-capgate-run-budget-usd": value},
    )
    assert_openai_error(r, 400, "invalid_run_budget")
    assert not Budget.objects.filter(scope=Budget.Scope.RUN).exists()
    assert_nothing_held()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("amount", ["1000", "0.5", ".5", "5."])
def test_a_run_budget_header_in_plain_digits_is_accepted(gateway, wired, amount):
    r = post(
        gateway,
        "/v1/chat/completions",
        {**CHAT, "messages": HI},
        {"x-capgate-run": "run-1", "x-capgate-run-budget-usd": amount},
    )
    assert r.status_code == 200, r.text
    assert Budget.objects.get(scope=Budget.Scope.RUN).amount_nano == usd_to_nano(amount)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("amount", ["1_000", "1e2", "-1", "١"])
def test_a_reservation_amount_is_ascii_digits_and_one_point(gateway, wired, amount):
    r = post(gateway, "/v1/reservations", {"model": "echo-1", "amount_usd": amount})
    err = assert_openai_error(r, 400, "invalid_request")
    assert err["param"] == "amount_usd"
    assert_nothing_held()


# --- the management API --------------------------------------------------------------------------


def api_get(org: Org, path: str):
    return client(token=org.token_read).get(f"/api/orgs/{org.slug}/{path}")


@pytest.mark.django_db
def test_a_nul_in_an_api_query_is_a_400_in_the_api_shape(org_a: Org):
    r = api_get(org_a, "budgets/?scope=%00")
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "nul_character" and r.json()["detail"] and r.json()["errors"] == {}
    assert api_get(org_a, "budgets/?scope=organization").status_code == 200


@pytest.mark.django_db
def test_a_nul_in_an_api_path_is_a_404_in_the_api_shape(org_a: Org):
    r = api_get(org_a, f"budgets/{org_a.budget.id}%00/")
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.content
    r = client(token=org_a.token_read).get("/api/orgs/acme%00/budgets/")
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.content


@pytest.mark.django_db
def test_a_nul_in_an_api_body_is_a_400_naming_its_field(org_a: Org):
    before = Budget.objects.count()
    r = client(token=org_a.token_write).post(
        f"/api/orgs/{org_a.slug}/budgets/",
        {"name": "a\u0000", "scope": "organization", "amount_usd": "1"},
        format="json",
    )
    # named as any bad field is
    assert r.status_code == 400 and r.json()["code"] == "invalid", r.content
    assert "NUL" in r.json()["errors"]["name"][0]
    assert Budget.objects.count() == before
    r = client(token=org_a.token_write).post(f"/api/orgs/{org_a.slug}/budgets/", {"\u0000": 1}, format="json")
    assert r.status_code == 400 and r.json()["code"] == "nul_character", r.content


@pytest.mark.django_db
def test_a_project_filter_is_ascii_digits(org_a: Org):
    r = api_get(org_a, "end-customers/?project=%C2%B2")  # "²": str.isdigit() says yes, int() no
    assert r.status_code == 400 and r.json()["errors"]["project"], r.content
    r = api_get(org_a, f"end-customers/?project={org_a.tenant.project.id}")
    assert r.status_code == 200 and r.json()["results"], r.content


@pytest.mark.django_db
@pytest.mark.parametrize("amount", ["1_000", "1e3", "١", "+5"])
def test_an_api_usd_field_is_ascii_digits_and_one_point(org_a: Org, amount):
    r = client(token=org_a.token_write).patch(
        f"/api/orgs/{org_a.slug}/budgets/{org_a.budget.id}/", {"amount_usd": amount}, format="json"
    )
    assert r.status_code == 400 and r.json()["errors"]["amount_usd"], r.content
    org_a.budget.refresh_from_db()
    assert org_a.budget.amount_nano == usd_to_nano("5")


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["1_0", "\u0661", "\u00b2"])
def test_an_api_whole_number_field_is_ascii_digits(org_a: Org, value):
    r = client(token=org_a.token_write).post(
        f"/api/orgs/{org_a.slug}/rate-limits/",
        {"name": "rl", "scope": "organization", "requests_per_minute": value},
        format="json",
    )
    assert r.status_code == 400 and r.json()["errors"]["requests_per_minute"], r.content


# Every query parameter of every list in the API's schema, given a NUL, non-ASCII digits and
# Python-only number syntax: a 4xx or an answer, never a 5xx.
# Filters views read from the query without a schema entry, tried on every list too.
VIEW_FILTERS = {"scope", "project", "limit", "offset"}
ODD_QUERY_VALUES = ["\u0000", "a\u0000b", "\u00b2", "\u0661\u0662", "1_000", "1e3", "-1", "NaN"]


@pytest.mark.django_db
def test_no_api_query_parameter_answers_5xx(org_a: Org):
    from drf_spectacular.generators import SchemaGenerator

    spec = SchemaGenerator().get_schema(request=None, public=True)
    api = client(token=org_a.token_read)
    tried = 0
    for path, operations in spec["paths"].items():
        get = operations.get("get")
        if not get or not path.startswith("/api/orgs/{org_slug}/") or "{" in path.removeprefix("/api/orgs/{org_slug}"):
            continue  # the lists of an organization
        names = {p["name"] for p in get.get("parameters", []) if p["in"] == "query"} | VIEW_FILTERS
        url = path.replace("{org_slug}", org_a.slug)
        for name in sorted(names):
            for value in ODD_QUERY_VALUES:
                r = api.get(url, {name: value})
                assert r.status_code < 500, (url, name, value, r.status_code, r.content[:200])
                if r.status_code >= 400:
                    assert r.json()["code"] and "detail" in r.json(), (url, name, value)
                tried += 1
    assert tried > 50, tried


# --- the dashboard, as a viewer ------------------------------------------------------------------


@pytest.mark.django_db
def test_the_reported_dashboard_urls_are_400_or_404_for_a_viewer(org_a: Org, role_users):
    c = browser(role_users["viewer"][0])
    s = org_a.slug
    assert c.get(f"/o/{s}/projects/?q=a%00").status_code == 400
    assert c.get(f"/o/{s}/budgets/?tab=runs&q=%00x").status_code == 400
    assert c.get(f"/o/{s}/requests/x%00/").status_code == 404
    assert c.get("/switch/?org=a%00").status_code == 400
    # without the NUL the same pages answer
    assert c.get(f"/o/{s}/projects/?q=a").status_code == 200
    assert c.get(f"/o/{s}/budgets/?tab=runs&q=x").status_code == 200


@pytest.mark.django_db
def test_no_dashboard_page_answers_5xx_to_odd_query_values(org_a: Org, role_users):
    c = browser(role_users["viewer"][0])
    params = ("q", "page", "tab", "by", "org", "project", "api_key", "model", "status", "since", "until", "all")
    for method, url in pages(org_a):
        if method != "get":
            continue
        for value in ODD_QUERY_VALUES:
            query = {name: value for name in params}
            r = c.get(url, query)
            assert r.status_code < 500, (url, value, r.status_code)
            # a viewer may not open an editor (403), the charts refuse a bad filter (400); a NUL
            # anywhere in the query is a 400
            assert r.status_code in ((400,) if "\u0000" in value else (200, 400, 403)), (url, value, r.status_code)
            r = c.get(url, {**query, "tab": "runs"})
            assert r.status_code < 500, (url, value, r.status_code)


@pytest.mark.django_db
def test_a_nul_in_a_dashboard_form_is_a_400_and_changes_nothing(org_a: Org):
    before = Budget.objects.count()
    c = browser(org_a.owner)
    r = c.post(
        reverse("dashboard:budget_new", args=[org_a.slug]),
        {"name": "a\u0000", "scope": "organization", "amount_usd": "1"},
    )
    assert r.status_code == 400
    assert Budget.objects.count() == before
