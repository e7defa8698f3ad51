"""Permission-matrix rows for datasets (training samples) and the workspace's sample stream."""

from __future__ import annotations

import itertools

from features import registry, samples
from features.models import EntityKind
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)


def _groups(ctx: MatrixContext):
    """A label group of impressions and a user group that joins onto it (no data: 0 rows)."""
    number = next(_names)
    labels = registry.feature_group_register(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_impressions_{number}",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    users = registry.feature_group_register(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_users_{number}",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "age", "dtype": "int"}],
    )
    return labels, users


def _dataset(ctx: MatrixContext) -> dict:
    labels, users = _groups(ctx)
    dataset = samples.dataset_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_dataset_{next(_names)}",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=[f"{users.name}:age"],
    )
    return {"pk": dataset.pk}


def _create_body(ctx: MatrixContext) -> dict:
    labels, users = _groups(ctx)
    return {
        "name": f"matrix_new_dataset_{next(_names)}",
        "label_source": labels.name,
        "label_columns": ["clicked"],
        "features": [f"{users.name}:age"],
    }


def _stream_body(ctx: MatrixContext) -> dict:
    _, users = _groups(ctx)
    return {"feature": f"{users.name}:age"}


ENDPOINTS = [
    Endpoint("GET", WS + "/datasets/", role=Role.VIEWER),
    Endpoint("POST", WS + "/datasets/", role=Role.DEVELOPER, success=202, body=_create_body),
    Endpoint("POST", WS + "/datasets/preview/", role=Role.DEVELOPER, body=_create_body),
    Endpoint("GET", WS + "/datasets/{pk}/", role=Role.VIEWER, setup=_dataset, has_object=True),
    Endpoint("GET", WS + "/datasets/{pk}/file/", role=Role.VIEWER, setup=_dataset, has_object=True),
    Endpoint("POST", WS + "/sample-stream/features/", role=Role.DEVELOPER, body=_stream_body),
]
