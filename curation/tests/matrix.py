"""Permission-matrix rows for record sets (data building)."""

from __future__ import annotations

import itertools

from curation import services
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)
RECORDS = b'{"text": "hello there general kenobi"}\n{"text": "you are a bold one"}\n'


def _record_set(ctx: MatrixContext) -> dict:
    record_set = services.record_set_upload(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_records_{next(_names)}",
        content=RECORDS,
        fmt="jsonl",
    )
    return {"pk": record_set.pk}


def _upload_body(ctx: MatrixContext) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {"name": f"matrix_upload_{next(_names)}", "file": SimpleUploadedFile("r.jsonl", RECORDS)}


def _pipeline_body(ctx: MatrixContext) -> dict:
    return {
        "name": f"matrix_clean_{next(_names)}",
        "stages": [{"kind": "dedup", "field": "text"}],
    }


ENDPOINTS = [
    Endpoint("GET", WS + "/record-sets/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/record-sets/",
        role=Role.DEVELOPER,
        success=201,
        body=_upload_body,
        format="multipart",
    ),
    Endpoint("GET", WS + "/record-sets/{pk}/", setup=_record_set, has_object=True),
    Endpoint("GET", WS + "/record-sets/{pk}/rows/", setup=_record_set, has_object=True),
    Endpoint("GET", WS + "/record-sets/{pk}/file/", setup=_record_set, has_object=True),
    Endpoint(
        "POST",
        WS + "/record-sets/{pk}/pipeline/",
        role=Role.DEVELOPER,
        success=202,
        setup=_record_set,
        body=_pipeline_body,
        has_object=True,
    ),
]
