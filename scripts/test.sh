#!/usr/bin/env bash
# Run the whole test suite against a real PostgreSQL and Redis (started here if needed).
# Arguments go to pytest: `bash scripts/test.sh -m "not slow"` is the fast tier (no live gateway,
# fault injection, browser or agent CLI; markers in pyproject.toml, applied in tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/services.sh start
bash scripts/browser-deps.sh  # Debian's Chromium for the browser tests (no browser download)
export DJANGO_SETTINGS_MODULE=config.settings.test
# The shared services' URLs, unless the caller named its own (each engineer's run its own Redis db).
while IFS= read -r line; do
  name=${line%%=*}
  [ -n "${!name:-}" ] || export "$line"
done < <(bash scripts/services.sh env)
.venv/bin/ruff check .
.venv/bin/ruff format --check .  # one layout, line length 120 (E501 in ruff check)
.venv/bin/mypy .
# The one-way import rule between apps ([tool.importlinter] in pyproject.toml); uncached: it takes
# well under a second and leaves no cache directory behind.
.venv/bin/lint-imports --no-cache --no-logo
.venv/bin/python manage.py makemigrations --check --dry-run >/dev/null
exec .venv/bin/python -m pytest "$@"
