"""What a web or worker process imports before it serves: no torch and no scipy.stats.

A restarted worker consumes again only once its imports are done (`make run` promises a killed
worker back within 10 s). torch (about 1.8 s here) came in through the URLconf's
``training.api.views`` -> ``training.templates`` (the templates' params), and scipy.stats (about
0.7 s) through ``experiments.apps`` -> ``experiments.stats``; both now load where a model is
built or a statistic computed. Measured from a worker's exec to its ``ready`` line (run-local.sh's
command, embedded defaults): 4.4-4.9 s before, 2.2 s after, on an idle 2-core machine.

Checked in a fresh interpreter, as a process starts: this test process has imported both long
ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
import config.urls  # the web process's URLconf: every app's views and API
from config.celery import app
app.loader.import_default_modules()  # the worker's task modules
from training.bundle import TEMPLATE_PARAMS
print(json.dumps({
    "loaded": sorted(
        m for m in ("torch", "scipy.stats", "lightgbm", "sklearn") if m in sys.modules
    ),
    "templates": sorted(TEMPLATE_PARAMS),
}))
"""


def _probe() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_start_imports_no_torch_or_scipy_stats_and_knows_every_template():
    seen = _probe()
    assert seen["loaded"] == [], f"imported at start: {seen['loaded']}"
    # The params of every built-in template are known without their networks.
    assert seen["templates"] == [
        "deepfm",
        "fine_ranking",
        "lightgbm",
        "lm_full",
        "lm_lora",
        "logreg",
        "two_tower",
    ]


def test_a_declared_template_builds_its_network_on_first_use():
    from training.bundle import BundleSpec, FeatureSpec, build_model

    spec = BundleSpec(
        template="deepfm",
        features=[FeatureSpec(ref="g:x", column="g__x", dtype="float")],
        hparams={"hidden": [8]},
    )
    model = build_model(spec)
    assert type(model).__module__ == "training.templates.deepfm"
    # The list param reached the network: one hidden layer of width 8.
    widths = [m.out_features for m in model.modules() if type(m).__name__ == "Linear"]
    assert 8 in widths
