#!/bin/sh
# Container entrypoint for the RankOps platform image.
#
#   1. waits until the database accepts connections (Django's own connection,
#      DB_WAIT_RETRIES attempts DB_WAIT_INTERVAL seconds apart; WAIT_FOR_DB=0 skips),
#   2. runs `manage.py migrate --noinput` when RUN_MIGRATIONS=1 (only one
#      process per deployment should do this: the web service in compose, the
#      migrate Job in Kubernetes),
#   3. execs the command ("$@"), so it receives signals directly.
set -eu

cd "${APP_HOME:-/app}"

if [ "${WAIT_FOR_DB:-1}" = "1" ]; then
    python -c '
import os, sys, time
import django
from django.db import connection
from django.db.utils import OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()
retries = int(os.environ.get("DB_WAIT_RETRIES", "30"))
interval = float(os.environ.get("DB_WAIT_INTERVAL", "2"))
for attempt in range(1, retries + 1):
    try:
        connection.ensure_connection()
    except OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"entrypoint: database not ready ({attempt}/{retries}): {reason}", file=sys.stderr, flush=True)
        if attempt == retries:
            sys.exit(1)
        time.sleep(interval)
    else:
        connection.close()
        print("entrypoint: database is ready", file=sys.stderr, flush=True)
        break
' || { echo "entrypoint: giving up waiting for the database" >&2; exit 1; }
fi

if [ "${RUN_MIGRATIONS:-0}" = "1" ]; then
    echo "entrypoint: applying migrations" >&2
    python manage.py migrate --noinput
fi

if [ "$#" -eq 0 ]; then
    echo "entrypoint: no command given" >&2
    exit 64
fi

exec "$@"
