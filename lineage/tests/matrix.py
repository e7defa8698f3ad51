"""Permission-matrix rows for the lineage app's API routes."""

from __future__ import annotations

import itertools

from django.db import transaction

from lineage.projection import project
from workspaces.events import Ref, event_record
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}/lineage"
_ids = itertools.count(1)


def _node(ctx: MatrixContext) -> dict:
    """A feature group consumed by a model version, projected into the graph."""
    n = next(_ids)
    with transaction.atomic():
        event_record(
            actor=None,
            workspace=ctx.workspace,
            verb="feature_consumer.registered",
            refs=[
                Ref("feature_group", f"m{n}", f"group_{n}", role="input"),
                Ref("model_version", f"m{n}", f"model {n}", role="output"),
            ],
            resources={"cpu_hours": 1},
        )
    project(gap_wait=0)
    return {"node": f"feature_group:m{n}"}


def _openlineage(ctx: MatrixContext) -> dict:
    # A namespace that is no workspace: every authenticated caller gets the same 200 "ignored".
    return {
        "eventType": "COMPLETE",
        "eventTime": "2026-11-01T00:00:00Z",
        "run": {"runId": "0195a4e0-0000-7000-8000-000000000000"},
        "job": {"namespace": "not-a-workspace-anywhere", "name": "etl"},
        "inputs": [],
        "outputs": [{"namespace": "not-a-workspace-anywhere", "name": "table"}],
        "producer": "https://example.com/matrix",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
    }


ENDPOINTS = [
    Endpoint("GET", WS + "/", role=Role.VIEWER, body=_node),
    Endpoint("GET", WS + "/impact/", role=Role.VIEWER, body=_node),
    Endpoint("GET", WS + "/consumers/", role=Role.VIEWER, body=_node),
    Endpoint("GET", WS + "/features/", role=Role.VIEWER, body=_node),
    Endpoint("GET", WS + "/models/", role=Role.VIEWER, body=_node),
    Endpoint("GET", WS + "/unused-features/", role=Role.VIEWER),
    Endpoint("GET", WS + "/cost/", role=Role.VIEWER),
    Endpoint("POST", "/api/v1/lineage", role=None, body=_openlineage),
    # Marquez's read: the namespace names the workspace. One that is no workspace answers the
    # same 404 to every authenticated caller (the roles inside a workspace, and another
    # workspace's 404: lineage/tests/test_openlineage_export.py).
    Endpoint(
        "GET",
        "/api/v1/lineage",
        role=None,
        success=404,
        body=lambda ctx: {"nodeId": "dataset:not-a-workspace-anywhere:table"},
    ),
]
