"""Exact prompt counts on /v1/responses (what Codex CLI sends) and on /v1/messages sent to an
OpenAI-format model: an upper bound on what the provider bills, with its byte bound kept for
every part it cannot count (tools, tool calls, reasoning items), and a burst on a cap worth 100
calls billed by o200k_base that spends the cap and never passes it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from catalog.models import Connection, Model, Provider
from gateway.admission import sizing, tokens
from gateway.admission.bounds import shape_responses
from gateway.admission.request_fields import collecting_unclassified
from ledger.models import Budget, UsageRecord
from tests.conftest import window_of
from tests.gateway.conftest import KEY, wait_settled
from tests.upstream import chatml

ENCODINGS = tokens.ENCODINGS


def _count(body: dict, encoding: str = "o200k_base") -> int:
    with collecting_unclassified():  # what an operator classifies passes the shaper
        shape = shape_responses({"model": "m", **body})
    assert shape.prompt is not None
    enc = tokens.encoding(encoding)
    assert enc is not None, "tokenizer data missing: run scripts/bootstrap.sh"
    return tokens.count(shape.prompt, enc)


def _bytes(body: dict) -> int:
    return shape_responses({"model": "m", **body}).text_tokens


def test_count_equals_what_openais_own_count_answers():
    # POST /v1/responses/input_tokens answers 13 for this body on gpt-4o-class models (o200k_base):
    # one user message, the chat format's framing.
    assert _count({"input": "Hello, how are you?"}) == 13
    assert chatml.responses_prompt_tokens({"input": "Hello, how are you?"}, "o200k_base") == 13


# --- Codex-shaped bodies: instructions, tools of each kind, every item type it sends back ---------

INSTRUCTIONS = (
    "You are a coding agent running in a terminal. You help the user change code in the repository "
    "in the working directory. Read files before you edit them; keep changes small; run the tests "
    "that cover what you change and report their results exactly as printed.\n\n"
    "## Tools\n- Use `shell` for commands; prefer `rg` to `grep`.\n- Use `apply_patch` to edit files.\n"
) * 12
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}, "description": "The command to run."},
                "workdir": {"type": "string", "description": "The working directory."},
                "timeout_ms": {"type": "number", "description": "The timeout in milliseconds."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Tools from the docs MCP server.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Searches the documentation.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            }
        ],
    },
    {"type": "custom", "name": "apply_patch", "description": "Applies a patch to files in the repository."},
    {"type": "web_search", "external_web_access": False},
]
ENCRYPTED = "gAAAAABo" + "Zk9xTUxrV3pQbG1OcjRhY0dYdkV3cGJ1S2JqR0h5aUZ0TnRsWmVNSWdZcDdRbXU" * 40
FOLLOW_UP = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the tests in tests/."}]},
    {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "I should run pytest first."}],
        "content": None,
        "encrypted_content": ENCRYPTED,
    },
    {
        "type": "function_call",
        "name": "shell",
        "arguments": '{"command":["pytest","-q","tests"],"workdir":"/repo"}',
        "call_id": "call_V9a2kQ0Xb1mZ",
    },
    {
        "type": "function_call_output",
        "call_id": "call_V9a2kQ0Xb1mZ",
        "output": "........F.\n=== FAILURES ===\ntest_parse: assert 3 == 4\n1 failed, 9 passed in 0.42s\n" * 8,
    },
    {
        "type": "custom_tool_call",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** Update File: parse.py\n@@\n-    return 3\n+    return 4\n*** End Patch\n",
        "call_id": "call_Pq7",
    },
    {"type": "custom_tool_call_output", "call_id": "call_Pq7", "output": "Done: updated parse.py"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_0a1b2c",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Fixed `parse` and the tests pass.", "annotations": []}],
    },
    {"type": "message", "role": "user", "content": "Now explain 日本語 comments in the diff, briefly."},
]
CODEX = [
    {"instructions": INSTRUCTIONS, "input": "Say hello", "tools": TOOLS},
    {
        "instructions": INSTRUCTIONS,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            *FOLLOW_UP,
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "text": {
            "verbosity": "low",
            "format": {
                "type": "json_schema",
                "name": "answer",
                "strict": True,
                "schema": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
            },
        },
    },
]


@pytest.mark.parametrize("body", CODEX, ids=["first-turn", "tool-loop"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_codex_bodies_count_at_least_what_the_provider_bills_and_free_room(body, encoding):
    counted = _count(body, encoding)
    for joiner in ("", "\n", " "):
        assert counted >= chatml.responses_prompt_tokens(body, encoding, joiner)
    # the byte bound stays the ceiling, and the count frees a large share of it
    assert counted <= _bytes(body)
    assert counted < 0.8 * _bytes(body)


def test_what_cannot_be_counted_keeps_its_byte_bound():
    # given the tool loop without its reasoning item
    body = CODEX[1]
    without = {**body, "input": [i for i in body["input"] if i.get("type") != "reasoning"]}
    reasoning = next(i for i in body["input"] if i.get("type") == "reasoning")
    # then the reasoning item is bounded by its bytes (its encrypted content), not by its tokens
    reasoning_bytes = len(chatml._json(reasoning).encode())
    assert _count(body) - _count(without) >= reasoning_bytes
    # and the tools by their bytes plus the tool-use overhead, as on the chat path
    no_tools = {k: v for k, v in CODEX[0].items() if k != "tools"}
    assert _count(CODEX[0]) - _count(no_tools) >= len(chatml._json({"tools": TOOLS}).encode())


def test_a_field_an_operator_classed_as_tokens_keeps_its_byte_bound():
    # a field the inventory does not list (passed on when classified): its bytes stay counted
    base = {"input": "hi"}
    assert _count({**base, "future_field": "x" * 500}) >= _count(base) + 500
    # a free field (the inventory's) is not prompt text
    assert _count({**base, "prompt_cache_key": "x" * 500}) == _count(base)


def test_the_count_leaves_out_only_fields_the_inventory_lists_as_not_prompt():
    # every name the count leaves out is an inventory field, and what it keeps as bytes beside
    # the counted text is exactly the prompt-side JSON: tools and formats
    from gateway import billing

    for kind, names in tokens.NOT_PROMPT.items():
        fields = billing.FIELDS[kind]
        assert names <= set(fields), names - set(fields)
        assert {k for k, e in fields.items() if e.cls != billing.FREE and k not in names} == {
            "chat": {"tools", "functions", "response_format"},
            "responses": {"tools", "text"},
        }[kind]


def test_guard_removal_a_count_without_framing_is_below_the_bill():
    # the framing per item is what makes the count an upper bound on a body of many short items
    body = {"input": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}] * 20}
    assert _count(body) >= chatml.responses_prompt_tokens(body, "o200k_base")
    real = tokens.TOKENS_PER_MESSAGE
    tokens.TOKENS_PER_MESSAGE = 0
    try:
        assert _count(body) < chatml.responses_prompt_tokens(body, "o200k_base")
    finally:
        tokens.TOKENS_PER_MESSAGE = real


_text = st.text(st.characters(codec="utf-8"), max_size=40)
_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": _text})
_content = st.one_of(_text, st.lists(_part, min_size=1, max_size=3))
_call_id = st.from_regex(r"call_[A-Za-z0-9]{1,8}", fullmatch=True)
_name = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
_item = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer"]), "content": _content},
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries({"type": st.just("function_call"), "name": _name, "arguments": _text, "call_id": _call_id}),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _call_id, "output": st.one_of(_text, st.lists(_part))}
    ),
    st.fixed_dictionaries({"type": st.just("custom_tool_call"), "name": _name, "input": _text, "call_id": _call_id}),
    st.fixed_dictionaries({"type": st.just("custom_tool_call_output"), "call_id": _call_id, "output": _text}),
    st.fixed_dictionaries(
        {
            "type": st.just("reasoning"),
            "summary": st.lists(st.fixed_dictionaries({"type": st.just("summary_text"), "text": _text}), max_size=2),
            "encrypted_content": st.from_regex(r"[A-Za-z0-9+/=]{0,80}", fullmatch=True),
        }
    ),
)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(_item, min_size=1, max_size=6),
    instructions=st.one_of(st.none(), _text),
    encoding=st.sampled_from(ENCODINGS),
)
def test_fuzz_count_never_below_what_the_provider_bills(items, instructions, encoding):
    body: dict = {"input": items}
    if instructions is not None:
        body["instructions"] = instructions
    counted = _count(body, encoding)
    for joiner in ("", "\n", " "):
        assert counted >= chatml.responses_prompt_tokens(body, encoding, joiner)
    assert counted <= _bytes(body)  # never above the byte bound


# --- a burst on a blocking cap worth 100 calls -----------------------------------------------------

CALLS = 100  # the cap is worth exactly this many true calls
N = 150  # requests released together
PRICE_IN, PRICE_OUT = 2_500, 10_000  # nano-USD per token: gpt-4o's $2.50 and $10 per 1M
MAX_TOKENS = 100  # billed in full, so a reservation fitted to the prompt is one true call
PROSE = (
    "Every reservation covers the worst case the provider may bill for the prompt and the reply. "
    "When the response arrives, the actual cost replaces the reservation and the rest returns. "
    "Bursts are the hard case: many calls arrive at once and each must see the others' holds. "
)
# A Codex turn of the kinds counted exactly: instructions, messages and a tool's output. Its one
# function call and the output's call id keep their byte bound: ~100 tokens of a prompt of ~2,900.
BODY = {
    "model": "gpt-test",
    "instructions": PROSE * 32,
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROSE * 4}]},
        {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": PROSE * 12},
        {"type": "message", "role": "user", "content": "Summarize the output."},
    ],
    "max_output_tokens": MAX_TOKENS,
    "store": False,
}
TRUE_PROMPT = chatml.responses_prompt_tokens(BODY, "o200k_base")
TRUE_NANO = TRUE_PROMPT * PRICE_IN + MAX_TOKENS * PRICE_OUT
CAP_NANO = CALLS * TRUE_NANO


def _model(name: str = "gpt-counted") -> Model:
    provider, _ = Provider.objects.get_or_create(slug="openai", defaults={"name": "OpenAI"})
    return Model.objects.create(
        provider=provider,
        name=name,
        input_usd_per_mtok=Decimal(PRICE_IN) / 1000,
        output_usd_per_mtok=Decimal(PRICE_OUT) / 1000,
        max_output_tokens=4096,
        tokenizer="o200k_base",
    )


@pytest.fixture
def capped(wired):
    """gpt-test on a model with o200k_base; the fake upstream bills Responses input as the
    provider renders it and every reply at its max_output_tokens."""
    wired.route("gpt-test", wired.openai, model=_model())
    return Budget.objects.create(
        organization=wired.org, scope="organization", mode="block", period="month", amount_nano=CAP_NANO
    )


def _burst(gateway) -> list[httpx.Response]:
    barrier = threading.Barrier(N)
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-Upstream-count_prompt": "o200k_base",
        "X-Upstream-completion_tokens": "max",
        # every admitted call is still in flight when the last request is sized
        "X-Upstream-delay_ms": "20000",
    }

    def call(_: int) -> httpx.Response:
        barrier.wait()
        try:
            return httpx.post(f"{gateway.url}/v1/responses", json=BODY, headers=headers, timeout=60)
        finally:
            connection.close()

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(call, range(N)))


def _spent_share(gateway, budget: Budget) -> float:
    responses = _burst(gateway)
    wait_settled(timeout=30)
    assert {r.status_code for r in responses} <= {200, 402}, {r.status_code for r in responses}
    records = list(UsageRecord.objects.filter(status="served"))
    assert len(records) == sum(r.status_code == 200 for r in responses)
    assert all(r.input_tokens == TRUE_PROMPT for r in records)
    assert all(r.cost_nano <= r.reserved_nano for r in records), "the provider billed above the worst case"
    window = window_of(budget)
    assert window.reserved_nano == 0
    assert window.spent_nano == sum(r.cost_nano for r in records)
    assert window.spent_nano <= CAP_NANO, "overshoot"
    return window.spent_nano / CAP_NANO


def test_a_byte_bound_holds_several_true_calls():
    # the premise: without a count each reservation holds the room of three true calls or more
    byte_worst = shape_responses(BODY).text_tokens * PRICE_IN + MAX_TOKENS * PRICE_OUT
    assert byte_worst >= 3 * TRUE_NANO


def test_burst_spends_the_cap_with_exact_counts(gateway, capped, slices_mode):
    # when 150 Responses calls arrive together on a cap worth 100
    share = _spent_share(gateway, capped)
    # then every admitted call reserved its counted prompt, and the cap is spent, never passed
    assert share >= 0.95, f"{share:.1%} of the cap spent"
    assert set(UsageRecord.objects.values_list("input_bound", flat=True)) == {"exact"}


def test_guard_removal_responses_bounded_by_bytes_leave_most_of_the_cap_unspent(
    gateway, capped, slices_mode, monkeypatch
):
    # given Responses prompts bounded by bytes only, as before they were counted
    real = sizing._countable
    monkeypatch.setattr(sizing, "_countable", lambda shape, priced: shape.kind != "responses" and real(shape, priced))
    # when the same burst arrives
    share = _spent_share(gateway, capped)
    # then each byte-bound reservation held the room of several true calls
    assert share < 0.5, f"{share:.1%} of the cap spent"
    assert set(UsageRecord.objects.values_list("input_bound", flat=True)) == {"bytes"}


def test_a_continuation_reserves_its_count_plus_the_context_it_continues(gateway, capped, upstream):
    # given a first response relayed through capgate (stored), billed as the provider renders it
    upstream.control(count_prompt="o200k_base", completion_tokens="max")
    first = httpx.post(
        f"{gateway.url}/v1/responses",
        json={**BODY, "store": True},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert first.status_code == 200, first.text
    wait_settled()
    earlier = TRUE_PROMPT + MAX_TOKENS  # what the provider adds back: that response's input and output
    # when the next turn continues it
    body = {
        "model": "gpt-test",
        "input": "And then?",
        "max_output_tokens": MAX_TOKENS,
        "previous_response_id": first.json()["id"],
    }
    r = httpx.post(f"{gateway.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    # then its count covers the new input and the whole earlier context, which the provider bills
    # (counted without it, the turn would reserve 10 tokens for a bill of ~2,750)
    assert r.status_code == 200, r.text
    assert r.headers["x-capgate-input-bound"] == "exact"
    billed = r.json()["usage"]["input_tokens"]
    assert billed == chatml.responses_prompt_tokens(body, "o200k_base") + earlier
    assert int(r.headers["x-capgate-reserved-input-tokens"]) == _count(body) + earlier >= billed


# --- /v1/messages sent to an OpenAI-format model: counted on the chat body it is sent as ----------

MESSAGES_BODY = {
    "model": "gpt-test",
    "max_tokens": 50,
    "system": PROSE * 2,
    "messages": [{"role": "user", "content": PROSE * 3}, {"role": "assistant", "content": "Ok."}]
    + [{"role": "user", "content": [{"type": "text", "text": "Go on."}]}],
}


def test_messages_to_an_openai_model_reserve_the_translated_bodys_count(gateway, wired, upstream):
    # given a run cap and a route whose only target is an OpenAI model with o200k_base
    wired.route("gpt-test", wired.openai, model=_model())
    upstream.control(count_prompt="o200k_base", completion_tokens="max")
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "X-Capgate-Run": "translated-run",
        "X-Capgate-Run-Budget-Usd": "1",
    }
    # when the Messages request is sent
    r = httpx.post(f"{gateway.url}/v1/messages", json=MESSAGES_BODY, headers=headers, timeout=30)
    # then its reservation is the count of the chat body sent upstream, which bills no more
    assert r.status_code == 200, r.text
    assert r.headers["x-capgate-input-bound"] == "exact"
    sent = upstream.last("/v1/chat/completions")["body"]
    reserved = int(r.headers["x-capgate-reserved-input-tokens"])
    assert reserved >= chatml.prompt_tokens(sent, "o200k_base") == r.json()["usage"]["input_tokens"]
    from gateway.translate import translate_request

    chat = translate_request(kind="messages", body=MESSAGES_BODY, headers={}).shape
    assert reserved < 0.5 * chat.text_tokens  # the byte bound it replaced
    wait_settled()
    record = UsageRecord.objects.get(status="served")
    assert record.input_bound == "exact" and record.cost_nano <= record.reserved_nano


def test_messages_with_an_anthropic_fallback_keep_the_byte_bound_for_it(gateway, wired, upstream):
    # given the OpenAI model first and a Claude model (no local tokenizer) as its fallback
    claude = Model.objects.create(
        provider=wired.model.provider,
        name="claude-fallback",
        input_usd_per_mtok=Decimal("3"),
        output_usd_per_mtok=Decimal("15"),
        max_output_tokens=4096,
    )
    route = wired.route("gpt-test", wired.openai, model=_model())
    anthropic = Connection.objects.get(organization=wired.org, kind="anthropic")
    route.targets.create(connection=anthropic, model=claude, position=1)
    headers = {
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "X-Capgate-Run": "mixed-run",
        "X-Capgate-Run-Budget-Usd": "1",
    }
    r = httpx.post(f"{gateway.url}/v1/messages", json=MESSAGES_BODY, headers=headers, timeout=30)
    # then the Claude target's byte bound is kept: the worst case covers every target
    assert r.status_code == 200, r.text
    assert r.headers["x-capgate-input-bound"] == "bytes"
