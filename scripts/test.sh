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
if [ "$#" -gt 0 ] || [ "${CAPGATE_TEST_LANES:-2}" = 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# The whole suite in two lanes at once: the fault tests (real outages and restarts of private
# PostgreSQL clusters, Redis servers and gateway processes: mostly waiting) and the agent CLI and
# browser tests and the timer-bound modules tests/conftest.py SECOND_LANE names (marker
# second_lane: mostly waiting) beside everything else,
# each lane on its own test database and Redis db, so neither sees the other's rows or keys. The
# fault lane's report is printed after the main lane's; the suite fails if either does.
# CAPGATE_TEST_LANES=1 runs it as one pytest.
mkdir -p var
faults_log=var/test-faults.log
redis_base=${REDIS_URL%/*}
redis_db=${REDIS_URL##*/}
CAPGATE_TEST_DB="${CAPGATE_TEST_DB:-test_capgate}_faults" REDIS_URL="$redis_base/$(((redis_db + 1) % 16))" \
  .venv/bin/python -m pytest -m "faults or second_lane" -p no:cacheprovider >"$faults_log" 2>&1 &
faults_pid=$!
main_rc=0
.venv/bin/python -m pytest -m "not faults and not second_lane" || main_rc=$?
faults_rc=0
wait "$faults_pid" || faults_rc=$?
echo
echo "=== the second lane (pytest -m 'faults or second_lane') ==="
cat "$faults_log"
echo "main lane: exit $main_rc; fault lane: exit $faults_rc"
[ "$main_rc" = 0 ] && [ "$faults_rc" = 0 ]
