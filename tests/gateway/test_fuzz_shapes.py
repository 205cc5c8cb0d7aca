"""Fuzzing the gateway's request shapes: every /v1 endpoint that takes a body, with bodies built
from the official SDKs' request types (openai's and anthropic's TypedDicts, tests/gateway/
sdk_types.py) and then broken — wrong types (a part's `type` too, at any depth), lone surrogates,
NUL characters, huge and deeply nested values, unknown fields — sent to a live gateway under a
blocking cap.

Asserted for every example: no 5xx; every 4xx is an error in the endpoint's own shape and leaves
no reservation, no hold and no usage row (each example runs under its own key, so what a request
left is found by its key; the 4xx keys are checked again after the drain has caught up).

Deterministic for CI: `derandomize=True` and no example database; bounded by `max_examples`."""

from __future__ import annotations

import io
import json
import time
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger.models import Hold, Reservation, UsageRecord
from tenants.models import ApiKey
from tests.gateway.sdk_types import sdk_field_types

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLES = 15  # per endpoint: the file runs in under a minute on two cores
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- values ------------------------------------------------------------------------------------

LONE_SURROGATES = st.sampled_from(["\ud800", "x\udfff", "\udbff\ud800z", "\udc00"])
NULS = st.sampled_from(["\x00", "echo-1\x00", "a\x00b"])  # PostgreSQL text cannot hold one
TEXT = st.one_of(st.text(max_size=12), LONE_SURROGATES, NULS)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=10
)


def _nested(levels: int, as_object: bool) -> Any:
    value: Any = "deep"
    for _ in range(levels):
        value = {"a": value} if as_object else [value]
    return value


HUGE = st.sampled_from(["x" * 300_000, "\u4e2d" * 100_000, list(range(20_000)), {f"k{i}": i for i in range(5_000)}])
DEEP = st.builds(_nested, st.sampled_from([20, 63, 64, 65, 500]), st.booleans())
WEIRD = st.one_of(JSON, HUGE, DEEP)
_RIGHT = {
    "string": TEXT,
    "integer": st.integers(min_value=-5, max_value=2**40),
    "number": st.floats(min_value=-3, max_value=3),
    "boolean": st.booleans(),
    "object": st.dictionaries(TEXT, JSON, max_size=3),
    "array": st.lists(JSON, max_size=3),
}


def value_for(types: set[str]) -> st.SearchStrategy:
    """A value of one of the field's own types, or anything at all."""
    return st.one_of(*(_RIGHT[t] for t in sorted(types)), WEIRD)


PART_TYPES = ["text", "image_url", "image", "input_text", "input_image", "input_audio", "file", "tool_result"]
# A part's type of the wrong kind: a list or an object (unhashable where a set of names is asked).
ODD_TYPES = st.lists(TEXT, max_size=2) | st.dictionaries(TEXT, TEXT, max_size=2)


def parts() -> st.SearchStrategy:
    """Content parts, a tool_result's own parts nested inside, any `type` of any kind."""
    part_type = st.sampled_from(PART_TYPES) | ODD_TYPES | JSON
    return st.recursive(
        st.lists(st.fixed_dictionaries({"type": part_type}, optional={"text": TEXT | JSON, "image_url": JSON})),
        lambda inner: st.lists(st.fixed_dictionaries({"type": part_type, "content": inner}), max_size=2),
        max_leaves=6,
    ).map(lambda xs: xs[:3])


def messages() -> st.SearchStrategy:
    role = st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | JSON
    return st.lists(st.fixed_dictionaries({"role": role, "content": st.one_of(TEXT, parts(), WEIRD)}), max_size=3)


def tools() -> st.SearchStrategy:
    kind = st.sampled_from(["function", "custom", "web_search_20250305", "web_fetch_20250910", "mcp", "bash"]) | JSON
    return st.lists(
        st.fixed_dictionaries(
            {"type": kind}, optional={"name": TEXT, "max_uses": JSON, "max_content_tokens": JSON, "function": JSON}
        ),
        max_size=3,
    )


# Fields whose inner shape matters to sizing get structured values too.
_NESTED: dict[str, st.SearchStrategy] = {
    "messages": messages(),
    "tools": tools(),
    "input": st.one_of(TEXT, messages()),
    "system": st.one_of(TEXT, parts()),
}
BASE = {
    "chat": {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
    "messages": {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
    "responses": {"model": "echo-1", "input": "hi", "max_output_tokens": 16},
    "embeddings": {"model": "echo-1", "input": "hi"},
}


def body_for(kind: str, extra: dict[str, set[str]] | None = None) -> st.SearchStrategy:
    """A valid base body with one field replaced, or with any subset of fields set, each to a
    value of its SDK type or to anything; sometimes an unknown field too."""
    types = {**sdk_field_types(kind), **(extra or {})}
    values = {
        name: st.one_of(value_for(t), _NESTED[name]) if name in _NESTED else value_for(t) for name, t in types.items()
    }
    one = st.sampled_from(sorted(values)).flatmap(lambda name: values[name].map(lambda v: {name: v}))
    many = st.fixed_dictionaries({}, optional={**values, "frobnicate": JSON})
    return st.one_of(one, many).map(lambda changed: {**BASE[kind], **changed})


# -- the gateway --------------------------------------------------------------------------------


class Fuzz:
    """One key per example: the rows an example left are the rows of its key."""

    def __init__(self, gateway, wired) -> None:
        self.gateway, self.wired = gateway, wired
        self.refused: list[tuple[int, str]] = []  # (key id, what was sent) of every 4xx

    def key(self) -> tuple[ApiKey, str]:
        raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(
            organization=self.wired.org, project=self.wired.project, name="fuzz", prefix=prefix, key_hash=digest
        )
        return key, raw

    def send(self, path: str, *, flavor: str = "openai", body: Any = None, files: dict | None = None, data=None):
        key, raw = self.key()
        headers = {"authorization": f"Bearer {raw}"}
        if files is None:
            # ensure_ascii writes a lone surrogate as its \\uXXXX escape, as JSON may carry it
            content = json.dumps(body).encode()
            r = httpx.post(
                self.gateway.url + path,
                content=content,
                headers={**headers, "content-type": "application/json"},
                timeout=60,
            )
        else:
            r = httpx.post(self.gateway.url + path, files=files, data=data, headers=headers, timeout=60)
        sent = repr(body if files is None else files)[:300]
        assert r.status_code < 500, f"{r.status_code} {r.text[:300]} for {sent}"
        if 400 <= r.status_code < 500:
            self.check_error_shape(r, flavor, sent)
            assert_left_nothing(key.id, sent)
            self.refused.append((key.id, sent))
        return r

    @staticmethod
    def check_error_shape(r: httpx.Response, flavor: str, sent: str) -> None:
        body = r.json()
        if flavor == "anthropic":
            assert body["type"] == "error" and body["error"]["message"], sent
        else:
            assert body["error"]["message"] and body["error"]["type"], sent

    def finish(self) -> None:
        """After the drain caught up, every refused example still left nothing."""
        deadline = time.monotonic() + 10
        while UsageRecord.objects.filter(applied=False).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for key_id, sent in self.refused:
            assert_left_nothing(key_id, sent)
        assert self.refused, "no example was refused: the strategies are not breaking anything"


def assert_left_nothing(key_id: int, sent: str) -> None:
    assert not Reservation.objects.filter(api_key_id=key_id).exists(), sent
    assert not Hold.objects.filter(reservation__api_key_id=key_id).exists(), sent
    assert not UsageRecord.objects.filter(api_key_id=key_id).exists(), sent


@pytest.fixture
def fuzz(gateway, wired):
    wired.budget(amount="1000")  # a blocking cap: every admitted request reserves against it
    model = wired.model
    assert model is not None
    model.video_usd_per_second = Decimal("0.10")
    model.save(update_fields=["video_usd_per_second"])
    f = Fuzz(gateway, wired)
    yield f
    f.finish()


# -- the endpoints ------------------------------------------------------------------------------

LIVE = [
    ("/v1/chat/completions", "chat", "openai"),
    ("/v1/responses", "responses", "openai"),
    ("/v1/messages", "messages", "anthropic"),
    ("/v1/embeddings", "embeddings", "openai"),
    ("/v1/messages/count_tokens", "messages", "anthropic"),
]
NESTED_TYPE = [{"role": "user", "content": [{"type": "tool_result", "content": [{"type": [], "text": "hi"}]}]}]


@pytest.mark.parametrize(("path", "kind", "flavor"), LIVE, ids=[p.removeprefix("/v1/") for p, _, _ in LIVE])
def test_live_endpoints(fuzz, path, kind, flavor):
    list_key = "input" if kind == "responses" else "messages"

    @FUZZ
    @given(body=body_for(kind))
    @example(body={**BASE[kind], "stream": True, "stream_options": "x"})
    @example(body={**BASE[kind], "model": "echo-1\ud800"})
    @example(body={**BASE[kind], "model": "echo-1\x00"})
    @example(body={**BASE[kind], list_key: [{"role": "user", "content": [{"type": {"a": 1}, "text": "hi"}]}]})
    @example(body={**BASE[kind], list_key: NESTED_TYPE})
    @example(body={**BASE[kind], "system": [{"type": [], "text": "hi"}]})
    def run(body):
        fuzz.send(path, flavor=flavor, body=body)

    run()


RESERVATION_FIELDS = {
    "request_id": {"string"},
    "ttl_seconds": {"integer"},
    "amount_usd": {"string"},
    "input_tokens": {"integer"},
    "max_output_tokens": {"integer"},
}
RESERVATION_FIELDS_ANY = {
    "model": st.just("echo-1") | WEIRD,
    **{name: value_for(types) for name, types in RESERVATION_FIELDS.items()},
}


def test_reservations(fuzz):
    @FUZZ
    @given(body=body_for("chat", RESERVATION_FIELDS) | st.fixed_dictionaries({}, optional=RESERVATION_FIELDS_ANY))
    @example(body={**BASE["chat"], "request_id": "a\x00b"})
    @example(body={**BASE["chat"], "messages": [{"role": "user", "content": [{"type": [], "text": "hi"}]}]})
    @example(body={"model": "echo-1", "amount_usd": "1_000"})
    def run(body):
        fuzz.send("/v1/reservations", body=body)

    run()


def batch_line() -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {
            "custom_id": st.text(min_size=1, max_size=6) | JSON,
            "method": st.just("POST") | JSON,
            "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]) | JSON,
            "body": body_for("chat"),
        }
    )


def test_batch_file_uploads(fuzz):
    @FUZZ
    @given(
        lines=st.lists(batch_line() | WEIRD, min_size=0, max_size=3),
        junk=st.binary(max_size=40) | st.just(b""),
        purpose=st.just("batch") | st.text(max_size=8),
    )
    @example(
        lines=[{"custom_id": "a", "method": "POST", "url": ["/v1/chat/completions"], "body": {}}],
        junk=b"",
        purpose="batch",
    )
    @example(
        lines=[
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {**BASE["chat"], "user": "\ud800"},
            }
        ],
        junk=b"",
        purpose="batch",
    )
    def run(lines, junk, purpose):
        content = b"\n".join(json.dumps(x).encode() for x in lines) + b"\n" + junk
        fuzz.send(
            "/v1/files",
            files={"file": ("batch.jsonl", io.BytesIO(content), "application/jsonl")},
            data={"purpose": purpose},
        )

    run()


def test_batches(fuzz):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": BASE["chat"]}
    key, raw = fuzz.key()
    up = httpx.post(
        fuzz.gateway.url + "/v1/files",
        headers={"authorization": f"Bearer {raw}"},
        data={"purpose": "batch"},
        files={"file": ("b.jsonl", io.BytesIO(json.dumps(line).encode()), "application/jsonl")},
        timeout=30,
    )
    assert up.status_code == 200, up.text
    file_id = up.json()["id"]

    @FUZZ
    @given(
        body=st.fixed_dictionaries(
            {
                "input_file_id": st.sampled_from([file_id, "file-nope"]) | WEIRD,
                "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]) | WEIRD,
                "completion_window": st.just("24h") | WEIRD,
            },
            optional={"metadata": JSON, "output_expires_after": JSON, "frobnicate": JSON},
        )
        | WEIRD
    )
    @example(body={"input_file_id": file_id, "endpoint": ["/v1/chat/completions"], "completion_window": "24h"})
    def run(body):
        fuzz.send("/v1/batches", body=body)

    run()


def test_message_batches(fuzz):
    request = st.fixed_dictionaries(
        {"custom_id": st.text(min_size=1, max_size=6) | JSON, "params": body_for("messages")}
    )

    @FUZZ
    @given(body=st.fixed_dictionaries({"requests": st.lists(request | WEIRD, max_size=3) | WEIRD}) | WEIRD)
    def run(body):
        fuzz.send("/v1/messages/batches", flavor="anthropic", body=body)

    run()


def test_videos(fuzz):
    @FUZZ
    @given(
        body=st.fixed_dictionaries(
            {"model": st.just("echo-1") | WEIRD, "prompt": st.just("a cat") | TEXT | WEIRD},
            optional={
                "seconds": st.sampled_from(["4", "8", "12"]) | WEIRD,
                "size": st.sampled_from(["720x1280", "1024x1792"]) | WEIRD,
                "input_reference": JSON,
                "frobnicate": JSON,
            },
        )
        | WEIRD
    )
    def run(body):
        fuzz.send("/v1/videos", body=body)

    run()
