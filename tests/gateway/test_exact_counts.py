"""Exact prompt counts (issue 14): an upper bound on what the provider bills, used only under a
cap, and the byte bound kept when the tokenizer data is missing."""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
import tiktoken
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from tiktoken_ext import openai_public

from catalog.models import Model
from gateway.admission import tokens
from gateway.admission.bounds import shape_chat
from ledger.models import UsageRecord
from requestlog.models import RequestLogEntry
from scripts import tiktoken_data
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream import chatml

# The OpenAI cookbook's example ("How to count tokens with tiktoken"), with the prompt tokens the
# API reported for it: 129 on cl100k_base models (gpt-3.5-turbo, gpt-4), 124 on gpt-4o/-mini.
COOKBOOK = [
    {
        "role": "system",
        "content": (
            "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."
        ),
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": (
            "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."
        ),
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


def _count(body: dict, encoding: str) -> int:
    shape = shape_chat({"model": "m", **body})
    assert shape.prompt is not None
    enc = tokens.encoding(encoding)
    assert enc is not None, "tokenizer data missing: run scripts/bootstrap.sh"
    return tokens.count(shape.prompt, enc)


def test_encodings_load_offline_and_match_tiktokens_pins():
    # tiktoken itself re-checks each file's sha256 when it reads it from the cache directory.
    assert tiktoken_data.ENCODINGS == tokens.SHA256
    for name in tokens.ENCODINGS:
        assert tokens.cache_name(name) == tiktoken_data.cache_name(name)
        assert tokens.encoding(name) is not None


@pytest.mark.parametrize("name", sorted(tokens.ENCODINGS))
def test_a_loaded_encoding_keeps_no_python_copy_of_its_ranks_and_counts_the_same(name):
    # given: the encoding as capgate loads it, and one built again from its file, ranks kept
    enc = tokens.encoding(name)
    assert enc is not None, "tokenizer data missing: run scripts/bootstrap.sh"
    spec = getattr(openai_public, name)()
    whole = tiktoken.Encoding(**spec)
    # then: the ranks live only in tiktoken's core, it still pickles (by name), and counts alike
    assert "_mergeable_ranks" not in vars(enc)
    assert pickle.loads(pickle.dumps(enc)) is not None
    text = "Résumé: the quick brown fox 🦊 jumps over 13 lazy dogs.\n\tdef f(x): return x ** 2"
    assert enc.encode(text) == whole.encode(text)
    assert enc.n_vocab == whole.n_vocab


@pytest.mark.parametrize(("encoding", "documented"), [("cl100k_base", 129), ("o200k_base", 124)])
def test_count_equals_the_usage_the_api_documents(encoding, documented):
    assert _count({"messages": COOKBOOK}, encoding) == documented
    assert chatml.prompt_tokens({"messages": COOKBOOK}, encoding) == documented


_text = st.text(st.characters(codec="utf-8"), max_size=60)
_part = st.fixed_dictionaries({"type": st.just("text"), "text": _text})
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant"]),
        "content": st.one_of(_text, st.lists(_part, min_size=1, max_size=4)),
    },
    optional={"name": st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)},
)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_message, min_size=1, max_size=6), encoding=st.sampled_from(tokens.ENCODINGS))
def test_fuzz_exact_count_never_below_what_the_tokenizer_bills(messages, encoding):
    counted = _count({"messages": messages}, encoding)
    for joiner in ("", "\n", " "):
        assert counted >= chatml.prompt_tokens({"messages": messages}, encoding, joiner)
    assert counted <= shape_chat({"model": "m", "messages": messages}).text_tokens  # never above bytes


# --- through HTTP: a run budget worth exactly 10 true calls of a many-message prompt -------------

# 20 one-token messages: framing (3 per message + role + 3 for the reply) is most of the prompt.
MESSAGES = [{"role": "user", "content": "hi"}] * 20
TRUE_PROMPT = 20 * (3 + 1 + 1) + 3  # what the provider bills, o200k_base
PRICE_IN, PRICE_OUT = 1_000, 2_000  # nano-USD per token ($1 and $2 per 1M)
TRUE_NANO = TRUE_PROMPT * PRICE_IN + 1 * PRICE_OUT


def _burst(gateway, n: int, run: str) -> list[httpx.Response]:
    barrier = threading.Barrier(n)
    body = {"model": "gpt-test", "messages": MESSAGES, "max_tokens": 1}
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-Capgate-Run": run,
        "X-Capgate-Run-Budget-Usd": str(Decimal(10 * TRUE_NANO) / Decimal(10**9)),
        "X-Upstream-count_prompt": "o200k_base",
        "X-Upstream-completion_tokens": "max",
    }

    def call(_: int) -> httpx.Response:
        barrier.wait()
        try:
            return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
        finally:
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def _burst_and_check(gateway, run: str) -> list[httpx.Response]:
    first = _burst(gateway, 1, run)  # creates the run budget
    responses = first + _burst(gateway, 19, run)
    wait_settled()
    records = list(UsageRecord.objects.filter(run_id=run, status="served"))
    spent = sum(r.cost_nano for r in records)
    # then: every call billed no more than its reservation, and the run no more than its cap
    assert all(r.input_tokens == TRUE_PROMPT for r in records)
    assert all(r.cost_nano <= r.reserved_nano for r in records), "the provider billed above the worst case"
    assert spent <= 10 * TRUE_NANO
    return responses


def test_cap_holds_with_exact_counts_and_uses_the_whole_budget(gateway, counted):
    responses = _burst_and_check(gateway, "exact-run")
    served = [r for r in responses if r.status_code == 200]
    assert len(served) == 10  # exactly the 10 true calls the budget is worth
    assert {r.status_code for r in responses} == {200, 402}
    assert served[0].headers["x-capgate-input-bound"] == "exact"
    assert int(served[0].headers["x-capgate-reserved-input-tokens"]) == TRUE_PROMPT
    # the request log shows the reserved worst case and that it was exact
    entry = RequestLogEntry.objects.get(request_id=served[0].headers["x-capgate-request-id"])
    assert entry.input_bound == "exact" and entry.reserved_nano > 0


def test_guard_removal_a_count_without_framing_leaks(gateway, counted, monkeypatch):
    monkeypatch.setattr(tokens, "TOKENS_PER_MESSAGE", 0)
    monkeypatch.setattr(tokens, "TOKENS_PER_REPLY", 0)
    with pytest.raises(AssertionError):
        _burst_and_check(gateway, "leaky-run")


def test_missing_tokenizer_data_keeps_the_byte_bound(gateway, counted, settings, tmp_path):
    settings.CAPGATE = {**settings.CAPGATE, "TOKENIZER_DIR": str(tmp_path)}
    tokens.reset()
    try:
        assert tokens.encoding("o200k_base") is None
        (tmp_path / tokens.cache_name("o200k_base")).write_bytes(b"altered\n")
        tokens.reset()
        assert tokens.encoding("o200k_base") is None  # fails its checksum: not loaded, not fetched
        responses = _burst(gateway, 1, "bytes-run")
    finally:
        tokens.reset()
    assert responses[0].status_code == 200
    assert responses[0].headers["x-capgate-input-bound"] == "bytes"
    assert int(responses[0].headers["x-capgate-reserved-input-tokens"]) > TRUE_PROMPT
    entry = RequestLogEntry.objects.get(request_id=responses[0].headers["x-capgate-request-id"])
    assert entry.input_bound == "bytes"


def test_anthropic_models_keep_the_byte_bound(gateway, wired):
    # given a blocking run cap and a model without a tokenizer
    r = httpx.post(
        f"{gateway.url}/v1/messages",
        timeout=30,
        json={"model": "claude-test", "max_tokens": 10, "messages": MESSAGES},
        headers={
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
            "X-Capgate-Run": "a-run",
            "X-Capgate-Run-Budget-Usd": "1",
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-capgate-input-bound"] == "bytes"


def test_gateway_startup_loads_the_catalogs_encodings_off_the_event_loop(request, counted, monkeypatch):
    # given: a process that has not loaded any encoding yet, and a catalog whose only model with
    # a tokenizer uses o200k_base
    import asyncio
    import time

    from gateway.upstream import runtime

    tokens.reset()
    warmed_on_loop: list[bool] = []
    real_warm = tokens.warm

    def warm() -> None:
        try:
            asyncio.get_running_loop()
            warmed_on_loop.append(True)
        except RuntimeError:
            warmed_on_loop.append(False)
        real_warm()

    monkeypatch.setattr(tokens, "warm", warm)
    # when: the gateway starts (uvicorn with its lifespan)
    request.getfixturevalue("gateway")
    assert runtime.background is not None and runtime.background.tokenizers is not None
    deadline = time.monotonic() + 30
    while not runtime.background.tokenizers.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    # then: loaded on a worker thread, so the first exact count finds it ready; the encoding no
    # model uses is not loaded (its ranks would cost every worker tens of MiB)
    assert warmed_on_loop == [False]
    assert set(tokens._loaded) == {"o200k_base"} and tokens._loaded["o200k_base"]
    started = time.perf_counter()
    assert tokens.encoding("o200k_base") is not None
    assert time.perf_counter() - started < 0.01


def test_only_routed_models_encodings_load_and_a_later_count_loads_its_own(wired):
    # given: no routed model names a tokenizer; the price catalog lists one that no route targets
    tokens.reset()
    Model.objects.create(provider=wired.model.provider, name="unrouted", tokenizer="o200k_base")
    # when: the gateway warms up
    tokens.warm()
    # then: nothing is loaded; a routed model given one later loads it at its first count
    assert tokens.used() == [] and tokens._loaded == {}
    Model.objects.filter(pk=wired.model.pk).update(tokenizer="cl100k_base")
    assert tokens.used() == ["cl100k_base"]
    assert tokens.encoding("cl100k_base") is not None
    assert set(tokens._loaded) == {"cl100k_base"}
    tokens.reset()
