"""The lineage benchmark area on a graph small enough for a test: it loads, precomputes and its
impact answers match a walk of the same graph."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bench.areas import lineage as area
from bench.harness import Context
from lineage.models import Edge, Node
from lineage.queries import downstream_ids, impact
from lineage.reach import IMPACT_KINDS
from workspaces.models import Workspace

pytestmark = pytest.mark.django_db


def test_small_run_measures_and_agrees_with_a_walk(monkeypatch, tmp_path):
    for name, value in {
        "GROUPS": 20,
        "FEATURES_PER_GROUP": 5,
        "DATASETS": 60,
        "FEATURES_PER_DATASET": 6,
        "QUERIES": 5,
        "WARMUP": 1,
    }.items():
        monkeypatch.setattr(area, name, value)
    ctx = Context(area="lineage", workdir=Path(tmp_path), out=io.StringIO())
    measures = area.run(ctx)
    workspace = Workspace.objects.get(slug="bench-lineage")
    assert measures["graph_nodes"] == Node.objects.for_workspace(workspace).count() > 100
    assert measures["graph_edges"] == Edge.objects.for_workspace(workspace).count() > 400
    assert 0 < measures["impact_depth6_p50_ms"] <= measures["impact_depth6_p99_ms"]
    assert ctx.parameters["top1pct_consumers_max"] >= ctx.parameters["top1pct_consumers_min"]
    for node in Node.objects.for_workspace(workspace).filter(kind="feature")[:10]:
        walked = Node.objects.for_workspace(workspace).filter(
            pk__in=downstream_ids(node.pk, 6), kind__in=IMPACT_KINDS
        )
        assert impact(workspace=workspace, node=node, depth=6)["total"] == walked.count()
