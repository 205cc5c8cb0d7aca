#!/usr/bin/env bash
# Create the virtualenv and install capgate with its dev extras (idempotent, quick when done).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    # Debian's own python3 ships venv separately.
    rm -rf .venv
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv .venv
  fi
fi
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -e "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  rm -f .venv/.installed-*; touch "$stamp"
fi
# tiktoken's o200k_base and cl100k_base files, built from the npm package js-tiktoken and checked
# against tiktoken's pinned sha256 (docs/decisions.md): nothing is downloaded at request time.
command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
.venv/bin/python scripts/tiktoken_data.py .venv/share/tiktoken >/dev/null
# Claude Code and Codex CLI, pinned, into .clients/ for tests/clients/ (scripts/clients.sh).
bash scripts/clients.sh >/dev/null
