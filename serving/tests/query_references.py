"""Query-reference rows of the serving API: the model-version list's ``model`` filter."""

from __future__ import annotations

import itertools

from serving.tests import matrix
from workspaces.testing.permission_matrix import QueryReference

WS = "/api/v1/workspaces/{ws}"
_n = itertools.count(1)

QUERY_REFERENCES = [
    QueryReference(
        WS + "/model-versions/",
        "model",
        make=lambda ctx: matrix._version(ctx, name=f"queried-{next(_n)}").model.name,
        missing="no-such-model",
    ),
    QueryReference(
        WS + "/benchmark-scores/",
        "version",
        make=lambda ctx: matrix._score(ctx).version_id,
        missing=999_999,
    ),
    QueryReference(
        WS + "/benchmark-scores/",
        "benchmark",
        make=lambda ctx: matrix._score(ctx).benchmark_id,
        missing=999_999,
    ),
]
