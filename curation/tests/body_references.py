"""Body references of data building: an annotation task names its source record set; the other
write routes name nothing in their bodies."""

from __future__ import annotations

import itertools

from curation import services
from curation.tests.matrix import RECORDS, SCHEMA
from workspaces.testing.permission_matrix import BodyReference, MatrixContext

WS = "/api/v1/workspaces/{ws}"
TASKS = WS + "/annotation-tasks"
_names = itertools.count(1)


def _source(ctx: MatrixContext) -> int:
    record_set = services.record_set_upload(
        actor=None,
        workspace=ctx.workspace,
        name=f"ref_items_{next(_names)}",
        content=RECORDS,
        fmt="jsonl",
    )
    return record_set.pk


REFERENCES = [
    BodyReference(
        "POST",
        TASKS + "/",
        "record_set",
        make=_source,
        body=lambda ctx, ref: {
            "name": f"ref_task_{next(_names)}",
            "record_set": ref,
            "text_field": "text",
            "schema": SCHEMA,
        },
        missing=987654321,
    ),
]

NO_REFERENCES = {
    "POST " + WS + "/record-sets/": "a new record set's name and file",
    # the source is the record set in the URL; name is the output, created in this workspace
    "POST " + WS + "/record-sets/{pk}/pipeline/": "the output's name and the stages",
    "POST " + TASKS + "/{name}/items/{position}/labels/": "the item is in the URL; values only",
    "POST " + TASKS + "/{name}/items/{position}/adjudicate/": "the item is in the URL; values only",
    "POST " + TASKS + "/{name}/export/": "the output record set's name, created in this workspace",
}
