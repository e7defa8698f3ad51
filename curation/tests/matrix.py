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

SCHEMA = {
    "fields": [{"name": "label", "kind": "choice", "options": ["yes", "no"], "required": True}]
}


def _task(ctx: MatrixContext) -> dict:
    source = services.record_set_upload(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_items_{next(_names)}",
        content=RECORDS,
        fmt="jsonl",
    )
    task = services.annotation_task_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_task_{next(_names)}",
        source=source,
        text_field="text",
        schema=SCHEMA,
        annotators_per_item=1,
    )
    return {"name": task.name, "position": 0}


def _task_body(ctx: MatrixContext) -> dict:
    source = services.record_set_upload(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix_items_{next(_names)}",
        content=RECORDS,
        fmt="jsonl",
    )
    return {
        "name": f"matrix_task_{next(_names)}",
        "record_set": source.pk,
        "text_field": "text",
        "schema": SCHEMA,
    }


def _labels_body(ctx: MatrixContext) -> dict:
    return {"values": {"label": "yes"}}


def _settled_task(ctx: MatrixContext) -> dict:
    found = _task(ctx)
    from curation.models import AnnotationTask

    task = AnnotationTask.objects.for_workspace(ctx.workspace).get(name=found["name"])
    item = task.items.get(position=0)
    item.status, item.final = "agreed", {"label": "yes"}
    item.save()
    return found


def _disputed_task(ctx: MatrixContext) -> dict:
    found = _task(ctx)
    from curation.models import AnnotationTask

    task = AnnotationTask.objects.for_workspace(ctx.workspace).get(name=found["name"])
    task.items.filter(position=0).update(status="disputed", label_count=1)
    return found


TASKS = WS + "/annotation-tasks"
ENDPOINTS += [
    Endpoint("GET", TASKS + "/", role=Role.VIEWER),
    Endpoint("POST", TASKS + "/", role=Role.DEVELOPER, success=201, body=_task_body),
    Endpoint("GET", TASKS + "/{name}/", setup=_task, has_object=True),
    Endpoint("GET", TASKS + "/{name}/next/", setup=_task, has_object=True),
    Endpoint("GET", TASKS + "/{name}/items/", setup=_task, has_object=True),
    Endpoint("GET", TASKS + "/{name}/agreement/", setup=_task, has_object=True),
    # labelling is the task's annotators' (developers and up when it lists none)
    Endpoint(
        "POST",
        TASKS + "/{name}/items/{position}/labels/",
        role=Role.DEVELOPER,
        success=201,
        setup=_task,
        body=_labels_body,
        has_object=True,
    ),
    # adjudicating is the task's reviewers' (maintainers and up when it lists none)
    Endpoint(
        "POST",
        TASKS + "/{name}/items/{position}/adjudicate/",
        role=Role.MAINTAINER,
        setup=_disputed_task,
        body=_labels_body,
        has_object=True,
    ),
    Endpoint(
        "POST",
        TASKS + "/{name}/export/",
        role=Role.DEVELOPER,
        success=201,
        setup=_settled_task,
        body=lambda ctx: {"name": f"matrix_export_{next(_names)}"},
        has_object=True,
    ),
]
