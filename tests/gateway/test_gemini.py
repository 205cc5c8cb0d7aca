"""A Gemini connection: capgate calls the Gemini API's OpenAI-compatible endpoint with the API key
as a bearer token, records each request at the genai-prices catalog's price for the Gemini model,
streamed or not and thinking tokens included, and refuses it at the cap before Gemini sees it.
The fake Gemini format is checked with the openai SDK in tests/upstream/test_gemini.py."""

import datetime
from decimal import Decimal

import openai
import pytest
from genai_prices.data import providers as genai_providers

from catalog.genai import model_entry
from catalog.models import Connection, Model
from catalog.prices import load_catalog
from ledger.models import UsageRecord
from tests.gateway.conftest import KEY, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1beta/openai/chat/completions"
MODEL = "gemini-2.5-flash"


def load_gemini_price() -> Model:
    """gemini-2.5-flash as `manage.py load_prices` loads it from genai-prices."""
    google = next(p for p in genai_providers if p.id == "google")
    info = next(m for m in google.models if m.id == MODEL)
    entry = model_entry(info, datetime.datetime.now(datetime.UTC))
    entry.pop("_own_image_price", None)
    load_catalog(
        data={
            "prices_as_of": datetime.date.today().isoformat(),
            "source": "genai-prices",
            "providers": [{"slug": "google", "name": google.name}],
            "models": [{"provider": "google", "name": MODEL, **entry}],
        },
        overwrite=False,
    )
    return Model.objects.get(provider__slug="google", name=MODEL)


@pytest.fixture
def gemini(wired, upstream) -> Connection:
    """`flash` routes to gemini-2.5-flash on a Gemini connection to the fake."""
    model = load_gemini_price()
    conn = Connection.objects.create(
        organization=wired.org,
        name="gem",
        kind="gemini",
        base_url=upstream.url + "/v1beta/openai/",
        secret="gemini-key",
        options={"forward_test_headers": True},
    )
    wired.route("flash", conn, model=model)
    return conn


def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def test_a_request_is_served_by_gemini_and_recorded_at_the_catalog_price(gateway, gemini, upstream):
    upstream.control(prompt_tokens=1000, completion_tokens=200)

    reply = client(gateway).chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "hi"}], max_tokens=300
    )

    assert reply.choices[0].message.content and reply.usage.prompt_tokens == 1000
    seen = upstream.last(CHAT)
    assert seen["headers"]["authorization"] == "Bearer gemini-key" and seen["body"]["model"] == MODEL
    wait_settled()
    rec = UsageRecord.objects.get()
    model = Model.objects.get(name=MODEL)
    # genai-prices' price for the model
    assert (model.input_usd_per_mtok, model.output_usd_per_mtok) == (Decimal("0.3"), Decimal("2.5"))
    # 1000 in at $0.30/M + 200 out at $2.50/M
    assert (rec.status, rec.cost_nano, rec.connection_id) == ("served", 300_000 + 500_000, gemini.id)


def test_thinking_tokens_counted_only_in_the_total_are_billed_as_output(gateway, gemini, upstream):
    # given: Gemini reports 800 thought tokens in total_tokens, not in completion_tokens
    upstream.control(prompt_tokens=1000, completion_tokens=200, thoughts_tokens=800)

    # when
    client(gateway).chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "think"}], max_tokens=2000, reasoning_effort="low"
    )

    # then: 1000 output tokens at $2.50/M, not 200
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.input_tokens, rec.output_tokens) == (1000, 1000)
    assert rec.cost_nano == 300_000 + 2_500_000


def test_a_stream_is_recorded_from_its_usage_chunk(gateway, gemini, upstream):
    upstream.control(prompt_tokens=10, completion_tokens=20, thoughts_tokens=30)

    chunks = list(
        client(gateway).chat.completions.create(
            model="flash", stream=True, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
    )

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert upstream.last(CHAT)["body"]["stream_options"] == {"include_usage": True}
    wait_settled()
    rec = UsageRecord.objects.get()
    assert (rec.status, rec.input_tokens, rec.output_tokens) == ("served", 10, 50)
    assert rec.cost_nano == 10 * 300 + 50 * 2_500


def test_embeddings_are_served_by_gemini(gateway, gemini, upstream):
    upstream.control(prompt_tokens=8)

    vectors = client(gateway).embeddings.create(model="flash", input=["a", "b"])

    assert len(vectors.data) == 2
    assert upstream.last("/v1beta/openai/embeddings")["headers"]["authorization"] == "Bearer gemini-key"
    wait_settled()
    assert UsageRecord.objects.get().cost_nano == 8 * 300


def test_a_request_over_the_cap_is_refused_before_gemini_sees_it(gateway, wired, gemini, upstream):
    wired.budget(amount="0.001")  # 1000 output tokens at $2.50/M alone is $0.0025
    before = upstream.stats()["requests"]

    with pytest.raises(openai.APIStatusError) as refused:
        client(gateway).chat.completions.create(
            model="flash", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
        )

    assert refused.value.status_code == 402 and refused.value.body["code"] == "organization_budget"
    assert upstream.stats()["requests"] == before
    assert not UsageRecord.objects.exists()


def test_a_connection_without_a_base_url_calls_googles_endpoint():
    from gateway.admission.routing import Target
    from gateway.providers import upstream_url

    conn = Connection(kind="gemini", base_url="")
    target = Target(connection=conn, model=Model(name=MODEL))
    assert upstream_url(target, "chat") == "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
    assert upstream_url(target, "embeddings") == "https://generativelanguage.googleapis.com/v1beta/openai/embeddings"
