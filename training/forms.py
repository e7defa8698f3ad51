"""Browser forms of training: a new job, a new pipeline run. They parse input and hand it to the
services (``training.services.job_create``, ``training.pipelines.pipeline_run_start``), which
hold the rules; the services' ValidationErrors are put back next to the field they name."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from features.models import Dataset, DatasetStatus
from training.models import EntryPoint, Pipeline, PriorityClass

# What the runner and the agent read from ``params`` for every template (name: default).
COMMON_PARAMS: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 512,
    "lr": 0.01,
    "max_steps": 0,
    "label": "",
    "slice_column": "",
}


def template_params() -> dict[str, dict[str, Any]]:
    """Each built-in template's known params with their defaults (common ones included)."""
    from training.services import _known_templates
    from training.templates import fine_ranking, two_tower

    own = {"fine_ranking": fine_ranking.DEFAULTS, "two_tower": two_tower.DEFAULTS}
    return {name: {**COMMON_PARAMS, **own.get(name, {})} for name in sorted(_known_templates())}


def _choice_messages(choices: list[tuple[str, str]]) -> dict[str, str]:
    allowed = ", ".join(value for value, _ in choices) or "none available"
    return {"invalid_choice": f"Not one of the choices; use one of: {allowed}."}


def _json_object(raw: str, *, field: str) -> dict[str, Any]:
    text = (raw or "").strip() or "{}"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValidationError(f'{field} must be a JSON object, e.g. {{"epochs": 2}}')
    return value


def put_service_errors(form: forms.Form, exc: ValidationError, aliases: dict[str, str]) -> None:
    """Attach a service's ValidationError to the fields it names (or to the form)."""
    errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
    for key, messages in errors.items():
        # "params.epochs" (a rule on one param) belongs next to the params field.
        target = aliases.get(key, key)
        if target not in form.fields and key:
            target = aliases.get(key.split(".")[0], key.split(".")[0])
        if target not in form.fields:
            target = None
        for message in messages:
            if target is None and key:
                message = f"{key}: {message}"
            form.add_error(target, message)


class JobCreateForm(forms.Form):
    """A new training job: a built-in template or one of the workspace's entry points."""

    name = forms.CharField(max_length=63, help_text="Lower case letters, digits and dashes.")
    dataset = forms.ChoiceField()
    code = forms.ChoiceField(label="Template or entry point")
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        help_text='A JSON object, e.g. {"epochs": 2, "lr": 0.01}.',
    )
    cpu_milli = forms.IntegerField(label="CPU (milli-cores)", initial=1000)
    memory_mb = forms.IntegerField(label="Memory (MiB)", initial=1024)
    gpu_count = forms.IntegerField(label="Whole GPUs", initial=0)
    gpu_milli = forms.IntegerField(label="GPU fraction (milli-GPU)", initial=0)
    gpu_type = forms.CharField(label="GPU type", max_length=40, required=False)
    priority_class = forms.ChoiceField(
        choices=PriorityClass.choices,
        initial=PriorityClass.EXPERIMENT,
        error_messages=_choice_messages(PriorityClass.choices),
    )
    preemptible = forms.BooleanField(required=False)

    # Service error keys that belong to a differently named field here.
    SERVICE_FIELDS = {"template": "code", "entry_point": "code"}

    def __init__(self, *args, workspace, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.workspace = workspace
        datasets = Dataset.objects.for_workspace(workspace).filter(status=DatasetStatus.READY)
        dataset_choices = [(str(d.pk), f"{d.name} v{d.version}") for d in datasets]
        self.fields["dataset"].choices = dataset_choices
        self.fields["dataset"].error_messages.update(_choice_messages(dataset_choices))
        templates = [(f"template:{name}", name) for name in template_params()]
        entries = [
            (f"entry_point:{e.name}", e.name)
            for e in EntryPoint.objects.for_workspace(workspace).order_by("name")
        ]
        self.fields["code"].choices = [("Built-in templates", templates)] + (
            [("Entry points of this workspace", entries)] if entries else []
        )
        self.fields["code"].error_messages.update(_choice_messages(templates + entries))

    def clean_params(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("params", ""), field="params")

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``job_create`` (besides actor and workspace)."""
        data = self.cleaned_data
        kind, _, code = data["code"].partition(":")
        return {
            "name": data["name"],
            "dataset": Dataset.objects.for_workspace(self.workspace).get(pk=int(data["dataset"])),
            "template": code if kind == "template" else "",
            "entry_point": code if kind == "entry_point" else "",
            "params": data["params"],
            "cpu_milli": data["cpu_milli"],
            "memory_mb": data["memory_mb"],
            "gpu_count": data["gpu_count"],
            "gpu_milli": data["gpu_milli"],
            "gpu_type": data["gpu_type"],
            "priority_class": data["priority_class"],
            "preemptible": data["preemptible"],
        }


class PipelineCreateForm(forms.Form):
    """A pipeline of the workspace from the default template (build_samples -> train ->
    evaluate -> register); other stage graphs are defined over the API for now."""

    name = forms.CharField(max_length=63, initial="default")
    description = forms.CharField(required=False, max_length=500)


class PipelineRunForm(forms.Form):
    """A new run of one of the workspace's pipelines, on a dataset (by name) and params."""

    pipeline = forms.ChoiceField()
    dataset = forms.ChoiceField(
        required=False, help_text="Becomes params.dataset: build_samples makes a fresh version."
    )
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text='A JSON object; "<stage>.<param>" keys set one stage\'s param.',
    )

    def __init__(self, *args, workspace, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.workspace = workspace
        pipelines = [(p.name, p.name) for p in Pipeline.objects.for_workspace(workspace)]
        self.fields["pipeline"].choices = pipelines
        self.fields["pipeline"].error_messages.update(_choice_messages(pipelines))
        names = sorted(
            set(
                Dataset.objects.for_workspace(workspace)
                .filter(status=DatasetStatus.READY)
                .values_list("name", flat=True)
            )
        )
        dataset_choices = [(n, n) for n in names]
        self.fields["dataset"].choices = [("", "— none (give it in params) —"), *dataset_choices]
        self.fields["dataset"].error_messages.update(_choice_messages(dataset_choices))

    def clean_params(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("params", ""), field="params")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("dataset") and isinstance(data.get("params"), dict):
            data["params"] = {"dataset": data["dataset"], **data["params"]}
        return data
