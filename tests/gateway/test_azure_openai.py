"""An Azure OpenAI connection: capgate calls the deployment with its key (or Entra token) and
api-version, records each request at its cost, streamed or not, and refuses it at the cap
before Azure sees it. The fake Azure format is checked with openai.AzureOpenAI in
tests/upstream/test_azure.py."""

import openai
import pytest

from catalog.models import Connection
from catalog.services import create_connection
from core.errors import InvalidChange
from ledger.models import UsageRecord
from tenants.audit import APPLY
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

DEPLOYMENT = "/openai/deployments/prod-4o/chat/completions"


@pytest.fixture
def azure(wired, upstream) -> Connection:
    """`gpt-azure` routes to the catalog model echo-1 ($15 / $75 per 1M) on an Azure deployment."""
    conn = Connection.objects.create(
        organization=wired.org,
        name="az",
        kind="azure_openai",
        base_url=upstream.url,
        secret="az-key",
        options={"api_version": "2024-10-21", "deployments": {"echo-1": "prod-4o"}, "forward_test_headers": True},
    )
    wired.route("gpt-azure", conn)
    return conn


def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def test_a_request_is_served_by_the_deployment_and_recorded_at_its_cost(gateway, azure, upstream):
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    reply = client(gateway).chat.completions.create(
        model="gpt-azure", messages=[{"role": "user", "content": "hi"}], max_tokens=300
    )

    assert reply.choices[0].message.content and reply.usage.prompt_tokens == 1000
    seen = upstream.last(DEPLOYMENT)
    assert seen["headers"]["api-key"] == "az-key" and "authorization" not in seen["headers"]
    assert seen["query"] == {"api-version": "2024-10-21"}
    wait_settled()
    rec = UsageRecord.objects.get()
    # 1000 in at $15/M + 200 out at $75/M
    assert (rec.status, rec.cost_nano, rec.connection_id) == ("served", 15_000_000 + 15_000_000, azure.id)


def test_a_stream_is_recorded_from_the_usage_chunk_capgate_asks_azure_for(gateway, azure, upstream):
    upstream.control(prompt_tokens=10, completion_tokens=20)

    chunks = list(
        client(gateway).chat.completions.create(
            model="gpt-azure", stream=True, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
    )

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert upstream.last(DEPLOYMENT)["body"]["stream_options"] == {"include_usage": True}
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 10, 20)
    assert rec.cost_nano == 10 * 15_000 + 20 * 75_000


def test_a_request_over_the_cap_is_refused_before_azure_sees_it(gateway, wired, azure, upstream):
    wired.budget(amount="0.01")  # 300 output tokens at $75/M alone is $0.0225
    before = upstream.stats()["requests"]

    with pytest.raises(openai.APIStatusError) as refused:
        client(gateway).chat.completions.create(
            model="gpt-azure", messages=[{"role": "user", "content": "hi"}], max_tokens=300
        )

    assert refused.value.status_code == 402 and refused.value.body["code"] == "organization_budget"
    assert upstream.stats()["requests"] == before
    assert not UsageRecord.objects.exists()


def test_an_entra_connection_sends_its_token_as_a_bearer_token(gateway, azure, upstream):
    azure.options = {**azure.options, "auth": "entra"}
    azure.secret = "entra-access-token"
    azure.save()

    client(gateway).chat.completions.create(
        model="gpt-azure", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )

    headers = upstream.last(DEPLOYMENT)["headers"]
    assert headers["authorization"] == "Bearer entra-access-token" and "api-key" not in headers


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"api_version": "latest"}, "options.api_version"),
        ({"auth": "password"}, "options.auth"),
        ({"deployments": {"gpt-4o": "../admin"}}, "options.deployments"),
    ],
)
def test_bad_azure_options_are_refused_and_nothing_is_created(wired, options, fragment):
    with pytest.raises(InvalidChange, match=fragment):
        create_connection(
            organization=wired.org,
            actor=APPLY,
            name="bad",
            kind="azure_openai",
            base_url="https://x.openai.azure.com",
            options=options,
        )
    assert not Connection.objects.filter(name="bad").exists()
