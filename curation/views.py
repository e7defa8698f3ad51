"""Browser pages of data building, under /w/<ws>/data/: the record sets (upload one), a record
set's page (its columns, first rows, and for a pipeline's output each stage's report with
examples of what each rule removed), and the form that runs a pipeline over it."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from curation import services, stages
from curation.models import RecordSet, RecordSetStatus, name_validator
from curation.selectors import record_set_get, record_set_rows, record_sets_of
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

FORMAT_CHOICES = [("", "From the file name")] + [(f, f) for f in services.UPLOAD_FORMATS]


class UploadForm(forms.Form):
    name = forms.CharField(max_length=63, validators=[name_validator])
    file = forms.FileField(
        help_text="JSON Lines (one object a line), Parquet or CSV with a header."
    )
    format = forms.ChoiceField(choices=FORMAT_CHOICES, required=False)


class PipelineForm(forms.Form):
    name = forms.CharField(
        max_length=63, validators=[name_validator], help_text="The output record set."
    )
    stages = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false", "class": "mono"}),
        help_text="A JSON list of stages; kinds: " + ", ".join(stages.KINDS) + ".",
    )

    def clean_stages(self) -> Any:
        try:
            return json.loads(self.cleaned_data["stages"])
        except json.JSONDecodeError as exc:
            raise ValidationError(f"not JSON: {exc.msg} at line {exc.lineno}") from exc


def _service_errors(form: forms.Form, exc: ValidationError | ConflictError, field: str) -> None:
    if isinstance(exc, ConflictError):
        form.add_error(None, str(exc))
        return
    for key, problems in (
        exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
    ).items():
        target = key if key in form.fields else field
        for problem in problems:
            form.add_error(target, problem if key in form.fields else f"{key}: {problem}")


def _found(workspace, name: str, version: int) -> RecordSet:
    try:
        return record_set_get(workspace=workspace, name=name, version=version)
    except ReferenceNotFound as exc:
        raise Http404(f"no record set '{name}' v{version}") from exc


def _can_write(request: WorkspaceRequest) -> bool:
    return role_at_least(request.workspace_role, Role.DEVELOPER)


@workspace_page()
def record_set_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    status = 200
    form = UploadForm()
    if request.method == "POST":
        if not _can_write(request):
            return HttpResponse("Uploading needs the developer role.", status=403)
        form = UploadForm(request.POST, request.FILES)
        status = 400
        if form.is_valid():
            upload = form.cleaned_data["file"]
            try:
                record_set = services.record_set_upload(
                    actor=request.user,
                    workspace=workspace,
                    name=form.cleaned_data["name"],
                    content=upload.read(),
                    fmt=form.cleaned_data["format"] or services.format_of(upload.name),
                )
            except (ValidationError, ConflictError) as exc:
                _service_errors(form, exc, "file")
            else:
                messages.success(
                    request, f"Uploaded {record_set.row_count} records as {record_set}."
                )
                return redirect(
                    "curation-record-set",
                    ws=workspace.slug,
                    name=record_set.name,
                    version=record_set.version,
                )
    page = Paginator(record_sets_of(workspace=workspace), 50).get_page(request.GET.get("page"))
    return render(
        request,
        "curation/record_set_list.html",
        page_context(request, page=page, form=form, can_write=_can_write(request), section="data"),
        status=status,
    )


def example_stages(record_set: RecordSet) -> list[dict[str, Any]]:
    """A pipeline that fits the record set's columns, to start the form from."""
    text = [c["name"] for c in record_set.columns if c["type"] in ("string", "large_string")]
    if not text:
        return [
            {
                "kind": "filter",
                "rules": [
                    {"rule": "field", "column": record_set.columns[0]["name"], "op": "not_null"}
                ],
            }
        ]
    field = text[0]
    pipeline: list[dict[str, Any]] = [
        {
            "kind": "filter",
            "field": field,
            "rules": [
                {"rule": "min_words", "value": 3},
                {"rule": "max_length", "value": 20000},
                {"rule": "alpha_ratio", "min": 0.5},
                {"rule": "repeated_lines", "max": 0.3},
            ],
        },
        {"kind": "scrub", "fields": text, "patterns": list(stages.SCRUB_PATTERNS)},
        {"kind": "dedup", "field": field, "threshold": 0.8},
    ]
    if len(text) >= 2:
        pipeline.append(
            {"kind": "format", "to": "instruction", "instruction": text[0], "output": text[1]}
        )
    return pipeline


@workspace_page()
def record_set_page(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    record_set = _found(workspace, name, version)
    status = 200
    form = PipelineForm(
        initial={
            "name": f"{record_set.name}_clean" if len(record_set.name) <= 57 else record_set.name,
            "stages": json.dumps(example_stages(record_set), indent=2)
            if record_set.columns
            else "[]",
        }
    )
    if request.method == "POST":
        if not _can_write(request):
            return HttpResponse("Running a pipeline needs the developer role.", status=403)
        form = PipelineForm(request.POST)
        status = 400
        if form.is_valid():
            try:
                output = services.pipeline_run(
                    actor=request.user,
                    workspace=workspace,
                    source=record_set,
                    name=form.cleaned_data["name"],
                    stages=form.cleaned_data["stages"],
                )
            except (ValidationError, ConflictError) as exc:
                _service_errors(form, exc, "stages")
            else:
                messages.success(request, f"Building {output}: {len(output.stages)} stages.")
                return redirect(
                    "curation-record-set",
                    ws=workspace.slug,
                    name=output.name,
                    version=output.version,
                )
    return render(
        request,
        "curation/record_set_detail.html",
        page_context(
            request,
            record_set=record_set,
            rows=record_set_rows(record_set),
            form=form,
            can_write=_can_write(request),
            reports=_reports(record_set),
            children=record_sets_of(workspace=workspace).filter(parent=record_set),
            section="data",
            kinds=stages.KINDS,
            rules=stages.FILTER_RULES,
            patterns=list(stages.SCRUB_PATTERNS),
            ops=stages.FIELD_OPS,
            formats=stages.FORMATS,
        ),
        status=status,
    )


def _reports(record_set: RecordSet) -> list[dict[str, Any]]:
    """Each stage with its report (when run), removed and changed counts as rows."""
    out = []
    for index, stage in enumerate(record_set.stages):
        report = record_set.reports[index] if index < len(record_set.reports) else None
        items = []
        if report is not None:
            for label, count in report["removed"].items():
                items.append(
                    {
                        "label": label,
                        "count": count,
                        "what": "removed",
                        "examples": report["examples"].get(label, []),
                    }
                )
            for label, count in report["changed"].items():
                items.append(
                    {
                        "label": label,
                        "count": count,
                        "what": "changed",
                        "examples": report["examples"].get(label, [])
                        if label in report["examples"]
                        else [],
                    }
                )
            if report["kind"] in ("format", "scrub"):
                shown = {i["label"] for i in items}
                for label, examples in report["examples"].items():
                    if label not in shown:
                        items.append(
                            {
                                "label": label,
                                "count": None,
                                "what": "examples",
                                "examples": examples,
                            }
                        )
        out.append({"index": index + 1, "stage": stage, "report": report, "items": items})
    return out


@require_GET
@workspace_page()
def record_set_progress(
    request: WorkspaceRequest, workspace, name: str, version: int
) -> HttpResponse:
    """The stages done of a building record set, polled by htmx; reloads the page when over."""
    record_set = _found(workspace, name, version)
    response = render(
        request, "curation/_progress.html", {"record_set": record_set, "workspace": workspace}
    )
    if record_set.status != RecordSetStatus.BUILDING:
        response["HX-Refresh"] = "true"
    return response
