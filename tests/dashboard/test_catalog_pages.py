"""Routes and list prices edited in the dashboard: outsiders get 404 and change nothing, viewers
and non-staff cannot write, bad input is a form error that changes nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from catalog.models import Connection, Model, Route
from tenants.models import AuditLogEntry
from tests.api.conftest import Org

from .test_dashboard import browser


def catalog_state() -> list:
    return [
        sorted(Route.objects.values_list("id", "name", "default_max_output_tokens")),
        sorted(Route.objects.values_list("id", "targets__connection_id", "targets__model_id", "targets__position")),
        sorted(Model.objects.values_list("id", "input_usd_per_mtok", "output_usd_per_mtok", "priority_multiplier")),
        AuditLogEntry.objects.count(),
    ]


def urls(o: Org) -> list[tuple[str, str]]:
    s = o.slug
    return [
        ("get", reverse("dashboard:route_new", args=[s])),
        ("post", reverse("dashboard:route_new", args=[s])),
        ("get", reverse("dashboard:route_edit", args=[s, o.route.id])),
        ("post", reverse("dashboard:route_edit", args=[s, o.route.id])),
        ("post", reverse("dashboard:route_delete", args=[s, o.route.id])),
        ("get", reverse("dashboard:price_new", args=[s])),
        ("post", reverse("dashboard:price_new", args=[s])),
        ("get", reverse("dashboard:price_edit", args=[s, echo_model().id])),
        ("post", reverse("dashboard:price_edit", args=[s, echo_model().id])),
    ]


def echo_model() -> Model:
    return Model.objects.get(provider__slug="echo", name="echo-1")


def route_post(o: Org, **extra) -> dict:
    return {
        "name": "smart",
        "default_max_output_tokens": "900",
        "connection_0": o.connection.id,
        "model_0": echo_model().id,
        **extra,
    }


def price_post(**extra) -> dict:
    return {"input_usd_per_mtok": "3", "output_usd_per_mtok": "15", "per_request_usd": "0", **extra}


@pytest.mark.django_db
def test_outsider_gets_404_and_changes_nothing_even_as_staff(org_a: Org, org_b: Org):
    org_b.owner.is_staff = True
    org_b.owner.save()
    c = browser(org_b.owner)
    before = catalog_state()
    for method, url in urls(org_a):
        payload = {**route_post(org_b), **price_post(model="echo/new-1")}
        assert getattr(c, method)(url, payload).status_code == 404, (method, url)
    assert catalog_state() == before


@pytest.mark.django_db
def test_another_orgs_route_is_404_under_your_own_org(org_a: Org, org_b: Org):
    c = browser(org_a.owner)
    before = catalog_state()
    assert c.get(reverse("dashboard:route_edit", args=[org_a.slug, org_b.route.id])).status_code == 404
    assert (
        c.post(reverse("dashboard:route_edit", args=[org_a.slug, org_b.route.id]), route_post(org_a)).status_code == 404
    )
    assert c.post(reverse("dashboard:route_delete", args=[org_a.slug, org_b.route.id])).status_code == 404
    # and another organization's connection is not a choice
    r = c.post(reverse("dashboard:route_new", args=[org_a.slug]), route_post(org_a, connection_0=org_b.connection.id))
    assert r.status_code == 200 and "connection_0" in r.context["form"].errors
    assert catalog_state() == before


@pytest.mark.django_db
def test_viewer_and_non_staff_owner_cannot_write(org_a: Org, role_users):
    before = catalog_state()
    viewer = browser(role_users["viewer"][0])
    for method, url in urls(org_a):
        assert getattr(viewer, method)(url, {**route_post(org_a), **price_post()}).status_code == 403, url
    owner = browser(org_a.owner)  # an owner of an organization, but not staff: prices are global
    url = reverse("dashboard:price_edit", args=[org_a.slug, echo_model().id])
    assert owner.get(url).status_code == 403
    assert owner.post(url, price_post()).status_code == 403
    assert "price_edit" not in owner.get(reverse("dashboard:connections", args=[org_a.slug])).content.decode()
    assert catalog_state() == before


@pytest.mark.django_db
def test_owner_creates_and_edits_a_route_with_ordered_targets(org_a: Org):
    c = browser(org_a.owner)
    second = Connection.objects.create(organization=org_a.tenant.org, name="backup", kind="echo")
    # when: a new route with two targets, the backup first
    r = c.post(
        reverse("dashboard:route_new", args=[org_a.slug]),
        route_post(org_a, connection_0=second.id, connection_1=org_a.connection.id, model_1=echo_model().id),
    )
    # then
    assert r.status_code == 302
    route = Route.objects.get(organization=org_a.tenant.org, name="smart")
    assert route.default_max_output_tokens == 900
    assert list(route.targets.order_by("position").values_list("connection__name", flat=True)) == ["backup", "echo"]
    # when: edited to one target and no ceiling (the name stays: the form ignores a new one)
    r = c.post(
        reverse("dashboard:route_edit", args=[org_a.slug, route.id]),
        {
            "name": "renamed",
            "default_max_output_tokens": "",
            "connection_0": org_a.connection.id,
            "model_0": echo_model().id,
        },
    )
    assert r.status_code == 302
    route.refresh_from_db()
    assert (route.name, route.default_max_output_tokens) == ("smart", None)
    assert list(route.targets.values_list("connection__name", flat=True)) == ["echo"]
    assert AuditLogEntry.objects.filter(object_type="route", action="update").exists()
    page = c.get(reverse("dashboard:connections", args=[org_a.slug])).content.decode()
    assert "smart" in page and reverse("dashboard:route_edit", args=[org_a.slug, route.id]) in page
    # when: deleted
    assert c.post(reverse("dashboard:route_delete", args=[org_a.slug, route.id])).status_code == 302
    assert not Route.objects.filter(pk=route.pk).exists()


@pytest.mark.parametrize(
    "data,field,message",
    [
        ({"connection_0": "", "model_0": ""}, None, "at least one target"),
        ({"model_0": ""}, "model_0", "both a connection and a model"),
        (
            {"default_max_output_tokens": "0"},
            "default_max_output_tokens",
            "A whole number of tokens from 1 to 1,000,000",
        ),
        ({"name": "echo-1"}, "name", "exists"),
    ],
)
@pytest.mark.django_db
def test_route_form_errors_change_nothing(org_a: Org, data, field, message):
    c = browser(org_a.owner)
    before = catalog_state()
    r = c.post(reverse("dashboard:route_new", args=[org_a.slug]), route_post(org_a, **data))
    assert r.status_code == 200
    errors = r.context["form"].errors.get(field or "__all__")
    assert errors and message in errors[0], r.context["form"].errors
    assert 'class="errorlist' in r.content.decode()
    assert catalog_state() == before


@pytest.mark.django_db
def test_staff_edits_list_prices_including_paid_features(org_a: Org):
    org_a.owner.is_staff = True
    org_a.owner.save()
    c = browser(org_a.owner)
    model = echo_model()
    url = reverse("dashboard:price_edit", args=[org_a.slug, model.id])
    assert url in c.get(reverse("dashboard:connections", args=[org_a.slug])).content.decode()
    assert "web_search_usd_per_use" in c.get(url).content.decode()
    r = c.post(
        url, price_post(priority_multiplier="1.75", web_search_usd_per_use="0.01", server_tool_result_tokens="4000")
    )
    assert r.status_code == 302
    model.refresh_from_db()
    assert (model.input_usd_per_mtok, model.output_usd_per_mtok) == (Decimal(3), Decimal(15))
    assert (model.priority_multiplier, model.web_search_usd_per_use) == (Decimal("1.75"), Decimal("0.01"))
    assert model.server_tool_result_tokens == 4000
    # a new catalog model
    r = c.post(reverse("dashboard:price_new", args=[org_a.slug]), price_post(model="echo/echo-2"))
    assert r.status_code == 302 and Model.objects.get(name="echo-2").output_usd_per_mtok == 15


@pytest.mark.parametrize(
    "data,field",
    [
        ({"input_usd_per_mtok": "-1"}, "input_usd_per_mtok"),
        ({"input_usd_per_mtok": "0.0000001"}, "input_usd_per_mtok"),
        ({"priority_multiplier": "100000"}, "priority_multiplier"),  # wider than the column
        ({"max_output_tokens": "x"}, "max_output_tokens"),
    ],
)
@pytest.mark.django_db
def test_price_form_errors_change_nothing(org_a: Org, data, field):
    org_a.owner.is_staff = True
    org_a.owner.save()
    c = browser(org_a.owner)
    before = catalog_state()
    r = c.post(reverse("dashboard:price_edit", args=[org_a.slug, echo_model().id]), price_post(**data))
    assert r.status_code == 200 and field in r.context["form"].errors
    r = c.post(reverse("dashboard:price_new", args=[org_a.slug]), price_post(model="echo/echo-1"))
    assert r.status_code == 200 and "already" in r.context["form"].errors["model"][0]
    r = c.post(reverse("dashboard:price_new", args=[org_a.slug]), price_post(model="no-slash"))
    assert r.status_code == 200 and "provider/model" in r.context["form"].errors["model"][0]
    assert catalog_state() == before
