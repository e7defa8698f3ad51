"""Permission-matrix rows for feature group health."""

from __future__ import annotations

import itertools

from features import registry
from features.models import EntityKind
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)


def _group(ctx: MatrixContext) -> dict:
    group = registry.feature_group_register(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_health_{next(_names)}",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "ctr", "dtype": "float"}],
    )
    return {"name": group.name}


ENDPOINTS = [
    Endpoint("GET", WS + "/feature-groups/{name}/health/", setup=_group, has_object=True),
]
