"""Browser pages of the annotation workbench, under /w/<ws>/data/tasks/: the tasks (create one
over a record set), a task's page (progress, agreement, export), the labelling page (the next
item and the form its schema generates, with keyboard shortcuts) and the review page (the next
disputed item with every label, adjudicated through the same form)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render

from curation import annotation, services
from curation.models import AnnotationItem, AnnotationTask, ItemStatus, RecordSetStatus
from curation.selectors import annotation_tasks_of, items_of, record_sets_of, task_progress
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

EXAMPLE_SCHEMA = {
    "fields": [
        {
            "name": "sentiment",
            "kind": "choice",
            "options": ["positive", "neutral", "negative"],
            "required": True,
        },
        {"name": "topics", "kind": "multi_choice", "options": ["price", "delivery", "quality"]},
        {"name": "quality", "kind": "rating", "min": 1, "max": 5},
        {"name": "note", "kind": "text"},
    ]
}


def _usernames(text: str) -> list[str]:
    return [u for u in (part.strip() for part in text.replace(",", " ").split()) if u]


class TaskForm(forms.Form):
    name = forms.CharField(max_length=63)
    record_set: Any = forms.ModelChoiceField(
        queryset=None, empty_label=None, help_text="A ready record set."
    )
    text_field = forms.CharField(max_length=200, help_text="The column annotators read.")
    schema = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false", "class": "mono"}),
        help_text="Fields of kind " + ", ".join(annotation.KINDS) + "; mark a field required with "
        '"required": true.',
    )
    annotators_per_item = forms.IntegerField(min_value=1, max_value=10, initial=2)
    annotators = forms.CharField(
        required=False, help_text="Usernames; empty: every developer or higher labels."
    )
    reviewers = forms.CharField(
        required=False, help_text="Usernames; empty: maintainers and admins review."
    )
    instructions = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)

    def __init__(self, *args: Any, workspace: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field: Any = self.fields["record_set"]
        field.queryset = record_sets_of(workspace=workspace).filter(status=RecordSetStatus.READY)

    def clean_schema(self) -> Any:
        try:
            return json.loads(self.cleaned_data["schema"])
        except json.JSONDecodeError as exc:
            raise ValidationError(f"not JSON: {exc.msg} at line {exc.lineno}") from exc


def _errors_to_form(form: forms.Form, exc: ValidationError | ConflictError, fallback: str) -> None:
    if isinstance(exc, ConflictError):
        form.add_error(None, str(exc))
        return
    for key, problems in exc.message_dict.items():
        target = key if key in form.fields else fallback
        for problem in problems:
            form.add_error(target, problem if key in form.fields else f"{key}: {problem}")


@workspace_page()
def task_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    can_write = role_at_least(request.workspace_role, Role.DEVELOPER)
    status = 200
    form = TaskForm(workspace=workspace, initial={"schema": json.dumps(EXAMPLE_SCHEMA, indent=2)})
    if request.method == "POST":
        if not can_write:
            return HttpResponse("Creating a task needs the developer role.", status=403)
        form = TaskForm(request.POST, workspace=workspace)
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                task = services.annotation_task_create(
                    actor=request.user,
                    workspace=workspace,
                    name=data["name"],
                    source=data["record_set"],
                    text_field=data["text_field"],
                    schema=data["schema"],
                    annotators_per_item=data["annotators_per_item"],
                    annotators=_usernames(data["annotators"]),
                    reviewers=_usernames(data["reviewers"]),
                    instructions=data["instructions"],
                )
            except (ValidationError, ConflictError) as exc:
                _errors_to_form(form, exc, "schema")
            else:
                messages.success(request, f"Task {task.name}: {task.item_count} items to label.")
                return redirect("curation-task", ws=workspace.slug, name=task.name)
    tasks = [(t, task_progress(t)) for t in annotation_tasks_of(workspace=workspace)]
    return render(
        request,
        "curation/task_list.html",
        page_context(request, tasks=tasks, form=form, can_write=can_write, section="data"),
        status=status,
    )


def _task(workspace, name: str) -> AnnotationTask:
    task = annotation_tasks_of(workspace=workspace).filter(name=name).first()
    if task is None:
        raise Http404(f"no annotation task '{name}'")
    return task


@workspace_page()
def task_page(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    task = _task(workspace, name)
    role = request.workspace_role
    can_write = role_at_least(role, Role.DEVELOPER)
    export_error = ""
    status = 200
    if request.method == "POST":
        if not can_write:
            return HttpResponse("Exporting needs the developer role.", status=403)
        try:
            record_set = services.annotation_export(
                actor=request.user, task=task, name=request.POST.get("export_name", "")
            )
        except (ValidationError, ConflictError) as exc:
            export_error = (
                "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
                if isinstance(exc, ValidationError)
                else str(exc)
            )
            status = 400 if isinstance(exc, ValidationError) else 409
        else:
            messages.success(
                request, f"Exported {record_set.row_count} labelled rows as {record_set}."
            )
            return redirect(
                "curation-record-set",
                ws=workspace.slug,
                name=record_set.name,
                version=record_set.version,
            )
    return render(
        request,
        "curation/task_detail.html",
        page_context(
            request,
            task=task,
            progress=task_progress(task),
            agreement=services.annotation_agreement(task),
            may_annotate=services.may_annotate(task, request.user, role),
            may_review=services.may_review(task, request.user, role),
            can_write=can_write,
            export_error=export_error,
            export_name=f"{task.name}_labels"[:63],
            section="data",
        ),
        status=status,
    )


def values_from_post(schema: dict[str, Any], post: QueryDict) -> dict[str, Any]:
    """The form's fields (``f_<name>``) as the values a submission carries."""
    values: dict[str, Any] = {}
    for field in schema["fields"]:
        key = f"f_{field['name']}"
        if field["kind"] == "multi_choice":
            values[field["name"]] = post.getlist(key)
        elif field["kind"] == "spans":
            raw = post.get(key, "") or "[]"
            try:
                values[field["name"]] = json.loads(raw)
            except json.JSONDecodeError:
                values[field["name"]] = raw  # refused by the schema check, naming the field
        else:
            values[field["name"]] = post.get(key, "")
    return values


def _field_errors(name: str, errors: dict[str, list[str]]) -> list[str]:
    return [
        (problem if key == name else f"{key}: {problem}")
        for key, problems in errors.items()
        if key == name or key.startswith((f"{name}[", f"{name}."))
        for problem in problems
    ]


def _form_fields(
    task: AnnotationTask, chosen: dict[str, Any] | None, errors: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """What the template renders per schema field: its options with their keys and what is
    chosen (a reviewer's form starts from the first label)."""
    keys = annotation.shortcuts(task.schema)
    chosen = chosen or {}
    out = []
    for field in task.schema["fields"]:
        value = chosen.get(field["name"])
        options = [
            {
                "key": key,
                "value": option,
                "checked": option in value if isinstance(value, list) else option == value,
            }
            for key, option in keys[field["name"]]
        ]
        out.append(
            {
                **field,
                "options": options,
                "value": value if field["kind"] == "text" else None,
                "spans_json": json.dumps(value) if field["kind"] == "spans" and value else "[]",
                "errors": _field_errors(field["name"], errors),
            }
        )
    return out


def _item_view(
    request: WorkspaceRequest,
    workspace,
    task: AnnotationTask,
    item: AnnotationItem | None,
    *,
    mode: str,
    errors: dict[str, list[str]] | None = None,
    chosen: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    labels = list(item.labels.select_related("annotator")) if item and mode == "review" else []
    names = [f["name"] for f in task.schema["fields"]]
    if item is not None and chosen is None and labels:
        chosen = labels[0].values
    return render(
        request,
        "curation/label.html",
        page_context(
            request,
            task=task,
            item=item,
            text=str(item.data.get(task.text_field) or "") if item else "",
            other_columns={k: v for k, v in item.data.items() if k != task.text_field}
            if item
            else {},
            fields=_form_fields(task, chosen, errors or {}),
            labels=labels,
            general_errors=[
                f"{key}: {problem}"
                for key, problems in (errors or {}).items()
                if not any(key == n or key.startswith((f"{n}[", f"{n}.")) for n in names)
                for problem in problems
            ],
            mode=mode,
            progress=task_progress(task),
            section="data",
        ),
        status=status,
    )


def _submit(request: WorkspaceRequest, workspace, task: AnnotationTask, mode: str) -> HttpResponse:
    position = request.POST.get("position", "")
    item = (
        items_of(task=task).filter(position=int(position)).first() if position.isdigit() else None
    )
    if item is None:
        raise Http404("no such item")
    values = values_from_post(task.schema, request.POST)
    write = services.annotation_submit if mode == "label" else services.annotation_adjudicate
    try:
        write(actor=request.user, task=task, item=item, values=values, role=request.workspace_role)
    except ValidationError as exc:
        errors = {k.removeprefix("values."): v for k, v in exc.message_dict.items()}
        return _item_view(
            request, workspace, task, item, mode=mode, errors=errors, chosen=values, status=400
        )
    except ConflictError as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(
            request, f"Item {item.position + 1} {'labelled' if mode == 'label' else 'adjudicated'}."
        )
    return redirect(f"curation-task-{mode}", ws=workspace.slug, name=task.name)


@workspace_page()
def label_page(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    task = _task(workspace, name)
    if not services.may_annotate(task, request.user, request.workspace_role):
        raise PermissionDenied("You are not an annotator of this task.")
    if request.method == "POST":
        return _submit(request, workspace, task, "label")
    return _item_view(
        request, workspace, task, services.next_item(task, request.user), mode="label"
    )


@workspace_page()
def review_page(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    task = _task(workspace, name)
    if not services.may_review(task, request.user, request.workspace_role):
        raise PermissionDenied("You are not a reviewer of this task.")
    if request.method == "POST":
        return _submit(request, workspace, task, "review")
    item = items_of(task=task).filter(status=ItemStatus.DISPUTED).first()
    return _item_view(request, workspace, task, item, mode="review")
