"""One validation path (issue 11 §4): the same bad value is refused by the management API, the
dashboard form and `manage.py apply` (and, for prices, the price file), with the same message,
and nothing changes on any of them. A value one of them accepts, they all accept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from catalog.models import Connection, Model, Route
from catalog.prices import FIELD_ATTRS, CatalogError, load_catalog
from dashboard.services.apply import ApplyError
from dashboard.services.apply_document import apply_config
from ledger.models import Budget
from ratelimits.models import RateLimit
from tenants.api.fields import flat_errors
from tenants.models import ApiKey
from tests.api.conftest import Org, client

USD_MIN = "Ensure this value is greater than or equal to 0."
PER_MINUTE = "A whole number from 1 to 1,000,000,000,000,000, or empty."
THRESHOLDS = "Whole percentages from 1 to 1000, e.g. 50, 80, 100."
CEILING = "A whole number of tokens from 1 to 1,000,000, or empty."


@dataclass(frozen=True)
class Surfaces:
    """Where a resource is written: the API path, the form's URL name, apply's list."""

    api: str | None
    form: str
    apply: str
    model: Any
    api_base: dict
    form_base: dict
    apply_base: dict


RESOURCES = {
    "budget": Surfaces(
        "budgets",
        "budget_new",
        "budgets",
        Budget,
        {"name": "b", "scope": "organization", "amount_usd": "1"},
        {
            "name": "b",
            "scope": "organization",
            "amount_usd": "1",
            "period": "month",
            "mode": "block",
            "timezone": "UTC",
        },
        {"name": "b", "scope": "organization", "amount_usd": "1"},
    ),
    "rate_limit": Surfaces(
        "rate-limits",
        "rate_limit_new",
        "rate_limits",
        RateLimit,
        {"name": "r", "scope": "organization", "requests_per_minute": 5},
        {"name": "r", "scope": "organization", "requests_per_minute": "5"},
        {"name": "r", "scope": "organization", "requests_per_minute": 5},
    ),
    "route": Surfaces(
        "routes",
        "route_new",
        "routes",
        Route,
        {"name": "r2", "targets": [{"connection": "echo", "model": "echo/echo-1"}]},
        {"name": "r2", "connection_0": "CONNECTION", "model_0": "MODEL"},
        {"name": "r2", "targets": [{"connection": "echo", "model": "echo/echo-1"}]},
    ),
    "connection": Surfaces(
        "connections",
        "connection_new",
        "connections",
        Connection,
        {"name": "c2", "kind": "echo"},
        {"name": "c2", "kind": "echo", "enabled": "on", "options": "{}"},
        {"name": "c2", "kind": "echo"},
    ),
    "key": Surfaces(
        "keys",
        "keys",
        "keys",
        ApiKey,
        {"name": "k2", "project": "main"},
        {"name": "k2", "project": "PROJECT"},
        {"name": "k2", "project": "main"},
    ),
    "price": Surfaces(
        None, "price_new", "prices", Model, {}, {"model": "acme/x", "per_request_usd": "0"}, {"model": "acme/x"}
    ),
}


@dataclass(frozen=True)
class Bad:
    resource: str
    field: str  # the API's and the form's name
    value: Any  # in JSON and in the file
    typed: str | None  # in the form (None: the form cannot express it)
    message: str
    file_field: str | None = None  # apply's path under the item, where it differs

    def __str__(self) -> str:
        return f"{self.resource}.{self.field}={self.value!r}"


CASES = [
    Bad("budget", "amount_usd", "-1", "-1", USD_MIN),
    Bad("budget", "amount_usd", "4611686019", "4611686019", "Ensure this value is less than or equal to 4611686018."),
    Bad("budget", "amount_usd", "1.0000000001", "1.0000000001", "Ensure that there are no more than 9 decimal places."),
    Bad("budget", "amount_usd", "ten", "ten", "Enter a number."),
    Bad("budget", "period", "year", "year", "Period must be one of day, week, month, lifetime."),
    Bad("budget", "mode", "loud", "loud", "Mode must be one of alert, block."),
    Bad("budget", "thresholds", [50, 0], "50, 0", THRESHOLDS, "thresholds[1]"),
    Bad("budget", "thresholds", ["fifty"], "fifty", THRESHOLDS, "thresholds[0]"),
    Bad("budget", "thresholds", [50, 5000], "50, 5000", THRESHOLDS, "thresholds[1]"),
    Bad("budget", "recipients", ["a@b.co", "nope"], "a@b.co, nope", "'nope' is not an email address.", "recipients[1]"),
    Bad("rate_limit", "requests_per_minute", 0, "0", PER_MINUTE),
    Bad("rate_limit", "requests_per_minute", -5, "-5", PER_MINUTE),
    Bad("rate_limit", "tokens_per_minute", "ten", "ten", PER_MINUTE),
    Bad("rate_limit", "requests_per_minute", 1.5, "1.5", PER_MINUTE),
    Bad("rate_limit", "requests_per_minute", 10**15 + 1, str(10**15 + 1), PER_MINUTE),
    Bad("rate_limit", "scope", "galaxy", "galaxy", "Scope must be one of organization, project, key, end_customer."),
    Bad("route", "default_max_output_tokens", 0, "0", CEILING),
    Bad("route", "default_max_output_tokens", 1_000_001, "1000001", CEILING),
    # A target's model is typed in the API and the file; the form offers the catalog's models.
    Bad(
        "route",
        "targets",
        [{"connection": "echo", "model": "nope/missing"}],
        None,
        "Model 'nope/missing' is not in the catalog.",
        "targets[0].model",
    ),
    Bad(
        "route",
        "targets",
        [{"connection": "ghost", "model": "echo/echo-1"}],
        None,
        'No connection "ghost" in this organization.',
        "targets[0].connection",
    ),
    Bad("key", "default_max_output_tokens", 0, "0", CEILING),
    Bad(
        "key",
        "allowed_models",
        ["x" * 201],
        "x" * 201,
        "Ensure this field has no more than 200 characters.",
        "allowed_models[0]",
    ),
    Bad("connection", "input_usd_per_mtok", "-1", "-1", USD_MIN, "rates.input"),
    Bad(
        "connection",
        "output_usd_per_mtok",
        "0.0000001",
        "0.0000001",
        "Ensure that there are no more than 6 decimal places.",
        "rates.output",
    ),
    Bad("connection", "kind", "telnet", "telnet", f"Kind must be one of {', '.join(Connection.Kind.values)}."),
    Bad("price", "input_usd_per_mtok", "-1", "-1", USD_MIN),
    Bad(
        "price", "output_usd_per_mtok", "0.0000001", "0.0000001", "Ensure that there are no more than 6 decimal places."
    ),
    Bad("price", "priority_multiplier", "1.23456", "1.23456", "Ensure that there are no more than 4 decimal places."),
    Bad("price", "max_output_tokens", 0, "0", "Ensure this value is greater than or equal to 1."),
    Bad("price", "max_output_tokens", "x", "x", "Enter a whole number."),
    Bad("price", "tokenizer", "gpt2", "gpt2", "Tokenizer must be one of o200k_base, cl100k_base or null."),
]


def counts() -> dict[str, int]:
    return {s.model.__name__: s.model.objects.count() for s in RESOURCES.values()}


def api_messages(org: Org, bad: Bad) -> list[str]:
    surfaces = RESOURCES[bad.resource]
    r = client(token=org.token_write).post(
        f"/api/orgs/{org.slug}/{surfaces.api}/", {**surfaces.api_base, bad.field: bad.value}, format="json"
    )
    assert r.status_code == 400, r.json()
    return [message for _, message in flat_errors(r.json()["errors"].get(bad.field, []))]


def form_messages(org: Org, bad: Bad) -> list[str]:
    surfaces = RESOURCES[bad.resource]
    c = Client()
    org.owner.is_staff = True  # list prices are staff's
    org.owner.save()
    c.force_login(org.owner)
    data = {**surfaces.form_base, bad.field: bad.typed}
    route = Route.objects.get(organization=org.tenant.org, name="echo-1").targets.get()
    refs = {"CONNECTION": route.connection_id, "MODEL": route.model_id, "PROJECT": org.tenant.project.id}
    data = {k: refs.get(v, v) if isinstance(v, str) else v for k, v in data.items()}
    r = c.post(reverse(f"dashboard:{surfaces.form}", args=[org.slug]), data)
    assert r.status_code == 200, r.content.decode()[:500]
    return list(r.context["form"].errors.get(bad.field, []))


def apply_messages(org: Org, bad: Bad) -> list[tuple[str, str]]:
    surfaces = RESOURCES[bad.resource]
    field = bad.file_field or bad.field
    item = dict(surfaces.apply_base)
    if field.startswith("rates."):
        item["rates"] = {field.removeprefix("rates."): bad.value}
    else:
        item[bad.field] = bad.value
    if bad.resource == "price":
        data: dict = {"prices": [item]}
        where = "prices[0]"
    else:
        data = {"organizations": [{"slug": org.slug, "name": org.tenant.org.name, surfaces.apply: [item]}]}
        where = f"organizations[0].{surfaces.apply}[0]"
    with pytest.raises(ApplyError) as caught:
        apply_config(data=data)
    return [(path.removeprefix(where + "."), message) for path, message in caught.value.problems]


@pytest.mark.parametrize("bad", CASES, ids=str)
@pytest.mark.django_db
def test_the_api_the_form_and_apply_refuse_with_one_message(org_a: Org, bad: Bad):
    before = counts()
    if RESOURCES[bad.resource].api is not None:
        assert bad.message in api_messages(org_a, bad)
    if bad.typed is not None:
        assert bad.message in form_messages(org_a, bad)
    assert apply_messages(org_a, bad) == [(bad.file_field or bad.field, bad.message)]
    assert counts() == before


PRICE_CASES = [bad for bad in CASES if bad.resource == "price"]


@pytest.mark.parametrize("bad", PRICE_CASES, ids=str)
@pytest.mark.django_db
def test_the_price_file_refuses_a_price_with_the_same_message(bad: Bad):
    key = {attr: key for key, attr in FIELD_ATTRS.items()}[bad.field]
    model = {"provider": "acme", "name": "x", "input": "1", "output": "1", key: bad.value}
    with pytest.raises(CatalogError) as caught:
        load_catalog(
            data={"prices_as_of": "2026-12-01", "providers": [{"slug": "acme", "name": "Acme"}], "models": [model]},
            overwrite=True,
        )
    assert [(p.model, p.field, p.message) for p in caught.value.problems] == [("acme/x", key, bad.message)]
    assert not Model.objects.exists()


GOOD = [
    # Over $4.61: the API once compared the nano-USD int with the USD bound and refused it.
    ("budget", "amount_usd", "5000", "5000"),
    ("budget", "amount_usd", "4611686018", "4611686018"),
    ("budget", "thresholds", [1, 1000], "1, 1000%"),
    ("rate_limit", "requests_per_minute", 10**15, str(10**15)),
    ("route", "default_max_output_tokens", 1_000_000, "1000000"),
]


@pytest.mark.parametrize(("resource", "field", "value", "typed"), GOOD)
@pytest.mark.django_db
def test_a_value_one_accepts_they_all_accept(org_a: Org, resource, field, value, typed):
    surfaces = RESOURCES[resource]
    model = surfaces.model
    r = client(token=org_a.token_write).post(
        f"/api/orgs/{org_a.slug}/{surfaces.api}/", {**surfaces.api_base, field: value}, format="json"
    )
    assert r.status_code == 201, r.json()
    model.objects.filter(pk=r.json()["id"]).delete()
    c = Client()
    c.force_login(org_a.owner)
    route = Route.objects.get(organization=org_a.tenant.org, name="echo-1").targets.get()
    data = {
        k: {"CONNECTION": route.connection_id, "MODEL": route.model_id}.get(v, v)
        for k, v in {**surfaces.form_base, field: typed}.items()
    }
    r = c.post(reverse(f"dashboard:{surfaces.form}", args=[org_a.slug]), data)
    assert r.status_code == 302, r.context["form"].errors
    created = model.objects.order_by("-pk").first()
    created.delete()
    apply_config(
        data={
            "organizations": [
                {
                    "slug": org_a.slug,
                    "name": org_a.tenant.org.name,
                    surfaces.apply: [{**surfaces.apply_base, field: value}],
                }
            ]
        }
    )
    assert model.objects.filter(name=surfaces.apply_base["name"]).exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kind", "pager", "Kind must be one of email, webhook."),
        ("payload_format", "xml", "Payload format must be one of capgate, slack."),
    ],
)
@pytest.mark.django_db
def test_an_alert_channel_is_refused_alike_by_the_api_and_the_form(org_a: Org, field, value, message):
    # Alert channels are not in apply's file; the API and the page share the field.
    from alerts.alert_models import AlertChannel

    data = {"name": "ops", "kind": "email", "emails": ["ops@acme.test"], "payload_format": "capgate", field: value}
    r = client(token=org_a.token_write).post(f"/api/orgs/{org_a.slug}/alert-channels/", data, format="json")
    assert r.status_code == 400 and r.json()["errors"][field] == [message], r.json()
    c = Client()
    c.force_login(org_a.owner)
    r = c.post(reverse("dashboard:alert_channel_new", args=[org_a.slug]), {**data, "emails": "ops@acme.test"})
    assert r.status_code == 200 and r.context["form"].errors[field] == [message]
    assert not AlertChannel.objects.exists()
