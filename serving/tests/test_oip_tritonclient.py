"""Open Inference Protocol v2 through the stock ``tritonclient.http`` (binary tensors, its
default, and JSON ones), against a live server: metadata, correct scores, the versioned routes
and the spec's error body for malformed inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from serving.inference import MODELS
from serving.tests.helpers import deployed
from workspaces.models import Role
from workspaces.testing.factories import make_member, token_for

pytestmark = pytest.mark.django_db(transaction=True)
SCRIPT = Path(__file__).with_name("triton_stock_client.py")


def test_tritonclient_gets_metadata_scores_and_the_spec_s_errors(live_server, workspace):
    actor = make_member(workspace, Role.MAINTAINER)
    _scene, (version, _), _ = deployed(workspace, actor)
    loaded = MODELS.get(version.pk)
    n = 7
    rows: dict[str, list] = {}
    for feature in loaded.bundle.spec.features:
        if feature.dtype in ("categorical", "string"):
            rows[feature.column] = [f"v{k % 3}" for k in range(n)]
        else:
            rows[feature.column] = [0.5 * k + 1 for k in range(n)]
    expected = loaded.bundle.predict(rows, n)
    name = f"{workspace.slug}.main"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_"))}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), urlsplit(live_server.url).netloc,
         token_for(make_member(workspace, Role.VIEWER)), name, json.dumps(rows)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert "binary_tensor_data" in seen["server"]["extensions"]
    assert [i["name"] for i in seen["metadata"]["inputs"]] == list(rows)
    assert seen["metadata"]["outputs"] == [{"name": "score", "datatype": "FP64", "shape": [-1]}]
    assert seen["ready"] is True
    for label in ("binary", "json", "versioned"):
        assert np.allclose(seen["scores"][label], expected, atol=1e-9), label
    refused = seen["refused"]
    first = seen["metadata"]["inputs"][0]["name"]
    assert refused["missing"]["status"] == "400" and first in refused["missing"]["message"]
    assert refused["shape"]["status"] == "400" and "shape" in refused["shape"]["message"]
    assert (
        refused["unknown"]["status"] == "400" and "nobody__nothing" in refused["unknown"]["message"]
    )
    assert refused["version"]["status"] == "404" and "999" in refused["version"]["message"]
