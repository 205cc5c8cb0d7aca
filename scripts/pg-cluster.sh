#!/usr/bin/env bash
# A private, throwaway PostgreSQL cluster, for fault tests that stop and restart the database
# (tests/faults). Never the shared cluster of scripts/services.sh: other test runs use that one.
#
#   scripts/pg-cluster.sh start DIR PORT   initdb into DIR/data on first use, then start on
#                                          127.0.0.1:PORT with role/database capgate/capgate
#   scripts/pg-cluster.sh stop DIR         fast shutdown: open connections are cut, as in an outage
#   scripts/pg-cluster.sh destroy DIR      stop if running, then delete DIR
#
# Postgres refuses to run as root, so as root the cluster runs as the postgres user (DIR must be
# reachable by it: not under a 0700 directory such as pytest's tmp_path).
set -euo pipefail

cmd="${1:-}"; dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR PORT | stop DIR | destroy DIR" >&2; exit 2; }
data="$dir/data"
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$bin" ] || { echo "$0: PostgreSQL is not installed (bash scripts/services.sh start installs it)" >&2; exit 1; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() { [ -s "$data/PG_VERSION" ] && as_postgres "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; }

case "$cmd" in
  start)
    port="${3:?port required}"
    mkdir -p "$dir/sock"
    if [ ! -s "$data/PG_VERSION" ]; then
      mkdir -p "$data"; chmod 700 "$data"
      if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir" "$data" "$dir/sock"; fi
      as_postgres "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 >/dev/null
      # Small and quiet: a test cluster. fsync off: its data is thrown away with the test.
      cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/sock'
max_connections = 100
shared_buffers = 32MB
fsync = off
full_page_writes = off
log_min_messages = warning
CONF
    fi
    running || as_postgres "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 start >/dev/null
    psql=("$bin/psql" -h "$dir/sock" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
    if [ "$(as_postgres "${psql[@]}" -c "select 1 from pg_roles where rolname='capgate'")" != 1 ]; then
      as_postgres "${psql[@]}" -c "create role capgate login createdb password 'capgate'"
      as_postgres "${psql[@]}" -c "create database capgate owner capgate"
    fi
    ;;
  stop)
    if running; then as_postgres "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null; fi
    ;;
  destroy)
    if running; then as_postgres "$bin/pg_ctl" -D "$data" -m immediate -w -t 60 stop >/dev/null || true; fi
    rm -rf "$dir"
    ;;
  *) echo "usage: $0 start DIR PORT | stop DIR | destroy DIR" >&2; exit 2 ;;
esac
