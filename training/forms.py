"""Browser forms of training: a new job, a new pipeline run. They parse input and hand it to the
services (``training.services.job_create``, ``training.pipelines.pipeline_run_start``), which
hold the rules; the services' ValidationErrors are put back next to the field they name."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from curation.models import RecordSetStatus
from curation.selectors import record_sets_of
from features.models import Dataset, DatasetStatus
from training.models import EntryPoint, Pipeline, PriorityClass, TuningMetric, TuningPruner
from training.params import Param, param_text, params_schema, template_names

# A template job's param ``<name>`` is the form field ``param_<name>``; an object param's key
# ``<key>`` is ``param_<name>__<key>``.
PARAM_PREFIX = "param_"
# The template a new job's form starts on: the platform's ranking model, whatever name sorts
# first in the list.
DEFAULT_TEMPLATE = "fine_ranking"


def dataset_templates() -> list[str]:
    """The built-in templates these forms offer: those trained on a dataset (a language-model
    template, ``lm_lora`` or ``lm_full``, trains on a record set)."""
    from training.services import LM_TEMPLATES

    return [name for name in template_names() if name not in LM_TEMPLATES]


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
        # "params.epochs" (a rule on one param) belongs next to that param's own field, or
        # else next to the params field, saying which param it is about.
        target = aliases.get(key, key)
        named = target in form.fields
        if not named and key:
            target = aliases.get(key.split(".")[0], key.split(".")[0])
        if target not in form.fields:
            target = None
        for message in messages:
            if not named and key:
                message = f"{key}: {message}"
            form.add_error(target, message)


class IntListField(forms.CharField):
    """Whole numbers separated by commas (``64, 32``) as a list of ints."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[int] | None:
        if isinstance(value, list | tuple):
            return [int(v) for v in value]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


def param_field(name: str, param: Param) -> forms.Field:
    """The form field of one param: a number input with its bounds, a checkbox, a select of
    the choices or a text input; prefilled with the default. Blank means the default; the
    bounds themselves are the service's check, whose error is shown next to the field."""
    allowed = f"Give {param.allowed()}."
    messages = {"invalid": allowed, "invalid_choice": allowed, "required": allowed}
    says = (
        ""
        if param.type in {"bool", "str"}
        else f" {param.allowed()[:1].upper()}{param.allowed()[1:]}."
    )
    default = "" if param.default == "" else f" Default: {param_text(param.default)}."
    common = {
        "label": param.title(name),
        "initial": param.default,
        "help_text": f"{param.help}{says}{default}",
        "error_messages": messages,
    }
    bounds = {
        key: _widget_number(value)
        for key, value in (("min", param.min), ("max", param.max))
        if value is not None
    }
    if param.type == "int":
        return forms.IntegerField(
            required=False, widget=forms.NumberInput(attrs={**bounds, "step": "1"}), **common
        )
    if param.type == "float":
        return forms.FloatField(
            required=False, widget=forms.NumberInput(attrs={**bounds, "step": "any"}), **common
        )
    if param.type == "bool":
        return forms.BooleanField(required=False, **common)
    if param.type == "choice":
        return forms.ChoiceField(choices=[(c, c) for c in param.choices], **common)
    if param.type == "int_list":
        return IntListField(required=False, **common)
    return forms.CharField(required=False, **common)


def _widget_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


class JobCreateForm(forms.Form):
    """A new training job: a built-in template (one field per param of its schema) or one of the
    workspace's entry points (free JSON params)."""

    name = forms.CharField(max_length=63, help_text="Lower case letters, digits and dashes.")
    dataset = forms.ChoiceField(required=False)
    record_set = forms.ChoiceField(
        required=False,
        label="or a record set",
        help_text="Picked, it is the input instead of the dataset: a ranking sample (a "
        "pipeline's format to: ranking) for a ranking template, instructions or chats for "
        "lm_lora or lm_full.",
    )
    code = forms.ChoiceField(label="Template or entry point")
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        help_text='A JSON object of what the entry point reads, e.g. {"epochs": 2, "depth": 3}.',
    )
    cpu_milli = forms.IntegerField(label="CPU (milli-cores)", initial=1000)
    memory_mb = forms.IntegerField(label="Memory (MiB)", initial=1024)
    gpu_count = forms.IntegerField(label="Whole GPUs", initial=0)
    gpu_milli = forms.IntegerField(label="GPU fraction (milli-GPU)", initial=0)
    gpu_type = forms.CharField(label="GPU type", max_length=40, required=False)
    workers = forms.IntegerField(
        label="Workers (data-parallel ranks)",
        initial=1,
        required=False,
        help_text="Each with the CPU, memory and GPUs above; 1-16. Neural templates and entry "
        "points only (logreg with solver adam).",
    )
    priority_class = forms.ChoiceField(
        choices=PriorityClass.choices,
        initial=PriorityClass.EXPERIMENT,
        error_messages=_choice_messages(PriorityClass.choices),
    )
    preemptible = forms.BooleanField(required=False)

    # Service error keys that belong to a differently named field here.
    SERVICE_FIELDS = {"template": "code", "entry_point": "code"}

    def __init__(self, *args, workspace, params_url: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.workspace = workspace
        datasets = Dataset.objects.for_workspace(workspace).filter(status=DatasetStatus.READY)
        dataset_choices = [(str(d.pk), f"{d.name} v{d.version}") for d in datasets]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["dataset"].choices = dataset_choices  # type: ignore[attr-defined]
        self.fields["dataset"].error_messages.update(_choice_messages(dataset_choices))
        record_sets = record_sets_of(workspace=workspace).filter(status=RecordSetStatus.READY)
        record_set_choices = [(str(r.pk), f"{r.name} v{r.version}") for r in record_sets]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["record_set"].choices = [("", "—"), *record_set_choices]  # type: ignore[attr-defined]
        self.fields["record_set"].error_messages.update(_choice_messages(record_set_choices))
        offer = template_names() if record_set_choices else dataset_templates()
        templates = [(f"template:{name}", name) for name in offer]
        entries = [
            (f"entry_point:{e.name}", e.name)
            for e in EntryPoint.objects.for_workspace(workspace).order_by("name")
        ]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["code"].choices = [("Built-in templates", templates)] + (  # type: ignore[attr-defined]
            [("Entry points of this workspace", entries)] if entries else []
        )
        self.fields["code"].error_messages.update(_choice_messages(templates + entries))
        if params_url:
            # The param fields follow the picked template (htmx swaps the fragment in).
            self.fields["code"].widget.attrs.update(
                {
                    "hx-get": params_url,
                    "hx-target": "#job-params",
                    "hx-swap": "outerHTML",
                    "hx-trigger": "change",
                }
            )
        offered = {value for value, _ in templates + entries}
        picked = self.data.get("code") if self.is_bound else self.initial.get("code")
        if picked not in offered:
            default = f"template:{DEFAULT_TEMPLATE}"
            picked = default if default in offered else (templates[0][0] if templates else "")
            if not self.is_bound:
                self.initial["code"] = picked  # the select shows the template the fields are for
        kind, _, code = str(picked).partition(":")
        # The template whose param fields the form holds ("" for an entry point).
        self.template = code if kind == "template" else ""
        self.schema = params_schema(self.template, workspace=workspace) if self.template else {}
        self.param_names: dict[str, tuple[str, str]] = {}  # field -> (param, object key)
        for name, param in self.schema.items():
            for key, sub in param.fields.items() if param.type == "object" else [("", param)]:
                field_name = f"{PARAM_PREFIX}{name}" + (f"__{key}" if key else "")
                self.fields[field_name] = param_field(key or name, sub)
                self.param_names[field_name] = (name, key)
        self.service_fields = {
            **self.SERVICE_FIELDS,
            **{f"params.{name}": field for field, (name, _) in self.param_names.items()},
        }

    @property
    def param_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.param_names]

    def _param_fields(self, *, advanced: bool) -> list[forms.BoundField]:
        return [
            self[field]
            for field, (name, _) in self.param_names.items()
            if self.schema[name].advanced == advanced
        ]

    @property
    def main_param_fields(self) -> list[forms.BoundField]:
        return self._param_fields(advanced=False)

    @property
    def advanced_param_fields(self) -> list[forms.BoundField]:
        return self._param_fields(advanced=True)

    @property
    def advanced_param_errors(self) -> bool:
        return any(bound.errors for bound in self.advanced_param_fields)

    def clean_params(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("params", ""), field="params")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.template and data.get("params"):
            self.add_error(
                None,
                f"A built-in template takes only its own params (the fields shown for "
                f"{self.template}); free JSON params are for entry points.",
            )
        return data

    def template_params(self) -> dict[str, Any]:
        """The template's params a person set: those changed from their defaults."""
        params: dict[str, Any] = {}
        for field_name, (name, key) in self.param_names.items():
            value = self.cleaned_data.get(field_name)
            if field_name not in self.changed_data or value is None or value == "":
                continue  # blank: the default
            if key:
                params.setdefault(name, {})[key] = value
            else:
                params[name] = value
        return params

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``job_create`` (besides actor and workspace)."""
        data = self.cleaned_data
        kind, _, code = data["code"].partition(":")
        # a record set picked is the input, whatever the dataset select still shows
        record_set = data.get("record_set")
        dataset = None if record_set else data.get("dataset")
        return {
            "name": data["name"],
            "dataset": (
                Dataset.objects.for_workspace(self.workspace).get(pk=int(dataset))
                if dataset
                else None
            ),
            "record_set": (
                record_sets_of(workspace=self.workspace).get(pk=int(record_set))
                if record_set
                else None
            ),
            "template": code if kind == "template" else "",
            "entry_point": code if kind == "entry_point" else "",
            "params": self.template_params() if kind == "template" else data["params"],
            "cpu_milli": data["cpu_milli"],
            "memory_mb": data["memory_mb"],
            "gpu_count": data["gpu_count"],
            "gpu_milli": data["gpu_milli"],
            "gpu_type": data["gpu_type"],
            "workers": 1 if data["workers"] is None else data["workers"],
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
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["pipeline"].choices = pipelines  # type: ignore[attr-defined]
        self.fields["pipeline"].error_messages.update(_choice_messages(pipelines))
        names = sorted(
            set(
                Dataset.objects.for_workspace(workspace)
                .filter(status=DatasetStatus.READY)
                .values_list("name", flat=True)
            )
        )
        dataset_choices = [(n, n) for n in names]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["dataset"].choices = [("", "— none (give it in params) —"), *dataset_choices]  # type: ignore[attr-defined]
        self.fields["dataset"].error_messages.update(_choice_messages(dataset_choices))

    def clean_params(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("params", ""), field="params")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("dataset") and isinstance(data.get("params"), dict):
            data["params"] = {"dataset": data["dataset"], **data["params"]}
        return data


class TuningCreateForm(forms.Form):
    """A new tuning job: a template and dataset (or a job to copy them from, ``?base_job=``),
    the search space as JSON (the template's default shown), fixed params, the budget. The rules
    are ``training.tuning.tuning_job_create``'s; its errors come back next to the field."""

    name = forms.CharField(max_length=63, help_text="Lower case letters, digits and dashes.")
    template = forms.ChoiceField()
    dataset = forms.ChoiceField()
    space = forms.CharField(
        label="Search space (JSON)",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text='Each searched param: {"low": .., "high": .., "log": true} or '
        "{\"choices\": [..]}, within the param's own bounds. Blank: the template's default.",
        required=False,
    )
    params = forms.CharField(
        label="Fixed params (JSON)",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        required=False,
        initial='{"epochs": 3}',
        help_text="Every trial runs with these (not the searched ones), e.g. epochs.",
    )
    metric = forms.ChoiceField(choices=TuningMetric.choices, initial=TuningMetric.LOGLOSS)
    pruner = forms.ChoiceField(choices=TuningPruner.choices, initial=TuningPruner.MEDIAN)
    n_trials = forms.IntegerField(label="Trials (budget)", initial=8)
    max_minutes = forms.IntegerField(
        label="Minutes (budget)", required=False, help_text="Optional: stop after this long."
    )
    parallelism = forms.IntegerField(
        initial=2, help_text="Trials at once; at most what the workspace's quota holds."
    )
    seed = forms.IntegerField(initial=0)
    model_name = forms.CharField(
        max_length=63,
        required=False,
        help_text="The registered model the best trial becomes a version of (default: the "
        "tuning job's name).",
    )
    refit_cv_folds = forms.IntegerField(
        label="Refit the best with cv_folds",
        initial=0,
        min_value=0,
        max_value=20,
        required=False,
        error_messages={
            "min_value": "Give a whole number from 0 to 20 (0: off).",
            "max_value": "Give a whole number from 0 to 20 (0: off).",
            "invalid": "Give a whole number from 0 to 20 (0: off).",
        },
        help_text="0: register the best trial as it is. k (2 to 20): train its params once "
        "more with cv_folds = k, on the train and validation rows pooled, and register that; "
        "worth it when the validation split is small.",
    )
    cpu_milli = forms.IntegerField(label="CPU per trial (milli-cores)", initial=1000)
    memory_mb = forms.IntegerField(label="Memory per trial (MiB)", initial=1024)
    priority_class = forms.ChoiceField(
        choices=PriorityClass.choices,
        initial=PriorityClass.EXPERIMENT,
        error_messages=_choice_messages(PriorityClass.choices),
    )

    def __init__(self, *args, workspace, base_job=None, **kwargs) -> None:
        from training.tuning import default_space_json

        super().__init__(*args, **kwargs)
        self.workspace = workspace
        self.base_job = base_job
        datasets = Dataset.objects.for_workspace(workspace).filter(status=DatasetStatus.READY)
        dataset_choices = [(str(d.pk), f"{d.name} v{d.version}") for d in datasets]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["dataset"].choices = dataset_choices  # type: ignore[attr-defined]
        self.fields["dataset"].error_messages.update(_choice_messages(dataset_choices))
        templates = [(name, name) for name in dataset_templates()]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["template"].choices = templates  # type: ignore[attr-defined]
        self.fields["template"].error_messages.update(_choice_messages(templates))
        self.default_spaces = {name: default_space_json(name) for name in dataset_templates()}
        if not self.is_bound:
            picked = self.initial.get("template") or (
                DEFAULT_TEMPLATE if DEFAULT_TEMPLATE in self.default_spaces else templates[0][0]
            )
            self.initial["template"] = picked
            if base_job is not None:
                self._copy(base_job)
                picked = self.initial["template"]
            self.initial.setdefault("space", json.dumps(self.default_spaces.get(picked, {})))

    def _copy(self, job) -> None:
        """Prefill from a job: template, dataset, its params (less the searched ones) and
        resources."""
        from training.tuning import default_space_json

        space = default_space_json(job.template)
        params = {k: v for k, v in (job.params or {}).items() if k not in space}
        self.initial.update(
            template=job.template,
            dataset=str(job.dataset_id),
            params=json.dumps(params),
            space=json.dumps(space),
            cpu_milli=job.cpu_milli,
            memory_mb=job.memory_mb,
            priority_class=job.priority_class,
            name=f"tune-{job.name}"[:63],
        )

    def clean_space(self) -> dict[str, Any] | None:
        raw = (self.cleaned_data.get("space") or "").strip()
        if not raw:
            return None
        return _json_object(raw, field="space")

    def clean_params(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("params", ""), field="params")

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``tuning_job_create`` (besides actor and workspace); a job the
        form was copied from is recorded as the tuning job's base job."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "template": data["template"],
            "dataset": Dataset.objects.for_workspace(self.workspace).get(pk=int(data["dataset"])),
            "space": data["space"],
            "params": data["params"],
            "metric": data["metric"],
            "pruner": data["pruner"],
            "n_trials": data["n_trials"],
            "max_minutes": data["max_minutes"],
            "parallelism": data["parallelism"],
            "seed": data["seed"],
            "model_name": data["model_name"],
            "refit_cv_folds": data["refit_cv_folds"] or 0,
            "cpu_milli": data["cpu_milli"],
            "memory_mb": data["memory_mb"],
            "priority_class": data["priority_class"],
            "base_job": self.base_job,
        }
