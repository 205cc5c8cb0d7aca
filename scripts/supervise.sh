#!/usr/bin/env bash
# Keep one command running: start it, and whenever it exits start it again, until this script
# is told to stop (TERM or INT). scripts/up.sh runs each long-running process under it, so a
# worker, beat, gateway or token counter that dies is back within seconds (docs/operations.md,
# "Supervision"; docs/decisions.md says why a loop rather than supervisord).
#
# Backoff: the first restart waits 1 s, each quick exit after it doubles the wait, up to
# CAPGATE_SUPERVISE_MAX_BACKOFF (60 s); a run that lasted CAPGATE_SUPERVISE_STABLE_SECONDS
# (60 s) starts the count again. It never gives up: a process that cannot start (its database
# or broker away) is tried once a minute until it can.
# Stopping: TERM is passed on to the command, which gets CAPGATE_SUPERVISE_STOP_SECONDS (8 s,
# inside scripts/down.sh's 10) to exit before it is killed; then this script exits.
#
# Usage: scripts/supervise.sh NAME COMMAND [ARG...]
set -uo pipefail
name=${1:?usage: supervise.sh NAME COMMAND [ARG...]}
shift
max_backoff=${CAPGATE_SUPERVISE_MAX_BACKOFF:-60}
stable=${CAPGATE_SUPERVISE_STABLE_SECONDS:-60}
stop_seconds=${CAPGATE_SUPERVISE_STOP_SECONDS:-8}
say() { echo "[$(date -u +%FT%TZ)] supervise $name: $*" >&2; }

child=""
pause=""
stopping=""
on_stop() {
  stopping=1
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  [ -n "$pause" ] && kill -TERM "$pause" 2>/dev/null
}
trap on_stop TERM INT

# Wait for the child to exit (a trapped signal ends `wait` early), killing it if it outlives
# its stop time; sets rc to its exit status.
reap() {
  local deadline="" status
  while :; do
    if [ -z "$stopping" ]; then
      wait "$child"
      status=$?
      kill -0 "$child" 2>/dev/null || { rc=$status; return; }
    else
      kill -0 "$child" 2>/dev/null || { wait "$child" 2>/dev/null; rc=$?; return; }
      [ -z "$deadline" ] && deadline=$((SECONDS + stop_seconds))
      if [ "$SECONDS" -ge "$deadline" ]; then
        say "still running ${stop_seconds}s after TERM; killing pid $child"
        kill -KILL "$child" 2>/dev/null
      fi
      sleep 0.2
    fi
  done
}

delay=1
rc=0
while [ -z "$stopping" ]; do
  started=$SECONDS
  "$@" &
  child=$!
  say "started pid $child"
  reap
  child=""
  [ -n "$stopping" ] && break
  ran=$((SECONDS - started))
  [ "$ran" -ge "$stable" ] && delay=1
  say "exited with status $rc after ${ran}s; starting it again in ${delay}s"
  sleep "$delay" &
  pause=$!
  wait "$pause" 2>/dev/null
  pause=""
  delay=$((delay * 2 > max_backoff ? max_backoff : delay * 2))
done
say "stopped"
exit 0
