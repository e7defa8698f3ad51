#!/usr/bin/env bash
# `make run`: the web server and a Celery worker with beat, on embedded defaults.
# Ctrl-C stops all of them.
set -euo pipefail
BIN=${BIN:-.venv/bin}
PORT=${PORT:-8000}
mkdir -p var/log

pids=()
demo_pid=""
stop() {
  trap - INT TERM EXIT
  echo
  echo "Stopping the platform..."
  if [ -n "$demo_pid" ]; then kill -TERM "$demo_pid" 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

# The worker also consumes node.local: it is the local training node's agent (it registers the
# node by heartbeat and runs the training jobs placed on it).
"$BIN/celery" -A config worker -B --loglevel INFO --concurrency 3 \
  --queues "celery,node.local" \
  --hostname "local@%h" --schedule var/celerybeat-schedule >var/log/worker.log 2>&1 &
pids+=($!)

"$BIN/python" manage.py runserver "127.0.0.1:$PORT" --noreload >var/log/web.log 2>&1 &
pids+=($!)

for _ in $(seq 1 100); do
  if "$BIN/python" - "$PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1)
PY
  sleep 0.3
done

cat <<MSG

  RankOps is running at http://127.0.0.1:$PORT/
  API docs:   http://127.0.0.1:$PORT/api/docs/
  Admin:      http://127.0.0.1:$PORT/admin/
  Logs:       var/log/web.log, var/log/worker.log, var/log/demo.log
  Press Ctrl-C to stop.

MSG
# The demo: every app's registered step in order (features pushed over the REST API like a
# producer would, then training, serving, experiments; idempotent: a second `make run` stores
# nothing twice). Not in pids: the platform keeps running when it finishes.
"$BIN/python" manage.py demo_run --base-url "http://127.0.0.1:$PORT" >var/log/demo.log 2>&1 &
demo_pid=$!
# Exit (and stop the rest) as soon as either process dies; the demo loader finishing is fine.
all_running() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done; }
while all_running; do wait -n "${pids[@]}"; done
echo "A platform process exited; see var/log/." >&2
exit 1
