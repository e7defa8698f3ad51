"""Query-reference rows of the lineage API: every route that takes a ``node``."""

from __future__ import annotations

from lineage.tests import matrix
from workspaces.testing.permission_matrix import QueryReference

WS = "/api/v1/workspaces/{ws}/lineage"

QUERY_REFERENCES = [
    QueryReference(
        WS + path,
        "node",
        make=lambda ctx: matrix._node(ctx)["node"],
        missing="feature_group:no-such-group",
        status=404,
    )
    for path in ("/", "/impact/", "/consumers/", "/features/", "/models/", "/cost/")
]
