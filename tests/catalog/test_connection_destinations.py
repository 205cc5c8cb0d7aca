"""A connection's base URL: refused with a clear error when it carries userinfo, a query or a
fragment, or names a non-public address; and the endpoint path is joined as a URL."""

import pytest

from catalog import services
from catalog.models import Connection
from core.errors import InvalidChange
from gateway.admission.routing import Target
from gateway.providers import upstream_url
from tenants.audit import Actor

ACTOR = Actor(label="test")


@pytest.fixture
def public_only(settings):
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://127.0.0.1:9611/internal/admin?q=", "query"),
        ("https://api.example.com/v1#frag", "fragment"),
        ("https://user:pw@api.example.com/v1", "user or password"),
        ("http://127.0.0.1:9611/", "loopback"),
        ("http://localhost:8080/", "loopback"),
        ("http://169.254.169.254/latest/", "link-local"),
        ("http://[::1]:80/", "loopback"),
        ("http://10.0.0.7/", "private"),
    ],
)
def test_bad_base_urls_are_refused_and_nothing_is_saved(acme, public_only, url, message):
    with pytest.raises(InvalidChange, match=message) as info:
        services.create_connection(organization=acme.org, actor=ACTOR, name="x", kind="openai", base_url=url)
    assert info.value.param == "base_url"
    assert not Connection.objects.exists()


def test_public_hosts_and_operator_networks_are_accepted(acme, settings):
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": ["10.0.0.0/8"]}
    services.create_connection(
        organization=acme.org, actor=ACTOR, name="a", kind="openai", base_url="https://api.openai.com/v1"
    )
    services.create_connection(
        organization=acme.org, actor=ACTOR, name="b", kind="openai", base_url="http://10.0.0.7:8000/v1"
    )
    assert Connection.objects.count() == 2


def test_the_endpoint_path_is_joined_as_a_url_not_a_string(acme):
    # a base URL stored before validation existed: its query cannot swallow the endpoint's path
    conn = Connection(organization=acme.org, name="old", kind="openai", base_url="http://h.example/api?q=")
    assert upstream_url(Target(connection=conn, model=None), "chat") == "http://h.example/api/v1/chat/completions"
    conn.base_url = "https://h.example/v1/"
    assert upstream_url(Target(connection=conn, model=None), "messages") == "https://h.example/v1/messages"
