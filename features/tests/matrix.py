"""Permission-matrix rows for the features app's API routes.

Rows for datasets and health live in matrix_datasets.py and matrix_health.py beside this file.
"""

from __future__ import annotations

import importlib
import itertools

from features import registry
from features.models import EntityKind
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)


def make_group(ctx: MatrixContext, **extra):
    return registry.feature_group_register(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_group_{next(_names)}",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "age", "dtype": "int"}, {"name": "ctr", "dtype": "float"}],
        **extra,
    )


def _group(ctx: MatrixContext) -> dict:
    return {"name": make_group(ctx).name}


def _group_feature(ctx: MatrixContext) -> dict:
    return {"name": make_group(ctx).name, "feature": "age"}


def _new_group_body(ctx: MatrixContext) -> dict:
    return {
        "name": f"new_group_{next(_names)}",
        "entity": "item",
        "entity_key": "item_id",
        "features": [{"name": "price", "dtype": "float"}],
    }


def _batch_body(ctx: MatrixContext) -> dict:
    return {"rows": [{"user_id": "u1", "event_time": "2026-01-01T00:00:00Z", "age": 30}]}


def _lookup_body(ctx: MatrixContext) -> dict:
    return {"entities": ["u1"], "features": [f"{make_group(ctx).name}:age"]}


def _feast_import_body(ctx: MatrixContext) -> dict:
    """A `feast registry-dump` of one feature view, named afresh for each call."""
    return {
        "registry": {
            "project": "matrix",
            "entities": [{"spec": {"name": "user_id", "joinKey": "user_id"}}],
            "featureViews": [
                {
                    "spec": {
                        "name": f"feast_view_{next(_names)}",
                        "entities": ["user_id"],
                        "features": [{"name": "age", "valueType": "INT64"}],
                    }
                }
            ],
        }
    }


def _feast_lookup_body(ctx: MatrixContext) -> dict:
    return {"features": [f"{make_group(ctx).name}:age"], "entities": {"user_id": ["u1"]}}


def _optional(module: str) -> list[Endpoint]:
    try:
        return importlib.import_module(module).ENDPOINTS
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return []


ENDPOINTS = [
    Endpoint("GET", WS + "/feature-groups/", role=Role.VIEWER),
    Endpoint(
        "POST", WS + "/feature-groups/", role=Role.DEVELOPER, success=201, body=_new_group_body
    ),
    Endpoint("GET", WS + "/feature-groups/{name}/", setup=_group, has_object=True),
    Endpoint(
        "PATCH",
        WS + "/feature-groups/{name}/",
        role=Role.DEVELOPER,
        setup=_group,
        has_object=True,
        body=lambda ctx: {"description": "Seven-day click-through rate per user."},
    ),
    Endpoint(
        "DELETE",
        WS + "/feature-groups/{name}/",
        role=Role.MAINTAINER,
        success=204,
        setup=_group,
        has_object=True,
    ),
    Endpoint(
        "GET",
        WS + "/feature-groups/{name}/features/{feature}/",
        setup=_group_feature,
        has_object=True,
    ),
    Endpoint(
        "PATCH",
        WS + "/feature-groups/{name}/features/{feature}/",
        role=Role.DEVELOPER,
        setup=_group_feature,
        has_object=True,
        body=lambda ctx: {"status": "deprecated"},
    ),
    Endpoint("GET", WS + "/feature-groups/{name}/batches/", setup=_group, has_object=True),
    Endpoint(
        "POST",
        WS + "/feature-groups/{name}/batches/",
        role=Role.DEVELOPER,
        success=201,
        setup=_group,
        has_object=True,
        body=_batch_body,
    ),
    Endpoint("POST", WS + "/online-features/", role=Role.VIEWER, body=_lookup_body),
    Endpoint(
        "POST", WS + "/feast/import/", role=Role.DEVELOPER, success=201, body=_feast_import_body
    ),
    Endpoint("POST", WS + "/feast/get-online-features", role=Role.VIEWER, body=_feast_lookup_body),
    *_optional("features.tests.matrix_datasets"),
    *_optional("features.tests.matrix_health"),
]
