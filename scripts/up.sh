#!/usr/bin/env bash
# Bring up all of capgate on this machine with a demo organization: PostgreSQL, Redis, the
# gateway + dashboard (uvicorn), the token counter, a Celery worker and Celery beat. Safe to run again: it
# restarts the app processes and leaves data in place. Stop with scripts/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${CAPGATE_PORT:-8000}"

bash scripts/bootstrap.sh
bash scripts/services.sh start
eval "$(bash scripts/services.sh env | sed 's/^/export /')"
export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-config.settings.dev}"
# A local run may point connections at model servers or fake upstreams on this machine; a
# deployment allows only the networks it means (docs/security.md). The demo's echo needs none.
export CAPGATE_UPSTREAM_ALLOWED_NETWORKS="${CAPGATE_UPSTREAM_ALLOWED_NETWORKS-127.0.0.0/8,::1/128}"
mkdir -p var/log var/run
# Prometheus counters of every uvicorn worker live here (gateway/http/metrics.py); a previous run's
# files would be added to this run's counts, so the directory starts empty (after the old
# processes stopped, below).
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$PWD/var/run/prometheus}"

bash scripts/down.sh --quiet || true
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
.venv/bin/python manage.py migrate --noinput -v0
.venv/bin/python manage.py load_prices >/dev/null
.venv/bin/python manage.py apply deploy/demo.yaml >var/log/apply.log

# Each long-running process runs under scripts/supervise.sh, which starts it again (with
# backoff) whenever it exits: a worker or beat that dies is back within seconds, not gone until
# someone notices (docs/operations.md, "Supervision"). The pid file is the supervisor's;
# scripts/down.sh stops it, and it stops its process.
start() {  # name, command...
  local name=$1; shift
  nohup bash scripts/supervise.sh "$name" "$@" >"var/log/$name.log" 2>&1 &
  echo $! >"var/run/$name.pid"
}
# One token counter for all the workers: exact prompt counts are sent to it, so no worker loads
# an encoding (tens of MiB each; docs/operations.md, "The token counter").
export CAPGATE_TOKEN_COUNTER="${CAPGATE_TOKEN_COUNTER-$PWD/var/run/tokens.sock}"
if [ -n "$CAPGATE_TOKEN_COUNTER" ]; then
  start tokens .venv/bin/python -m gateway.admission.token_counter serve --socket "$CAPGATE_TOKEN_COUNTER"
  for _ in $(seq 100); do
    .venv/bin/python -m gateway.admission.token_counter check --socket "$CAPGATE_TOKEN_COUNTER" 2>/dev/null && break
    sleep 0.2
  done
  if ! .venv/bin/python -m gateway.admission.token_counter check --socket "$CAPGATE_TOKEN_COUNTER" 2>/dev/null; then
    echo "the token counter did not start (var/log/tokens.log): each worker loads its own encodings" >&2
    unset CAPGATE_TOKEN_COUNTER
  fi
fi
# One uvicorn worker per core by default (CAPGATE_WEB_WORKERS overrides): a process's event
# loop and its admission Python share one GIL. Each worker is a full gateway process with its
# own pools, slots, drain and heartbeat; size them together (docs/operations.md, "Workers").
WORKERS="${CAPGATE_WEB_WORKERS:-$(nproc)}"
# An idle keep-alive connection is closed after CAPGATE_KEEPALIVE_SECONDS. uvicorn has no
# timeout on reading a request's headers; the gateway bounds the body itself
# (CAPGATE_BODY_READ_TIMEOUT_SECONDS, 408). docs/operations.md, "Timeouts".
start gateway .venv/bin/uvicorn config.asgi:application --host 127.0.0.1 --port "$PORT" --no-access-log \
  --workers "$WORKERS" --timeout-keep-alive "${CAPGATE_KEEPALIVE_SECONDS:-5}"
start worker .venv/bin/celery -A config worker --loglevel info --concurrency 2
start beat .venv/bin/celery -A config beat --loglevel info --schedule var/run/celerybeat-schedule

KEY=cg_demo_key_do_not_use_in_production
for _ in $(seq 100); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$PORT/v1/models" -H "Authorization: Bearer $KEY" 2>/dev/null; then break; fi
  sleep 0.2
done
curl -fsS -o /dev/null "http://127.0.0.1:$PORT/v1/models" -H "Authorization: Bearer $KEY" \
  || { echo "capgate did not start; see var/log/gateway.log" >&2; tail -n 30 var/log/gateway.log >&2; exit 1; }

cat <<TXT

capgate is running.

  Gateway     http://127.0.0.1:$PORT/v1      (OpenAI- and Anthropic-compatible)
  Dashboard   http://127.0.0.1:$PORT/        login demo@capgate.localhost / demo-password
  API docs    http://127.0.0.1:$PORT/api/docs/
  Demo key    $KEY
  Health      http://127.0.0.1:$PORT/healthz  and  /readyz      Metrics  http://127.0.0.1:$PORT/metrics
  Logs        var/log/{gateway,tokens,worker,beat}.log        Stop: bash scripts/down.sh

The demo organization has a \$25 monthly blocking cap and a route "echo-1" to the built-in
echo provider. Try:

  curl http://127.0.0.1:$PORT/v1/chat/completions \\
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \\
    -d '{"model": "echo-1", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 100}'

Claude Code (README, "Claude Code, Codex and other agents"; bash scripts/clients.sh installs it):

  ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_API_KEY=$KEY \\
    .clients/node_modules/.bin/claude -p "Say hello" --model echo-1

TXT
