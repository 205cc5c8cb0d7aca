"""Build tiktoken's o200k_base and cl100k_base files offline, from the npm package js-tiktoken.

tiktoken downloads its .tiktoken files on first use; capgate must never fetch at request time,
and only package registries are reachable where it is built. js-tiktoken (MIT) ships the same
ranks in its own compressed form (`dist/ranks/<name>.js`: lines of "<x> <first rank> <base64
token> <base64 token> ..."). This script fetches the pinned package with `npm pack`, expands each
file back into tiktoken's format ("<base64 token> <rank>" per line, by rank), checks the result
against the sha256 tiktoken itself pins (tiktoken_ext/openai_public.py), and writes it where
tiktoken looks for it: TIKTOKEN_CACHE_DIR/<sha1 of the file's URL>. The sha256 proves the
conversion byte-exact; a mismatch writes nothing and exits non-zero.

Usage: python scripts/tiktoken_data.py DEST_DIR   (stdlib only; idempotent; needs npm)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

JS_TIKTOKEN = "js-tiktoken@1.0.21"
_BASE = "https://openaipublic.blob.core.windows.net/encodings/"
# name -> sha256 of the .tiktoken file, as pinned by tiktoken_ext/openai_public.py.
ENCODINGS = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}


def cache_name(name: str) -> str:
    """The file name tiktoken's read_file_cached() gives the encoding in its cache directory."""
    return hashlib.sha1(f"{_BASE}{name}.tiktoken".encode()).hexdigest()


def expand(js_source: str) -> bytes:
    """js-tiktoken's rank module -> the .tiktoken file's bytes."""
    obj = json.loads(js_source[js_source.index("{") : js_source.rindex("}") + 1])
    ranked: list[tuple[int, str]] = []
    for line in obj["bpe_ranks"].split("\n"):
        if not line:
            continue
        fields = line.split(" ")
        first = int(fields[1])
        ranked.extend((first + i, token) for i, token in enumerate(fields[2:]))
    ranked.sort()
    return "".join(f"{token} {rank}\n" for rank, token in ranked).encode()


def present(dest: Path) -> bool:
    for name, sha in ENCODINGS.items():
        path = dest / cache_name(name)
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            return False
    return True


def build(dest: Path) -> None:
    if present(dest):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["npm", "pack", JS_TIKTOKEN, "--silent", "--pack-destination", tmp], check=True, stdout=subprocess.DEVNULL
        )
        [tarball] = Path(tmp).glob("js-tiktoken-*.tgz")
        with tarfile.open(tarball) as tar:
            sources = {}
            for name in ENCODINGS:
                member = tar.extractfile(f"package/dist/ranks/{name}.js")
                assert member is not None
                sources[name] = member.read().decode()
    dest.mkdir(parents=True, exist_ok=True)
    for name, sha in ENCODINGS.items():
        data = expand(sources[name])
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            sys.exit(f"{name}: converted file has sha256 {actual}, tiktoken expects {sha}; nothing written")
        tmp_path = dest / f"{cache_name(name)}.tmp"
        tmp_path.write_bytes(data)
        os.replace(tmp_path, dest / cache_name(name))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build(Path(sys.argv[1]))
    print(f"tiktoken encodings ({', '.join(ENCODINGS)}) in {sys.argv[1]}")
