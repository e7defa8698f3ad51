"""A gunicorn worker imports ``config.wsgi`` before it accepts connections: the URLconf and the
views are loaded there, so no request waits on those imports (loaded lazily, the first request
of each new worker timed out in the faults bench on a loaded machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_wsgi_module_loads_the_urlconf_and_the_views():
    probe = (
        "import sys, config.wsgi; "
        "print(all(m in sys.modules for m in "
        "('config.urls', 'features.api.views', 'serving.api.views', 'training.api.views')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
