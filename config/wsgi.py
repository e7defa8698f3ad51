"""WSGI entry point (gunicorn in production).

The URLconf (and so every view and what it imports: DRF, pyarrow, DuckDB, torch) is loaded here,
when a worker starts, instead of on its first request. A gunicorn worker accepts connections only
once this module is imported, so no request waits on those imports: loaded lazily, the first
request of each new worker took over 15 s on a loaded 2-core machine (the ``faults`` bench's
push loop timed out on it, and a worker that exceeded gunicorn's 30 s timeout was killed with
its request).
"""

import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()
get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view it names
