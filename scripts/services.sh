#!/usr/bin/env bash
# Install (when missing), start, stop or check the PostgreSQL 15 cluster, the Redis server and
# the PgBouncer in front of that cluster that capgate uses in development, tests and CI. Idempotent: `start` on a running service is a
# no-op. Nothing here starts by itself on these machines (no systemd), so every entry point
# (scripts/up.sh, scripts/test.sh, .ci/run) calls `scripts/services.sh start` first.
#
# Postgres refuses to run as root and its user cannot enter /root, so the cluster lives under
# /var/tmp (reachable by the postgres user), keyed by port so two clones share one cluster.
set -euo pipefail

PG_PORT="${CAPGATE_PG_PORT:-15432}"
REDIS_PORT="${CAPGATE_REDIS_PORT:-16379}"
STATE_DIR="${CAPGATE_STATE_DIR:-/var/tmp/capgate}"
PG_DIR="$STATE_DIR/pg-$PG_PORT"
PG_SOCK="$STATE_DIR/sock"
REDIS_DIR="$STATE_DIR/redis-$REDIS_PORT"
# A bound on Redis's memory, and never an eviction: Redis holds rate-limit counters, the Celery
# broker's tasks and echo's job store; evicting any of them silently (a counter reset, a task lost)
# is worse than a write refused with an error (docs/operations.md, "Redis").
REDIS_MAXMEMORY="${CAPGATE_REDIS_MAXMEMORY:-512mb}"
# PgBouncer in transaction mode, as production Postgres is often reached (docs/operations.md,
# "PgBouncer"); tests/pgbouncer/ run money tests through it. Its config is generated here at
# start, beside the cluster's (never committed): the postgres user it runs as reads it there.
BOUNCER_PORT="${CAPGATE_PGBOUNCER_PORT:-16432}"
BOUNCER_DIR="$STATE_DIR/pgbouncer-$BOUNCER_PORT"
BOUNCER_BIN=/usr/sbin/pgbouncer
DB_USER="${CAPGATE_DB_USER:-capgate}"
DB_PASSWORD="${CAPGATE_DB_PASSWORD:-capgate}"
DB_NAME="${CAPGATE_DB_NAME:-capgate}"

log() { printf '[services] %s\n' "$*" >&2; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$dir" ] && echo "$dir"
}

install_missing() {
  local want=()
  [ -n "$(pg_bin)" ] || want+=(postgresql postgresql-contrib)
  command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
  [ -x "$BOUNCER_BIN" ] || want+=(pgbouncer)
  if [ ${#want[@]} -gt 0 ]; then
    log "installing ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${want[@]}" >/dev/null
  fi
}

pg_start() {
  local bin; bin=$(pg_bin)
  mkdir -p "$STATE_DIR" "$PG_SOCK"
  chmod 755 "$STATE_DIR"
  chown postgres:postgres "$PG_SOCK" 2>/dev/null || true
  if [ ! -s "$PG_DIR/PG_VERSION" ]; then
    log "initialising cluster in $PG_DIR"
    mkdir -p "$PG_DIR"; chown postgres:postgres "$PG_DIR" 2>/dev/null || true; chmod 700 "$PG_DIR"
    as_postgres "$bin/initdb" -D "$PG_DIR" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 >/dev/null
    # 600 connections: the 500-concurrent proofs open one per request thread; tests use 200+.
    cat >> "$PG_DIR/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
max_connections = 600
shared_buffers = 256MB
log_min_messages = warning
CONF
  fi
  if as_postgres "$bin/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
    log "postgres already running on 127.0.0.1:$PG_PORT"
  else
    log "starting postgres on 127.0.0.1:$PG_PORT"
    as_postgres "$bin/pg_ctl" -D "$PG_DIR" -l "$PG_DIR/server.log" -w -t 60 start >/dev/null
  fi
  # Role and database: idempotent.
  local psql=("$bin/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
  if [ "$(as_postgres "${psql[@]}" -c "select 1 from pg_roles where rolname='$DB_USER'")" != 1 ]; then
    as_postgres "${psql[@]}" -c "create role $DB_USER login createdb password '$DB_PASSWORD'"
  fi
  if [ "$(as_postgres "${psql[@]}" -c "select 1 from pg_database where datname='$DB_NAME'")" != 1 ]; then
    as_postgres "${psql[@]}" -c "create database $DB_NAME owner $DB_USER"
  fi
}

pg_stop() {
  local bin; bin=$(pg_bin) || return 0
  [ -s "$PG_DIR/PG_VERSION" ] || return 0
  if as_postgres "$bin/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
    log "stopping postgres"
    as_postgres "$bin/pg_ctl" -D "$PG_DIR" -m fast -w stop >/dev/null
  fi
}

redis_running() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; }

redis_start() {
  mkdir -p "$REDIS_DIR"
  if redis_running; then
    log "redis already running on 127.0.0.1:$REDIS_PORT"; return
  fi
  log "starting redis on 127.0.0.1:$REDIS_PORT"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes --dir "$REDIS_DIR" \
    --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" --save '' --appendonly no \
    --maxmemory "$REDIS_MAXMEMORY" --maxmemory-policy noeviction
  for _ in $(seq 50); do redis_running && return; sleep 0.1; done
  log "redis did not start; see $REDIS_DIR/redis.log"; exit 1
}

redis_stop() {
  if redis_running; then log "stopping redis"; redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true; fi
}

bouncer_running() {
  [ -s "$BOUNCER_DIR/pgbouncer.pid" ] && kill -0 "$(cat "$BOUNCER_DIR/pgbouncer.pid")" 2>/dev/null
}

bouncer_start() {
  if bouncer_running; then
    log "pgbouncer already running on 127.0.0.1:$BOUNCER_PORT"; return
  fi
  mkdir -p "$BOUNCER_DIR"
  # Every database of the cluster, by name (each test suite's own included), in transaction
  # mode: a client holds a server connection for one transaction only. 50 server connections
  # per database and user leave the cluster's 600 for the direct clients. Queries wait at most
  # 30 s for one (then the client gets an error, as with an unreachable database).
  cat >"$BOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $BOUNCER_DIR/userlist.txt
pool_mode = transaction
default_pool_size = 50
max_client_conn = 2000
query_wait_timeout = 30
# The admin console for the app's user (a local pooler: tests read SHOW STATS, refreshed each
# second, to see that their transactions went through it, and KILL their database's server
# connections at the end so that the test database can be dropped).
admin_users = $DB_USER
stats_period = 1
log_connections = 0
log_disconnections = 0
logfile = $BOUNCER_DIR/pgbouncer.log
pidfile = $BOUNCER_DIR/pgbouncer.pid
INI
  printf '"%s" "%s"\n' "$DB_USER" "$DB_PASSWORD" >"$BOUNCER_DIR/userlist.txt"
  chmod 600 "$BOUNCER_DIR/userlist.txt"
  chown -R postgres:postgres "$BOUNCER_DIR" 2>/dev/null || true
  log "starting pgbouncer (transaction mode) on 127.0.0.1:$BOUNCER_PORT"
  as_postgres "$BOUNCER_BIN" -d "$BOUNCER_DIR/pgbouncer.ini"
  for _ in $(seq 50); do
    bouncer_running && (exec 3<>"/dev/tcp/127.0.0.1/$BOUNCER_PORT") 2>/dev/null && return
    sleep 0.1
  done
  log "pgbouncer did not start; see $BOUNCER_DIR/pgbouncer.log"; exit 1
}

bouncer_stop() {
  if bouncer_running; then log "stopping pgbouncer"; kill "$(cat "$BOUNCER_DIR/pgbouncer.pid")"; fi
}

case "${1:-}" in
  start) install_missing; pg_start; redis_start; bouncer_start ;;
  stop) bouncer_stop; redis_stop; pg_stop ;;
  status)
    bin=$(pg_bin); as_postgres "$bin/pg_ctl" -D "$PG_DIR" status || true
    redis_running && echo "redis: running on $REDIS_PORT" || echo "redis: stopped"
    bouncer_running && echo "pgbouncer: running on $BOUNCER_PORT" || echo "pgbouncer: stopped" ;;
  pg-stop) pg_stop ;;
  pg-start) pg_start ;;
  redis-stop) redis_stop ;;
  redis-start) redis_start ;;
  pgbouncer-stop) bouncer_stop ;;
  pgbouncer-start) bouncer_start ;;
  env)
    echo "DATABASE_URL=postgres://$DB_USER:$DB_PASSWORD@127.0.0.1:$PG_PORT/$DB_NAME"
    echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
    echo "CAPGATE_PGBOUNCER_URL=postgres://$DB_USER:$DB_PASSWORD@127.0.0.1:$BOUNCER_PORT/$DB_NAME" ;;
  *)
    echo "usage: $0 start|stop|status|env|pg-start|pg-stop|redis-start|redis-stop|pgbouncer-start|pgbouncer-stop" >&2
    exit 2 ;;
esac
