#!/usr/bin/env bash
# `make run`: the web server and a Celery worker with beat, on embedded defaults.
#
# The worker is supervised: when it dies (a crash, an OOM kill, `kill -9`) its whole process group
# (pool children, the embedded beat) is killed and a new one started after a short backoff
# (1-4 s), each restart logged here and in the worker log; its unacked messages go back to the
# queue (the embedded broker, config/broker.py) and the new worker runs them. The web server dying
# stops everything (exit 1). Ctrl-C or TERM stops web, worker and demo: TERM to each, a deadline
# (STOP_GRACE_S, 8 s), then KILL to what is left of their process groups; the script exits 0, so
# `make run` prints no "Error 1" (make, itself interrupted by the terminal's Ctrl-C, exits 130).
#
# Each child runs in its own process group (`set -m`), so a terminal's Ctrl-C reaches only this
# script, which then stops the children in order (a worker that got the terminal's SIGINT and then
# our TERM did a cold shutdown, or hung in a warm one). Pids: $VAR/run/{web,worker,demo}.pid.
# (Started in the background of another non-interactive script, bash ignores SIGINT and the trap
# cannot be set: stop it with TERM there.)
set -euo pipefail
set -m
BIN=${BIN:-.venv/bin}
PORT=${PORT:-8000}
VAR=${RANKOPS_VAR_DIR:-var}
STOP_GRACE_S=${STOP_GRACE_S:-8}
mkdir -p "$VAR/log" "$VAR/run"

web_pid=""
worker_pid=""
demo_pid=""
stopping=""

log() { echo "[run-local $(date +%H:%M:%S)] $*" >&2; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Signal a child's process group (its pgid is its pid under `set -m`), else the child itself.
signal_group() { kill "-$1" -- "-$2" 2>/dev/null || kill "-$1" "$2" 2>/dev/null || true; }

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

stop() {
  [ -n "$stopping" ] && return
  stopping=1
  trap - INT TERM
  set +m # no job-status lines for the children stopped below
  echo
  log "Stopping the platform..."
  local pid groups=()
  # TERM to each leader: the worker's warm shutdown stops its own pool and beat (TERM to its
  # whole group would kill the pool children under it, which it then restarts).
  for pid in "$demo_pid" "$web_pid" "$worker_pid"; do
    if [ -n "$pid" ]; then
      kill -TERM "$pid" 2>/dev/null || true
      groups+=("$pid")
    fi
  done
  local deadline=$((SECONDS + STOP_GRACE_S))
  while [ "$SECONDS" -lt "$deadline" ]; do
    local left=0
    for pid in "${groups[@]}"; do alive "$pid" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.2
  done
  # Whatever is left (a leader past the deadline, a child that outlived its leader): KILL.
  for pid in "${groups[@]}"; do
    if alive "$pid"; then
      log "pid $pid did not stop in ${STOP_GRACE_S}s; killing its process group"
    fi
    if group_alive "$pid"; then signal_group KILL "$pid"; fi
  done
  wait 2>/dev/null || true
  rm -f "$VAR/run/web.pid" "$VAR/run/worker.pid" "$VAR/run/demo.pid"
  log "Stopped."
}
on_signal() {
  stop
  exit 0
}
trap on_signal INT TERM
trap stop EXIT

# The worker also consumes node.local: it is the local training node's agent (it registers the
# node by heartbeat and runs the training jobs placed on it).
start_worker() {
  "$BIN/celery" -A config worker -B --loglevel INFO --concurrency 3 \
    --queues "celery,node.local" \
    --hostname "local@%h" --schedule "$VAR/celerybeat-schedule" </dev/null >>"$VAR/log/worker.log" 2>&1 &
  worker_pid=$!
  worker_started=$SECONDS
  echo "$worker_pid" >"$VAR/run/worker.pid"
}

start_worker

"$BIN/python" manage.py runserver "127.0.0.1:$PORT" --noreload </dev/null >"$VAR/log/web.log" 2>&1 &
web_pid=$!
echo "$web_pid" >"$VAR/run/web.pid"

for _ in $(seq 1 100); do
  if "$BIN/python" - "$PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1)
PY
  alive "$web_pid" || break
  sleep 0.3
done

cat <<MSG

  RankOps is running at http://127.0.0.1:$PORT/
  API docs:   http://127.0.0.1:$PORT/api/docs/
  Admin:      http://127.0.0.1:$PORT/admin/
  Logs:       $VAR/log/web.log, $VAR/log/worker.log, $VAR/log/demo.log
  Press Ctrl-C to stop.

MSG
# The demo: every app's registered step in order (features pushed over the REST API like a
# producer would, then training, serving, experiments; idempotent: a second `make run` stores
# nothing twice). Not supervised: the platform keeps running when it finishes.
if [ -z "${RUN_LOCAL_NO_DEMO:-}" ]; then
  "$BIN/python" manage.py demo_run --base-url "http://127.0.0.1:$PORT" </dev/null >"$VAR/log/demo.log" 2>&1 &
  demo_pid=$!
  echo "$demo_pid" >"$VAR/run/demo.pid"
fi

backoff=1
while true; do
  # A poll, not `wait -n`: a child that died before `wait -n` was reached (its exit already
  # noted by bash's job control) is not waited for again, and the loop would hang past it (seen
  # in CI: a worker killed while this script was still probing /healthz was never restarted).
  while alive "$web_pid" && alive "$worker_pid"; do sleep 0.5; done
  if ! alive "$web_pid"; then
    log "The web server exited; see $VAR/log/web.log."
    exit 1
  fi
  if ! alive "$worker_pid"; then
    wait "$worker_pid" 2>/dev/null && rc=0 || rc=$?
    # Its pool children and beat would run on as orphans (two beats after the restart).
    signal_group KILL "$worker_pid"
    # 1, 2, 4, 4... s; a worker that ran a minute was healthy: back to 1 s. At most 4 s, so a
    # killed worker consumes again within 10 s however often it dies.
    if [ $((SECONDS - worker_started)) -ge 60 ]; then backoff=1; fi
    log "The worker (pid $worker_pid) exited with $rc; restarting it in ${backoff}s."
    echo "[run-local] worker pid $worker_pid exited with $rc; restarting in ${backoff}s" \
      >>"$VAR/log/worker.log"
    sleep "$backoff"
    backoff=$((backoff * 2 > 4 ? 4 : backoff * 2))
    start_worker
    log "Worker restarted (pid $worker_pid)."
  fi
done
