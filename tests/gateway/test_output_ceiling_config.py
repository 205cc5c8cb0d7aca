"""Default output ceilings per key and per route, declared through the API, the dashboard and
`manage.py apply`, reach the gateway; bad values get each surface's own error and change nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from catalog.models import Connection, Model, Provider, Route, RouteTarget
from dashboard.services.apply_document import apply_config
from tenants.models import ApiKey, Member
from tests.conftest import make_api_token, make_tenant


@pytest.fixture
def owner_client(client, acme, alice):
    Member.objects.create(organization=acme.org, user=alice, role="owner")
    client.force_login(alice)
    return client


def _token(tenant, scope="write") -> str:
    return make_api_token(organization=tenant.org, scope=scope, name="t")


def test_api_sets_and_clears_a_keys_output_ceiling_and_refuses_bad_values(client, acme):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {_token(acme)}"}
    url = f"/api/orgs/{acme.org.slug}/keys/{acme.key.id}/"
    resp = client.patch(url, {"default_max_output_tokens": 500}, content_type="application/json", **auth)
    assert resp.status_code == 200, resp.content
    assert resp.json()["default_max_output_tokens"] == 500
    resp = client.patch(url, {"default_max_output_tokens": 0}, content_type="application/json", **auth)
    assert resp.status_code == 400
    assert "default_max_output_tokens" in resp.json()["errors"]
    acme.key.refresh_from_db()
    assert acme.key.default_max_output_tokens == 500
    resp = client.patch(url, {"default_max_output_tokens": None}, content_type="application/json", **auth)
    assert resp.json()["default_max_output_tokens"] is None


def test_outsider_cannot_touch_another_orgs_key_ceiling(client, acme, outsider):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {_token(outsider)}"}
    resp = client.patch(
        f"/api/orgs/{acme.org.slug}/keys/{acme.key.id}/",
        {"default_max_output_tokens": 5},
        content_type="application/json",
        **auth,
    )
    assert resp.status_code in (403, 404)
    acme.key.refresh_from_db()
    assert acme.key.default_max_output_tokens is None


def test_dashboard_key_form_sets_the_ceiling_and_shows_a_form_error_for_a_bad_one(owner_client, acme):
    url = reverse("dashboard:keys", args=[acme.org.slug])
    data = {"name": "bounded", "project": acme.project.id, "default_max_output_tokens": 300}
    assert owner_client.post(url, data).status_code == 200
    assert ApiKey.objects.get(name="bounded").default_max_output_tokens == 300
    resp = owner_client.post(url, {**data, "name": "bad", "default_max_output_tokens": -4})
    assert "errorlist" in resp.content.decode()
    assert not ApiKey.objects.filter(name="bad").exists()


def test_apply_declares_key_and_route_ceilings(db):
    doc = {
        "organizations": [
            {
                "slug": "decl",
                "name": "Decl",
                "projects": [{"slug": "main", "name": "Main"}],
                "keys": [{"name": "k", "project": "main", "default_max_output_tokens": 256}],
                "connections": [{"name": "echo", "kind": "echo"}],
                "routes": [
                    {
                        "name": "fast",
                        "default_max_output_tokens": 128,
                        "targets": [{"connection": "echo", "model": "echo/echo-1"}],
                    }
                ],
            }
        ]
    }
    from catalog.prices import DEFAULT_CATALOG_PATH, load_catalog, read_catalog

    load_catalog(data=read_catalog(DEFAULT_CATALOG_PATH), overwrite=False)
    apply_config(data=doc)
    assert ApiKey.objects.get(name="k").default_max_output_tokens == 256
    assert Route.objects.get(name="fast").default_max_output_tokens == 128
    doc["organizations"][0]["routes"][0]["default_max_output_tokens"] = 0
    with pytest.raises(Exception, match="1 to 1,000,000"):
        apply_config(data=doc)
    assert Route.objects.get(name="fast").default_max_output_tokens == 128


def test_api_sets_a_routes_output_ceiling(client, db):
    t = make_tenant("routes")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {_token(t)}"}
    route = Route.objects.create(organization=t.org, name="r")
    model = Model.objects.create(provider=Provider.objects.create(slug="p", name="P"), name="m")
    RouteTarget.objects.create(
        route=route,
        model=model,
        position=0,
        connection=Connection.objects.create(organization=t.org, name="e", kind="echo"),
    )
    resp = client.patch(
        f"/api/orgs/{t.org.slug}/routes/{route.id}/",
        {"default_max_output_tokens": 64},
        content_type="application/json",
        **auth,
    )
    assert resp.status_code == 200, resp.content
    route.refresh_from_db()
    assert route.default_max_output_tokens == 64
    assert resp.json()["targets"] == [{"connection": route.targets.get().connection_id, "model": "p/m"}]
