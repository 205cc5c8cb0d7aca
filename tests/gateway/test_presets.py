"""OpenAI-compatible presets (catalog/presets.py): a connection of a preset kind needs only its key;
capgate calls the preset's base URL with the preset's model naming, headers and output-ceiling
parameter, records each request at its cost and refuses it at the cap. Each preset is selectable
where a connection is created (API, apply, dashboard form), and the preset's own base URL goes
through the destination rules."""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest
from django.urls import reverse

from catalog.models import Connection, Model, Provider
from catalog.presets import PRESETS, upstream_model
from catalog.services import create_connection
from core.errors import InvalidChange
from dashboard.services.apply_document import apply_config
from gateway.admission.routing import Target
from gateway.providers import adapter_for, upstream_url
from ledger.models import UsageRecord
from tenants.audit import APPLY
from tests.api.conftest import Org, client, org_a  # noqa: F401 — the API cast's fixture
from tests.dashboard.test_dashboard import browser
from tests.gateway.conftest import KEY, wait_settled

CHAT = "/v1/chat/completions"


def test_every_preset_is_a_connection_kind_with_an_adapter():
    for kind, preset in PRESETS.items():
        assert kind in Connection.Kind.values
        found = adapter_for(kind)
        assert found is not None and found.endpoints == preset.endpoints
    # and every kind a connection can have is served by an adapter
    assert {k for k in Connection.Kind.values if adapter_for(k) is None} == set()


def test_model_naming_follows_the_preset():
    assert upstream_model(PRESETS["groq"], provider_slug="groq", name="llama-3.3-70b-versatile") == (
        "llama-3.3-70b-versatile"
    )
    assert upstream_model(PRESETS["openrouter"], provider_slug="mistral", name="mistral-large") == (
        "mistralai/mistral-large"
    )
    assert upstream_model(PRESETS["openrouter"], provider_slug="x", name="meta-llama/llama-4") == "meta-llama/llama-4"
    assert upstream_model(PRESETS["fireworks"], provider_slug="fireworks", name="deepseek-v3p2") == (
        "accounts/fireworks/models/deepseek-v3p2"
    )


def test_a_connection_without_a_base_url_calls_the_presets_endpoint():
    conn = Connection(kind="groq", base_url="")
    target = Target(connection=conn, model=Model(name="llama-3.3-70b-versatile"))
    assert upstream_url(target, "chat") == "https://api.groq.com/openai/v1/chat/completions"
    conn.kind = "fireworks"
    assert upstream_url(target, "chat") == "https://api.fireworks.ai/inference/v1/chat/completions"


@pytest.fixture
def presets(wired, upstream):
    """`mixtral` on a Mistral connection and `or-mixtral` on an OpenRouter one, both to the fake;
    the catalog model mistral/mixtral-8x7b at $0.70 / $0.70 per 1M."""
    provider = Provider.objects.create(slug="mistral", name="Mistral")
    model = Model.objects.create(
        provider=provider,
        name="mixtral-8x7b",
        input_usd_per_mtok=Decimal("0.7"),
        output_usd_per_mtok=Decimal("0.7"),
        max_output_tokens=4096,
    )
    options = {"forward_test_headers": True}
    mistral = create_connection(
        organization=wired.org, actor=APPLY, name="mi", kind="mistral", base_url=upstream.url + "/v1", options=options
    )
    router = create_connection(
        organization=wired.org,
        actor=APPLY,
        name="or",
        kind="openrouter",
        base_url=upstream.url + "/v1",
        secret="sk-or",
        options={**options, "app_url": "https://capgate.example", "app_name": "capgate"},
    )
    wired.route("mixtral", mistral, model=model)
    wired.route("or-mixtral", router, model=model)
    return mistral, router


def gpt(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


@pytest.mark.django_db(transaction=True)
def test_a_preset_connection_is_served_with_its_output_parameter_and_recorded(
    gateway, wired, presets, upstream, slices_mode
):
    # given: a blocking cap, and a request naming no output ceiling: capgate picks one
    wired.budget(amount="10")
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    reply = gpt(gateway).chat.completions.create(model="mixtral", messages=[{"role": "user", "content": "hi"}])

    assert reply.choices[0].message.content
    seen = upstream.last(CHAT)["body"]
    # Mistral takes max_tokens; the model is the catalog's name, as Mistral names it
    assert seen["model"] == "mixtral-8x7b" and "max_tokens" in seen and "max_completion_tokens" not in seen
    wait_settled()
    assert UsageRecord.objects.get().cost_nano == 1200 * 700


@pytest.mark.django_db(transaction=True)
def test_openrouter_gets_the_vendor_model_name_and_its_attribution_headers(gateway, presets, upstream):
    gpt(gateway).chat.completions.create(
        model="or-mixtral", messages=[{"role": "user", "content": "hi"}], max_tokens=10
    )

    seen = upstream.last(CHAT)
    assert seen["body"]["model"] == "mistralai/mixtral-8x7b"
    headers = seen["headers"]
    assert headers["authorization"] == "Bearer sk-or" and headers["http-referer"] == "https://capgate.example"
    assert headers["x-title"] == "capgate"


@pytest.mark.django_db(transaction=True)
def test_a_preset_request_over_the_cap_is_refused_before_the_provider_sees_it(
    gateway, wired, presets, upstream, slices_mode
):
    wired.budget(amount="0.0001")  # 1000 output tokens at $0.70/M alone is $0.0007
    before = upstream.stats()["requests"]

    with pytest.raises(openai.APIStatusError) as refused:
        gpt(gateway).chat.completions.create(
            model="mixtral", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
        )

    assert refused.value.status_code == 402 and refused.value.body["code"] == "organization_budget"
    assert upstream.stats()["requests"] == before
    assert not UsageRecord.objects.exists()


@pytest.mark.django_db
def test_a_local_presets_default_address_goes_through_the_destination_rules(acme, settings):
    # given: no network allowed for self-hosted models
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": []}
    with pytest.raises(InvalidChange, match="default base URL") as refused:
        create_connection(organization=acme.org, actor=APPLY, name="local", kind="ollama")
    assert refused.value.param == "base_url" and not Connection.objects.exists()
    # when the operator allows it, the preset's address is accepted
    settings.CAPGATE = {**settings.CAPGATE, "UPSTREAM_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    create_connection(organization=acme.org, actor=APPLY, name="local", kind="ollama")
    assert Connection.objects.get().kind == "ollama"


@pytest.mark.django_db
def test_a_header_option_that_could_break_a_header_is_refused(acme):
    with pytest.raises(InvalidChange, match="options.app_name"):
        create_connection(
            organization=acme.org, actor=APPLY, name="or", kind="openrouter", options={"app_name": "a\r\nx-evil: 1"}
        )


@pytest.mark.django_db
def test_a_preset_is_selectable_in_the_api_apply_and_the_dashboard_form(org_a: Org):  # noqa: F811
    # the API
    c = client(token=org_a.token_write)
    r = c.post(f"/api/orgs/{org_a.slug}/connections/", {"name": "groq", "kind": "groq", "secret": "gsk"}, format="json")
    assert r.status_code == 201, r.json()
    # apply
    apply_config(
        data={
            "organizations": [
                {"slug": org_a.slug, "connections": [{"name": "ds", "kind": "deepseek", "secret": "sk-ds"}]}
            ]
        }
    )
    # the dashboard form
    page = browser(org_a.owner).get(reverse("dashboard:connection_new", args=[org_a.slug])).content.decode()
    assert 'value="xai"' in page and 'value="bedrock"' in page and 'value="vertex"' in page
    r = browser(org_a.owner).post(
        reverse("dashboard:connection_new", args=[org_a.slug]),
        {"name": "tg", "kind": "together", "secret": "tk", "options": "{}", "enabled": "on"},
    )
    assert r.status_code == 302
    kinds = dict(Connection.objects.filter(organization=org_a.tenant.org).values_list("name", "kind"))
    assert (kinds["groq"], kinds["ds"], kinds["tg"]) == ("groq", "deepseek", "together")
