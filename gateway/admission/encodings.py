"""The public encodings capgate counts with, and how one is loaded from its verified file.

No Django here: the token counter process (gateway/admission/token_counter.py) loads encodings
with this module alone, and a gateway worker through gateway/admission/tokens.py.

The encoding files are built into the tokenizer directory by scripts/tiktoken_data.py at install
time and checked against tiktoken's pinned sha256 before use. Nothing is fetched: with a file
missing or altered, `load` returns None and the caller keeps the byte bound.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("gateway.admission.tokens")

ENCODINGS = ("o200k_base", "cl100k_base")
# sha256 of each .tiktoken file, as tiktoken_ext/openai_public.py pins them (a test checks).
SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def cache_name(name: str) -> str:
    """The file name tiktoken's read_file_cached() looks for in TIKTOKEN_CACHE_DIR."""
    return hashlib.sha1(_URL.format(name).encode()).hexdigest()


def load(name: str, directory: Path) -> Any | None:
    """The tiktoken Encoding `name` from `directory`, or None when the name is unknown or its file
    is missing, fails its checksum or does not load (each logged). About 0.5 s for o200k_base."""
    if name not in SHA256:
        return None
    path = directory / cache_name(name)
    try:
        data = path.read_bytes()
    except OSError:
        log.warning("tokenizer %s missing at %s: byte bound kept (run scripts/bootstrap.sh)", name, path)
        return None
    if hashlib.sha256(data).hexdigest() != SHA256[name]:
        # tiktoken would delete it and download again: never at request time.
        log.error("tokenizer %s at %s fails its sha256: byte bound kept", name, path)
        return None
    import tiktoken  # only where an encoding is loaded: its core is tens of MiB

    # Verified above, so tiktoken reads it from its cache and does not fetch.
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    try:
        enc = tiktoken.get_encoding(name)
    except Exception:  # noqa: BLE001 — any failure here only means "use bytes"
        log.exception("tokenizer %s failed to load: byte bound kept", name)
        return None
    _drop_python_ranks(enc)
    return enc


def _drop_python_ranks(enc: Any) -> None:
    """Let go of the Python dict of the encoding's ranks once its Rust core holds them.

    tiktoken keeps the dict it built the core from (`_mergeable_ranks`, one bytes object per
    token) only to pickle an encoding it has not registered; `get_encoding`'s are registered and
    pickle by name. For o200k_base that dict is 27 MiB of the 80 the encoding adds to a fresh
    interpreter; a gateway worker's RSS falls by 12-15 MiB (the allocator keeps the rest for
    reuse; docs/performance.md, "Gateway processes and memory"). Counting never reads it
    (tests/gateway/test_exact_counts.py)."""
    enc.__dict__.pop("_mergeable_ranks", None)


def lengths(enc: Any, texts: list[str]) -> list[int]:
    """Each text's token count under `enc`, as text: a "<|endoftext|>" in it is not a special
    token."""
    n = enc.encode_ordinary
    return [len(n(text)) for text in texts]
