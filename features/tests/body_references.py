"""Body-reference rows of the features API: feature groups named as label sources, features,
successors and lookups."""

from __future__ import annotations

import itertools

from features.tests import matrix_datasets
from features.tests.matrix import make_group
from workspaces.testing.permission_matrix import BodyReference, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)


def _label_source(ctx: MatrixContext) -> str:
    return matrix_datasets._groups(ctx)[0].name


def _feature_ref(ctx: MatrixContext) -> str:
    return f"{matrix_datasets._groups(ctx)[1].name}:age"


def _dataset_body(ctx: MatrixContext, **change) -> dict:
    return {**matrix_datasets._create_body(ctx), **change}


def _group(ctx: MatrixContext) -> dict:
    return {"name": make_group(ctx).name}


REFERENCES = [
    BodyReference(
        "POST",
        WS + "/datasets/",
        "label_source",
        make=_label_source,
        body=lambda ctx, ref: _dataset_body(ctx, label_source=ref),
        missing="no_such_group",
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/datasets/",
        "features",
        make=_feature_ref,
        body=lambda ctx, ref: _dataset_body(ctx, features=[ref]),
        missing="no_such_group:age",
        attr="features.0",
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/datasets/preview/",
        "label_source",
        make=_label_source,
        body=lambda ctx, ref: _dataset_body(ctx, label_source=ref),
        missing="no_such_group",
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/datasets/preview/",
        "features",
        make=_feature_ref,
        body=lambda ctx, ref: _dataset_body(ctx, features=[ref]),
        missing="no_such_group:age",
        attr="features.0",
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/sample-stream/features/",
        "feature",
        make=_feature_ref,
        body=lambda ctx, ref: {"feature": ref},
        missing="no_such_group:age",
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/online-features/",
        "features",
        make=lambda ctx: f"{make_group(ctx).name}:age",
        body=lambda ctx, ref: {"entities": ["u1"], "features": [ref]},
        missing="no_such_group:age",
        attr="features.0",
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/feast/get-online-features",
        "features",
        make=lambda ctx: f"{make_group(ctx).name}:age",
        body=lambda ctx, ref: {"features": [ref], "entities": {"user_id": ["u1"]}},
        missing="no_such_group:age",
        attr="features.0",
        success=200,
    ),
    BodyReference(
        "PATCH",
        WS + "/feature-groups/{name}/",
        "successor",
        setup=_group,
        make=lambda ctx: make_group(ctx).name,
        body=lambda ctx, ref: {"successor": ref},
        missing="no_such_group",
        success=200,
    ),
]

NO_REFERENCES = {
    # producer names a user (users are global; membership of this workspace is checked: 400).
    "POST " + WS + "/feature-groups/": "a new group's schema; producer is a user",
    "DELETE " + WS + "/feature-groups/{name}/": "no body",
    "PATCH " + WS + "/feature-groups/{name}/features/{feature}/": "a status only",
    "POST " + WS + "/feature-groups/{name}/batches/": "rows of the group in the URL",
    # a Feast registry names its own views by name; an existing group of the same name in this
    # workspace is the one it updates (the lookup is scoped to the URL's workspace)
    "POST " + WS + "/feast/import/": "Feast's own definitions; groups by name in this workspace",
}
