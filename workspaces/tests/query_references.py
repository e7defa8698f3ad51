"""Query-reference rows of the workspaces API: the activity log's ``object`` filter."""

from __future__ import annotations

import itertools

from django.db import transaction

from workspaces.events import Ref, event_record
from workspaces.testing.permission_matrix import MatrixContext, QueryReference

WS = "/api/v1/workspaces/{ws}"
_ids = itertools.count(1)


def _object_with_events(ctx: MatrixContext) -> str:
    """An object of ctx's workspace that its event log names."""
    n = next(_ids)
    with transaction.atomic():
        event_record(
            actor=None,
            workspace=ctx.workspace,
            verb="dataset.created",
            refs=[Ref("dataset", f"q{n}", f"dataset {n}")],
        )
    return f"dataset:q{n}"


QUERY_REFERENCES = [
    QueryReference(
        WS + "/activity/",
        "object",
        make=_object_with_events,
        missing="dataset:q999999",
    ),
]
