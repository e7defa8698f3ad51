"""Query-reference rows of the features API: the dataset list's ``name`` filter."""

from __future__ import annotations

from features.models import Dataset
from features.tests import matrix_datasets
from workspaces.testing.permission_matrix import MatrixContext, QueryReference

WS = "/api/v1/workspaces/{ws}"


def _dataset_name(ctx: MatrixContext) -> str:
    pk = matrix_datasets._dataset(ctx)["pk"]
    return Dataset.objects.for_workspace(ctx.workspace).get(pk=pk).name


QUERY_REFERENCES = [
    QueryReference(WS + "/datasets/", "name", make=_dataset_name, missing="no-such-dataset"),
]
