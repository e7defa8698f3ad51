"""Query-reference rows of the scheduler API: the recommendation's ``dataset``."""

from __future__ import annotations

from training.tests import matrix
from workspaces.testing.permission_matrix import QueryReference

WS = "/api/v1/workspaces/{ws}/scheduler"

QUERY_REFERENCES = [
    QueryReference(
        WS + "/recommendation/",
        "dataset",
        make=lambda ctx: matrix._dataset(ctx).pk,
        query=lambda ctx, ref: {"template": "logreg", "dataset": ref},
        missing=999_999,
        status=404,
    ),
]
