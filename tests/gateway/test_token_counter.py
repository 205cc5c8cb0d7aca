"""The token counter (gateway/admission/token_counter.py): one process per host counts for every
worker, so no worker loads an encoding. Each test runs the real counter as a subprocess on a Unix
socket; the worker's counts through it must be the ones it would have made itself, and a counter
that cannot answer must leave the byte bound, never a lower one."""

from __future__ import annotations

import functools
import logging
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.admission import encodings, token_counter, tokens
from gateway.admission.bounds import shape_chat
from tests.gateway.test_exact_counts import COOKBOOK, TRUE_PROMPT, _burst, _burst_and_check

ROOT = Path(__file__).resolve().parents[2]


class Counter:
    """A token counter process on a socket of its own (a short path: a Unix socket's is at most
    107 bytes)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cg-tc-", dir="/tmp"))
        self.socket = str(self.dir / "counter.sock")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.admission.token_counter", "serve", "--socket", self.socket]
            + ["--dir", str(django_settings.CAPGATE["TOKENIZER_DIR"])],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while self.check() != 0:
            assert self.proc.poll() is None, self.proc.stderr.read().decode() if self.proc.stderr else ""
            assert time.monotonic() < deadline, "the token counter did not start"
            time.sleep(0.05)

    def check(self) -> int:
        return subprocess.run(
            [sys.executable, "-m", "gateway.admission.token_counter", "check", "--socket", self.socket],
            cwd=ROOT,
            capture_output=True,
        ).returncode

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def counter() -> Iterator[Counter]:
    c = Counter()
    c.start()
    yield c
    c.close()


@pytest.fixture
def remote(counter, settings):
    """This process counts through the counter; it has loaded nothing of its own."""
    if counter.proc is None:
        counter.start()
    settings.CAPGATE = {**settings.CAPGATE, "TOKEN_COUNTER": counter.socket}
    tokens.reset()
    token_counter._drop_connection()
    token_counter._logged["at"] = -token_counter.UNAVAILABLE_LOG_SECONDS
    yield counter
    token_counter._drop_connection()
    tokens.reset()


def _local(body: dict, name: str, kind: str = "chat") -> int:
    enc = tokens.encoding(name)
    assert enc is not None and not isinstance(enc, token_counter.Remote), "tokenizer data missing"
    return tokens.count(tokens.Prompt(kind=kind, billed=body), enc)


def _remote(body: dict, name: str, socket_path: str, kind: str = "chat") -> int:
    return tokens.count(tokens.Prompt(kind=kind, billed=body), token_counter.Remote(socket_path, name))


@pytest.mark.parametrize(("encoding", "documented"), [("cl100k_base", 129), ("o200k_base", 124)])
def test_the_counter_gives_the_count_the_api_documents_and_the_worker_loads_nothing(remote, encoding, documented):
    shape = shape_chat({"model": "m", "messages": COOKBOOK})
    assert shape.prompt is not None
    enc = tokens.encoding(encoding)
    assert isinstance(enc, token_counter.Remote)
    assert tokens.count(shape.prompt, enc) == documented
    assert tokens._loaded == {}


# No lone surrogates: the gateway refuses them as it parses a body (core/jsonlimits.py, 400).
_text = st.text(st.characters(codec="utf-8"), max_size=60) | st.sampled_from(["", "<|endoftext|>", "é" * 9])
_part = st.fixed_dictionaries({"type": st.just("text"), "text": _text})
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.one_of(_text, st.lists(_part, max_size=3)),
    },
    optional={"name": st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)},
)
_item = st.one_of(
    _message.map(lambda m: {"type": "message", **m}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.just("c1"), "output": _text}),
)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(_message, min_size=1, max_size=5),
    items=st.lists(_item, min_size=1, max_size=4),
    instructions=st.none() | _text,
    inputs=st.lists(_text, min_size=1, max_size=4),
    encoding=st.sampled_from(tokens.ENCODINGS),
)
def test_fuzz_the_counter_counts_exactly_what_the_worker_would(
    counter, messages, items, instructions, inputs, encoding
):
    # "<|endoftext|>" as text, empty texts, repeated texts, any UTF-8: the same count.
    path = counter.socket
    chat = {"messages": messages}
    assert _remote(chat, encoding, path) == _local(chat, encoding)
    responses = {"input": items, **({"instructions": instructions} if instructions is not None else {})}
    assert _remote(responses, encoding, path, "responses") == _local(responses, encoding, "responses")
    assert _remote({"input": inputs}, encoding, path, "embeddings") == _local({"input": inputs}, encoding, "embeddings")


def _together(n: int, run: Callable[[int], None]) -> None:
    """run(0) .. run(n - 1), each on a thread of its own, released together by a barrier."""
    barrier = threading.Barrier(n)

    def released(i: int) -> None:
        barrier.wait()
        run(i)

    threads = [threading.Thread(target=released, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_threads_each_get_their_own_counts(remote):
    # given: 8 threads, each with texts of its own and its own connection, released together
    n, rounds = 8, 40
    texts = [["word " * (i + 1), "x" * (3 * i + 1)] * (i + 1) for i in range(n)]
    want = [_expected(t) for t in texts]
    got: list[list] = [[] for _ in range(n)]

    def run(i: int) -> None:
        for _ in range(rounds):
            try:
                got[i].append(token_counter.lengths(remote.socket, "o200k_base", texts[i]))
            except token_counter.Unavailable as exc:
                got[i].append(exc)
        token_counter._drop_connection()

    _together(n, run)
    # then: every answer is the thread's own
    assert all(answer == want[i] for i in range(n) for answer in got[i])
    assert all(len(got[i]) == rounds for i in range(n))


@functools.cache
def _o200k() -> object:
    return encodings.load("o200k_base", Path(django_settings.CAPGATE["TOKENIZER_DIR"]))


def _expected(texts: list[str]) -> list[int]:
    return encodings.lengths(_o200k(), texts)


def test_guard_removal_threads_sharing_one_connection_are_not_answered_their_own(remote, monkeypatch):
    # without a connection per thread, replies meet the wrong request: two threads reading one
    # stream split replies between them, so a thread gets another request's counts, or none
    monkeypatch.setattr(token_counter, "_local", types.SimpleNamespace(sock=None, path=None))
    monkeypatch.setattr(token_counter, "TIMEOUT_SECONDS", 0.5)  # a reply another thread took
    n, rounds = 8, 20
    texts = [["word " * (i + 1)] * (i + 1) for i in range(n)]
    want = [_expected(t) for t in texts]
    outcomes: list[str] = []

    def run(i: int) -> None:
        for _ in range(rounds):
            try:
                answer = token_counter.lengths(remote.socket, "o200k_base", texts[i])
            except (token_counter.Unavailable, OSError, struct.error):
                outcomes.append("unavailable")
            else:
                outcomes.append("own" if answer == want[i] else "another's")

    _together(n, run)
    assert set(outcomes) != {"own"}  # the invariant (every thread answered its own) broke


def test_a_restarted_counter_is_reached_again_on_the_same_thread(remote):
    body = {"messages": COOKBOOK}
    assert _remote(body, "o200k_base", remote.socket) == 124  # this thread's connection opens
    remote.stop()
    remote.start()
    assert _remote(body, "o200k_base", remote.socket) == 124  # the old one is gone: reconnected


def test_no_counter_means_unavailable_logged_once_a_minute(remote, caplog, db):
    remote.stop()
    with caplog.at_level(logging.WARNING, logger="gateway.admission.tokens"):
        for _ in range(3):
            with pytest.raises(token_counter.Unavailable):
                _remote({"messages": COOKBOOK}, "o200k_base", remote.socket)
    warnings = [r for r in caplog.records if "token counter" in r.getMessage()]
    assert len(warnings) == 1 and "byte bound kept" in warnings[0].getMessage()
    assert remote.check() == 1
    tokens.warm()  # a worker starting without its counter: logged, not raised


def test_a_malformed_request_closes_only_its_own_connection(remote):
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.settimeout(5)
    bad.connect(remote.socket)
    bad.sendall(struct.pack(">I", 15) + b"\x05o200k" + struct.pack(">II", 1, 1) + b"\xff")  # no length
    assert _closed(bad)
    bad.close()
    huge = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    huge.settimeout(5)
    huge.connect(remote.socket)
    huge.sendall(struct.pack(">I", token_counter.MAX_FRAME_BYTES + 1))
    assert _closed(huge)
    huge.close()
    assert token_counter.lengths(remote.socket, "o200k_base", ["still counting"]) == [2]


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(8) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True


def test_an_unknown_encoding_is_unavailable_not_a_count(remote):
    with pytest.raises(token_counter.Unavailable):
        token_counter.lengths(remote.socket, "p50k_base", ["text"])  # not one capgate ships
    assert token_counter.lengths(remote.socket, "o200k_base", ["text"]) == [1]


def test_a_second_counter_on_the_same_socket_refuses_and_a_stale_socket_is_replaced(remote):
    second = subprocess.run(
        [sys.executable, "-m", "gateway.admission.token_counter", "serve", "--socket", remote.socket],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
    )
    assert second.returncode != 0 and b"already serving" in second.stderr
    assert remote.check() == 0
    # a counter killed outright leaves its socket file; the next one removes it and serves
    assert remote.proc is not None
    remote.proc.kill()
    remote.proc.wait(10)
    remote.proc = None
    assert Path(remote.socket).exists() and remote.check() == 1
    remote.start()
    assert remote.check() == 0


# --- through HTTP -------------------------------------------------------------------------------


def test_a_worker_counting_through_the_counter_holds_the_cap_and_loads_no_encoding(
    slices_mode, gateway, counted, remote
):
    responses = _burst_and_check(gateway, "counter-run")
    served = [r for r in responses if r.status_code == 200]
    assert len(served) == 10  # the run budget is worth exactly 10 true calls
    assert served[0].headers["x-capgate-input-bound"] == "exact"
    assert int(served[0].headers["x-capgate-reserved-input-tokens"]) == TRUE_PROMPT
    assert tokens._loaded == {}


def test_with_the_counter_down_a_worker_keeps_the_byte_bound(slices_mode, gateway, counted, remote):
    remote.stop()
    responses = _burst(gateway, 1, "counter-down-run")
    assert responses[0].status_code == 200
    assert responses[0].headers["x-capgate-input-bound"] == "bytes"
    assert int(responses[0].headers["x-capgate-reserved-input-tokens"]) > TRUE_PROMPT
    # and once it is back, the next request is counted again
    remote.start()
    again = _burst(gateway, 1, "counter-back-run")
    assert again[0].headers["x-capgate-input-bound"] == "exact"
