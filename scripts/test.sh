#!/usr/bin/env bash
# Run the whole test suite against a real PostgreSQL and Redis (started here if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/services.sh start
bash scripts/browser-deps.sh  # Debian's Chromium for the browser tests (no browser download)
export DJANGO_SETTINGS_MODULE=config.settings.test
eval "$(bash scripts/services.sh env | sed 's/^/export /')"
.venv/bin/ruff check .
.venv/bin/ruff format --check .  # one layout, line length 120 (E501 in ruff check)
.venv/bin/mypy .
# The one-way import rule between apps ([tool.importlinter] in pyproject.toml); uncached: it takes
# well under a second and leaves no cache directory behind.
.venv/bin/lint-imports --no-cache --no-logo
.venv/bin/python manage.py makemigrations --check --dry-run >/dev/null
exec .venv/bin/python -m pytest "$@"
