"""A connection's base URL, end to end: saved through the API, a base URL with userinfo, a query,
a fragment or a non-public address literal is a 400 naming base_url and nothing is saved; and a
`?` or `#` already stored in one never turns the endpoint's path into a query string on the wire.
Each guard has its removal test."""

from __future__ import annotations

import httpx
import pytest

from catalog import services as catalog_services
from catalog.models import Connection
from gateway.providers import base as providers
from ledger.models import Reservation
from tests.api.conftest import Org, client
from tests.gateway.conftest import KEY, wait_settled

AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
MESSAGES = {
    "model": "claude-test",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 20,
}


def naive_join(base_url: str, path: str) -> str:
    """The join before the fix: string concatenation."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + path


# --- the join, through HTTP against the fake upstream ------------------------------------------

STORED = ["{up}/v1?q=", "{up}/v1?tenant=acme&x=", "{up}/v1/#frag", "{up}?q=", "{up}/#"]


def _store(wired, template: str, upstream) -> None:
    # Stored before the save-time check existed (or straight into the database).
    base = template.format(up=upstream.url)
    Connection.objects.filter(pk=wired.openai.pk).update(base_url=base)
    Connection.objects.filter(pk=wired.anthropic.pk).update(base_url=base)


@pytest.mark.parametrize("template", STORED)
@pytest.mark.django_db(transaction=True)
def test_a_query_or_fragment_in_a_stored_base_url_leaves_the_path_intact(gateway, wired, upstream, template):
    _store(wired, template, upstream)
    # when
    chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    messages = httpx.post(gateway.url + "/v1/messages", json=MESSAGES, headers=AUTH, timeout=30)
    # then: each endpoint's path arrived as itself, and was served
    assert chat.status_code == 200, chat.text
    assert messages.status_code == 200, messages.text
    assert upstream.stats()["by_path"] == {"/v1/chat/completions": 1, "/v1/messages": 1}
    assert upstream.last("/v1/chat/completions")["headers"]["authorization"] == "Bearer sk-up"


@pytest.mark.parametrize("template", STORED)
@pytest.mark.django_db(transaction=True)
def test_join_guard_removed_turns_the_path_into_a_query(gateway, wired, upstream, template, monkeypatch):
    # The removal test of the one above: joined as strings, the endpoint's path lands in the
    # query (or the fragment, which is never sent) and the upstream never sees it.
    monkeypatch.setattr(providers, "connection_url", naive_join)
    _store(wired, template, upstream)
    chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    messages = httpx.post(gateway.url + "/v1/messages", json=MESSAGES, headers=AUTH, timeout=30)
    # the upstream answered 404 naming the truncated path it received ("POST /v1", "POST /", ...)
    for r, path in ((chat, "/v1/chat/completions"), (messages, "/v1/messages")):
        assert r.status_code == 404 and "unknown" in r.text and path not in r.text, r.text
    assert "/v1/chat/completions" not in upstream.stats()["by_path"]
    assert "/v1/messages" not in upstream.stats()["by_path"]


def decoded_join(base_url: str, path: str) -> str:
    """The URL join before the encoded-path fix: built on the decoded path."""
    base = httpx.URL(base_url)
    prefix = base.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[: -len("/v1")]
    return str(base.copy_with(path=prefix + path, query=None, fragment=None))


ESCAPED = ["{up}/v1%3F", "{up}/x%3Fq=", "{up}/x%23frag/v1/"]


@pytest.mark.parametrize("template", ESCAPED)
@pytest.mark.django_db(transaction=True)
def test_an_escaped_query_or_fragment_in_the_path_stays_in_the_path(gateway, wired, upstream, template):
    # A base URL the save-time check accepts (its `?`/`#` are part of the path): the endpoint's
    # path is appended to that path, still escaped, and the call goes out.
    _store(wired, template, upstream)
    prefix = httpx.URL(template.format(up=upstream.url)).path.rstrip("/").removesuffix("/v1")
    chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    # then: the fake upstream has no such path and says which one it got, whole
    assert chat.status_code == 404, chat.text
    assert f"POST {prefix}/v1/chat/completions" in chat.text
    wait_settled()
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("template", ESCAPED)
@pytest.mark.django_db(transaction=True)
def test_escaped_path_guard_removed_is_a_500(gateway, wired, upstream, template, monkeypatch):
    # The removal test of the one above: joined on the decoded path, httpx refuses the URL and
    # every call on the connection is an internal error that never reaches the upstream.
    monkeypatch.setattr(providers, "connection_url", decoded_join)
    _store(wired, template, upstream)
    chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert chat.status_code == 500, chat.text
    assert upstream.stats()["requests"] == 0


# --- the save-time check, through the API ------------------------------------------------------


@pytest.fixture
def public_only(settings):
    """Production's default: no operator networks (the test settings allow loopback)."""
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}


BAD = [
    ("https://user:pw@api.example.com/v1", "user or password"),
    ("https://sk-live@api.example.com/v1", "user or password"),
    ("http://127.0.0.1:9611/internal/admin?q=", "query"),
    ("https://api.example.com/v1?", "query"),
    ("https://api.example.com/v1#frag", "fragment"),
    ("https://api.example.com/v1#", "fragment"),
    ("http://127.0.0.1:9611/", "loopback"),
    ("http://localhost:8080/v1", "loopback"),
    ("http://[::1]:80/", "loopback"),
    ("http://169.254.169.254/latest/", "link-local"),
    ("http://10.0.0.7/", "private"),
    ("http://100.100.100.200/", "not public"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
]


def _post(org: Org, base_url: str):
    return client(token=org.token_write).post(
        f"/api/orgs/{org.slug}/connections/",
        {"name": "up", "kind": "openai", "base_url": base_url, "secret": "sk-x"},
        format="json",
    )


def _connections(org: Org) -> list:
    return sorted(Connection.objects.filter(organization=org.tenant.org).values_list("id", "name", "base_url"))


@pytest.mark.parametrize(("base_url", "reason"), BAD)
@pytest.mark.django_db
def test_bad_base_url_is_a_400_naming_it_and_nothing_is_saved(org_a: Org, public_only, base_url, reason):
    before = _connections(org_a)
    r = _post(org_a, base_url)
    assert r.status_code == 400, r.json()
    body = r.json()
    assert body["code"] == "invalid" and list(body["errors"]) == ["base_url"], body
    assert reason in body["errors"]["base_url"][0]
    assert _connections(org_a) == before
    # and on update: the stored URL stays
    r = client(token=org_a.token_write).patch(
        f"/api/orgs/{org_a.slug}/connections/{org_a.connection.id}/",
        {"kind": "openai", "base_url": base_url},
        format="json",
    )
    assert r.status_code == 400 and list(r.json()["errors"]) == ["base_url"], r.json()
    assert _connections(org_a) == before


@pytest.mark.parametrize(("base_url", "reason"), BAD)
@pytest.mark.django_db
def test_base_url_guard_removed_saves_it(org_a: Org, public_only, monkeypatch, base_url, reason):
    # The removal test of the one above: without the check every one of them is stored.
    monkeypatch.setattr(catalog_services, "_check_destination", lambda url, **kw: None)
    r = _post(org_a, base_url)
    assert r.status_code == 201, r.json()
    assert Connection.objects.get(pk=r.json()["id"]).base_url == base_url


@pytest.mark.django_db
def test_operator_networks_allow_private_literals_and_only_those(org_a: Org, settings):
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": ["10.8.0.0/16"]}
    assert _post(org_a, "http://10.8.1.2:8000/v1").status_code == 201
    r = _post(org_a, "http://10.9.1.2:8000/v1")
    assert r.status_code == 400 and "private" in r.json()["errors"]["base_url"][0]
    # a public host name passes (it is checked on each connect instead)
    r = client(token=org_a.token_write).post(
        f"/api/orgs/{org_a.slug}/connections/",
        {"name": "public", "kind": "openai", "base_url": "https://api.openai.com/v1"},
        format="json",
    )
    assert r.status_code == 201, r.json()
