#!/usr/bin/env bash
# Stop the app processes started by scripts/up.sh (the gateway drains its outbox on the way
# out). Each pid file is a supervisor's (scripts/supervise.sh): TERM stops it from restarting its
# process and passes TERM on, killing the process if it has not exited within 8 s.
# PostgreSQL and Redis keep running: `bash scripts/services.sh stop` stops them.
set -uo pipefail
cd "$(dirname "$0")/.."
for name in gateway worker beat tokens; do  # the counter last: the gateway counts until it stops
  pidfile="var/run/$name.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    [ "${1:-}" = "--quiet" ] || echo "stopped $name"
  fi
  rm -f "$pidfile"
done
