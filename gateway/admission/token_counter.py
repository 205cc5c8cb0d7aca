"""The token counter: one process per host that holds the encodings and counts for every gateway
worker on it, over a Unix socket.

A loaded o200k_base is about 60 MiB of tiktoken's core in each process that loads it, and uvicorn
starts its workers fresh (nothing is shared copy-on-write). With `CAPGATE_TOKEN_COUNTER` set to
the counter's socket, a worker loads no encoding: an exact count (gateway/admission/tokens.py)
sends the prompt's texts here and gets their token counts back. When the counter cannot answer
(not running, restarted, too slow) the count is unavailable and admission keeps the byte bound,
which is an upper bound too: a request is then reserved higher, never lower.

    python -m gateway.admission.token_counter serve --socket /run/capgate-tokens/counter.sock
    python -m gateway.admission.token_counter check --socket /run/capgate-tokens/counter.sock

No Django here, so the counter holds the encodings and little else. The wire format, both ways
big-endian: a request is its length (u32) and then the encoding's name (u8 length, ASCII), a
sequence number (u32), the number of texts (u32) and each text (u32 length, UTF-8 with lone
surrogates passed through, so the counter tokenizes the very string the worker would have); the
reply is that sequence number, the number of counts (i32; -1 when the encoding cannot be loaded
here) and each count (u32). A reply that does not carry its request's number is never used. An
empty name asks nothing (`check`); a name with no texts loads that encoding (a worker's warm-up).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway.admission import encodings

log = logging.getLogger("gateway.admission.tokens")

# A worker waits this long for a count before keeping the byte bound. Counting takes 40-80 ms
# per MB of text on this hardware (bench/prompt_counts.py), and a body is at most
# CAPGATE_MAX_BODY_BYTES (20 MB by default).
TIMEOUT_SECONDS = 10.0
CONNECT_SECONDS = 1.0
MAX_FRAME_BYTES = 256 * 1024 * 1024
UNAVAILABLE_LOG_SECONDS = 60.0
_U32 = struct.Struct(">I")


class Unavailable(Exception):
    """The counter did not answer, or cannot count with the encoding asked for."""


# --- the worker's side ---------------------------------------------------------------------------

_local = threading.local()  # each thread its own connection: replies never cross
_logged = {"at": -UNAVAILABLE_LOG_SECONDS}
_sequence = itertools.count(1)


def _frame(name: str, seq: int, texts: list[str]) -> bytes:
    raw = name.encode("ascii")
    parts = [struct.pack(">B", len(raw)), raw, _U32.pack(seq), _U32.pack(len(texts))]
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        parts += (_U32.pack(len(data)), data)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("the token counter closed the connection")
        got += k
    return bytes(buf)


def _drop_connection() -> None:
    sock = getattr(_local, "sock", None)
    _local.sock = None
    if sock is not None:
        sock.close()


def _connect(path: str) -> socket.socket:
    """A connection to the counter. A Unix socket whose accept queue is full refuses at once
    (EAGAIN) rather than waiting as TCP does: up to CONNECT_SECONDS of retries cover a burst of
    workers' threads connecting together."""
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_SECONDS)
        try:
            sock.connect(path)
        except BlockingIOError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.001)
        except OSError:
            sock.close()
            raise
        else:
            return sock


def _ask(path: str, seq: int, frame: bytes) -> list[int] | None:
    """One request and its reply on this thread's connection (opened here if it has none)."""
    sock = getattr(_local, "sock", None)
    if sock is None or getattr(_local, "path", None) != path:
        _drop_connection()
        sock = _connect(path)
        _local.sock, _local.path = sock, path
    sock.sendall(frame)
    answered, n = struct.unpack(">Ii", _read(sock, 8))
    if answered != seq:  # never on a connection of this thread's own: refuse it rather than guess
        raise ConnectionResetError(f"reply {answered} to request {seq}")
    if n < 0:
        return None
    return list(struct.unpack(f">{n}I", _read(sock, 4 * n)))


def lengths(path: str, name: str, texts: list[str]) -> list[int]:
    """Each text's token count under the encoding `name`, from the counter at `path`. Raises
    Unavailable (logged at most once a minute per process) when it cannot be had."""
    seq = next(_sequence) & 0xFFFFFFFF
    frame = _frame(name, seq, texts)
    try:
        try:
            counts = _ask(path, seq, frame)
        except (BrokenPipeError, ConnectionResetError):
            # The counter restarted since this thread's connection opened: once more, afresh.
            _drop_connection()
            counts = _ask(path, seq, frame)
    except OSError as exc:  # not running, refused, timed out: keep the byte bound
        _drop_connection()
        _unavailable(f"token counter at {path} unavailable ({exc!r}): byte bound kept")
        raise Unavailable(str(exc)) from exc
    if counts is None:
        _unavailable(f"token counter at {path} cannot load {name}: byte bound kept")
        raise Unavailable(name)
    if len(counts) != len(texts):  # never: a reply answers its own request on its own connection
        _drop_connection()
        raise Unavailable(f"{len(counts)} counts for {len(texts)} texts")
    return counts


def _unavailable(message: str) -> None:
    now = time.monotonic()
    if now - _logged["at"] >= UNAVAILABLE_LOG_SECONDS:
        _logged["at"] = now
        log.warning(message)


class Remote:
    """An encoding counted by the token counter: what tokens.encoding() gives a worker that has
    CAPGATE_TOKEN_COUNTER set. Holds no ranks."""

    def __init__(self, path: str, name: str) -> None:
        self.path, self.name = path, name

    def lengths(self, texts: list[str]) -> list[int]:
        return lengths(self.path, self.name, texts)

    def __repr__(self) -> str:
        return f"Remote({self.name!r} at {self.path!r})"


# --- the counter's side --------------------------------------------------------------------------


class _Encodings:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self.loaded: dict[str, Any] = {}

    def get(self, name: str) -> Any | None:
        enc = self.loaded.get(name)
        if enc is not None or name in self.loaded:
            return enc
        with self.lock:
            if name not in self.loaded:
                self.loaded[name] = encodings.load(name, self.directory)
                if self.loaded[name] is not None:
                    log.info("loaded %s", name)
            return self.loaded[name]


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        while True:
            try:
                header = sock.recv(4, socket.MSG_WAITALL)
                if not header:
                    return  # the worker closed its connection
                (size,) = _U32.unpack(header)
                if size > MAX_FRAME_BYTES:
                    log.warning("a %d-byte request is over the %d-byte limit: connection closed", size, MAX_FRAME_BYTES)
                    return
                reply = self.server.answer(_read(sock, size))
            except (OSError, struct.error, ValueError) as exc:
                log.warning("malformed request, connection closed: %r", exc)
                return
            sock.sendall(reply)


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 256  # the accept queue: every worker thread on the host may connect at once

    def __init__(self, path: str, directory: Path) -> None:
        self.encodings = _Encodings(directory)
        super().__init__(path, _Handler)

    def answer(self, body: bytes) -> bytes:
        """The reply to one request's body. Raises ValueError (or struct.error) when malformed."""
        view = memoryview(body)
        k = view[0]
        name = bytes(view[1 : 1 + k]).decode("ascii")
        at = 1 + k
        seq, n = struct.unpack_from(">II", view, at)
        at += 8
        texts = []
        for _ in range(n):
            (size,) = _U32.unpack_from(view, at)
            at += 4
            if at + size > len(view):
                raise ValueError("a text runs past its request")
            texts.append(bytes(view[at : at + size]).decode("utf-8", "surrogatepass"))
            at += size
        if at != len(view):
            raise ValueError("bytes after the last text")
        if not name:
            return struct.pack(">Ii", seq, 0)
        enc = self.encodings.get(name)
        if enc is None:
            return struct.pack(">Ii", seq, -1)
        counts = encodings.lengths(enc, texts)
        return struct.pack(f">Ii{len(counts)}I", seq, len(counts), *counts)


def _claim(path: str) -> None:
    """Make room for the socket: refuse if a counter answers there, remove a stale one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        target.unlink()  # left by a counter that is gone
    else:
        raise SystemExit(f"a token counter is already serving at {path}")
    finally:
        probe.close()


def serve(path: str, directory: Path, preload: list[str]) -> None:
    _claim(path)
    server = _Server(path, directory)
    os.chmod(path, 0o660)  # the workers' user or group, not the world

    def stop(*_: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        for name in preload:
            if server.encodings.get(name) is None:
                raise SystemExit(f"cannot load {name} from {directory}")
        log.info("counting at %s (encodings from %s)", path, directory)
        server.serve_forever()
    finally:
        server.server_close()
        Path(path).unlink(missing_ok=True)


def check(path: str) -> int:
    """0 when a counter answers at `path` (the container's healthcheck), else 1."""
    try:
        lengths(path, "", [])
    except Unavailable as exc:
        print(f"no token counter at {path}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.admission.token_counter", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="count for the gateway workers on this host")
    run.add_argument("--socket", required=True, help="the Unix socket to serve (CAPGATE_TOKEN_COUNTER)")
    run.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("CAPGATE_TOKENIZER_DIR") or Path(sys.prefix) / "share" / "tiktoken"),
        help="the encodings' files (CAPGATE_TOKENIZER_DIR; default <prefix>/share/tiktoken)",
    )
    run.add_argument("--preload", action="append", default=[], choices=encodings.ENCODINGS, help="load at start")
    probe = sub.add_parser("check", help="exit 0 when a counter answers")
    probe.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s token_counter %(levelname)s %(message)s")
    if args.command == "check":
        return check(args.socket)
    serve(args.socket, args.dir, args.preload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
