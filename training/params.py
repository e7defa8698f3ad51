"""Training params: the typed schema of what a job may be given, the one check at job creation,
and a job's hyperparameters as it ran them (the job page and the version comparison show both
the params it was given and the defaults its template fills in).

``COMMON`` holds what the runner, the data loader, evaluation, the agent and the scheduler read
from every job's params; each built-in template declares its own (``PARAMS`` in its module,
registered with ``training.bundle.register_template``). A template job may be given only the
params of its schema; an entry point (user code) reads whatever it documents, so its params are
free-form and only ``COMMON``'s rules apply to the names it shares.

No Django at import time: the training child imports the templates, which import this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

PARAM_TYPES = ("int", "float", "bool", "str", "choice", "int_list", "object")


class ParamError(ValueError):
    """A value its param's schema does not allow: the message says what it allows."""


@dataclass(frozen=True)
class Param:
    """One param: its type, default, bounds (``min``/``max``, inclusive; for ``int_list`` each
    item's), ``choices`` (``choice``), ``fields`` (an ``object``'s own params) and help text."""

    type: str
    default: Any
    help: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    fields: Mapping[str, Param] = field(default_factory=dict)
    label: str = ""
    # Tuning few jobs need: a form shows it folded away.
    advanced: bool = False
    # Why the bounds are what they are, when a person should know (the workspace's limit).
    note: str = ""

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"unknown param type {self.type!r}")

    def title(self, name: str) -> str:
        """What a form labels the param ``name`` with."""
        return self.label or name.replace("_", " ").capitalize()

    def describe(self, name: str) -> dict[str, Any]:
        """The schema of the param ``name`` as the API shows it."""
        out: dict[str, Any] = {
            "type": self.type,
            "default": self.default,
            "label": self.title(name),
            "help": self.help,
            "allowed": self.allowed(),
            "advanced": self.advanced,
        }
        if self.min is not None:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        if self.choices:
            out["choices"] = list(self.choices)
        if self.fields:
            out["fields"] = {key: p.describe(key) for key, p in self.fields.items()}
        return out

    def _bounds(self) -> str:
        if self.min is not None and self.max is not None:
            return f"from {_number(self.min)} to {_number(self.max)}"
        if self.min is not None:
            return f"of at least {_number(self.min)}"
        if self.max is not None:
            return f"of at most {_number(self.max)}"
        return ""

    def allowed(self) -> str:
        """What the param allows, in words (the error messages and the form's help say it)."""
        bounds = self._bounds()
        if self.type == "int":
            text = f"a whole number {bounds}".rstrip()
        elif self.type == "float":
            text = f"a number {bounds}".rstrip()
        elif self.type == "bool":
            text = "true or false"
        elif self.type == "choice":
            text = "one of: " + ", ".join(self.choices)
        elif self.type == "int_list":
            text = "whole numbers separated by commas" + (f", each {bounds}" if bounds else "")
        elif self.type == "object":
            text = "an object with: " + ", ".join(sorted(self.fields))
        else:
            text = "text"
        return f"{text} ({self.note})" if self.note else text

    def _refuse(self) -> ParamError:
        return ParamError(f"Give {self.allowed()}.")

    def _in_bounds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def clean(self, value: Any) -> Any:
        """The value normalised (``2.0`` -> ``2`` for an int, ``"64,32"`` -> ``[64, 32]``);
        ``ParamError`` when the schema does not allow it. ``object`` values: see ``check``."""
        if self.type == "int":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not self._in_bounds(value):
                raise self._refuse()
            return value
        if self.type == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._refuse()
            if not math.isfinite(value) or not self._in_bounds(value):
                raise self._refuse()
            return float(value)
        if self.type == "bool":
            if not isinstance(value, bool):
                raise self._refuse()
            return value
        if self.type == "choice":
            if value not in self.choices:
                raise self._refuse()
            return value
        if self.type == "int_list":
            items = value
            if isinstance(value, str):
                try:
                    items = [int(x) for x in value.split(",") if x.strip()]
                except ValueError:
                    raise self._refuse() from None
            if not isinstance(items, list | tuple) or not items:
                raise self._refuse()
            item = replace(self, type="int", note="")
            try:
                return [item.clean(x) for x in items]
            except ParamError:
                raise self._refuse() from None
        if self.type == "str":
            if not isinstance(value, str):
                raise self._refuse()
            return value
        cleaned, errors = check(self.fields, value, free=False, prefix="")
        if errors:
            raise ParamError("; ".join(f"{k}: {v}" for k, v in errors.items()))
        return cleaned


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# What every job's params may hold, whatever its code: read by the runner
# (training/runner.py), the data loader (data.py), the agent (agent.py) and the scheduler's
# admission (scheduler/admission.py). Keep it in step with what those read.
COMMON: dict[str, Param] = {
    "epochs": Param("int", 2, "Passes over the training rows.", min=1, max=1000),
    "max_steps": Param(
        "int", 0, "Stop after this many optimiser steps (0: epochs decide).", min=0, max=10**7
    ),
    "batch_size": Param("int", 512, "Rows per optimiser step.", min=1, max=1_000_000),
    "lr": Param("float", 0.01, "Adam learning rate.", min=0.0, max=10.0, label="Learning rate"),
    "weight_decay": Param("float", 0.0, "Adam weight decay (L2).", min=0.0, max=1.0),
    "seed": Param("int", 0, "Fixes initialisation and batch order.", min=0, max=2**31 - 1),
    "holdout_fraction": Param(
        "float",
        0.2,
        "The newest share of rows held out for evaluation (a time-ordered split).",
        min=0.0,
        max=0.9,
    ),
    "validation_fraction": Param(
        "float",
        0.1,
        "The newest share of the training rows (before the held-out rows) kept for early "
        "stopping and calibration (0: no validation, no early stopping, no calibration).",
        min=0.0,
        max=0.5,
    ),
    "split_column": Param(
        "str",
        "",
        'A dataset column whose values ("train", "validation", "test") assign each row its '
        "split, instead of the fractions (blank: the fractions).",
        advanced=True,
    ),
    "early_stopping_metric": Param(
        "choice",
        "logloss",
        "The validation metric early stopping watches (and the best epoch is chosen by).",
        choices=("logloss", "auc"),
        advanced=True,
    ),
    "early_stopping_patience": Param(
        "int",
        2,
        "Stop after this many epochs without a better validation metric, and keep the best "
        "epoch's model (0: train every epoch and keep the last).",
        min=0,
        max=1000,
    ),
    "calibration": Param(
        "choice",
        "temperature",
        "Post-hoc calibration fitted on the validation rows: one temperature on the logits, "
        "an isotonic map of the probability, or none.",
        choices=("temperature", "isotonic", "none"),
    ),
    "vocab_min_count": Param(
        "int",
        2,
        "Categorical values seen fewer times than this in the training rows share the "
        "out-of-vocabulary embedding (as do values first seen after training). 2, as FuxiCTR's "
        "Criteo configurations use: a value seen once would get an embedding trained on one "
        "row, and the rare values are what teaches the out-of-vocabulary row, which unseen "
        "values at serving then use; 1 keeps every value (FuxiCTR's MovieLens setting).",
        min=1,
        max=1_000_000,
        label="Vocabulary minimum count",
        advanced=True,
    ),
    "max_vocab": Param(
        "int",
        100_000,
        "A categorical feature with more kept values than this is hashed instead of given a "
        "vocabulary (bounds the embedding table).",
        min=1,
        max=10_000_000,
        label="Largest vocabulary",
        advanced=True,
    ),
    "max_list_length": Param(
        "int",
        8,
        "Items of a list-of-categories feature the model reads per row (the first ones; at "
        "most the longest list in the training rows).",
        min=1,
        max=1024,
        label="Longest category list",
        advanced=True,
    ),
    "numeric_transform": Param(
        "choice",
        "standard",
        "Numeric (float, int) features: standardised with the training rows' mean and "
        "standard deviation, or log(1 + max(x, 0)) first, for heavy-tailed counts such as "
        "Criteo's integer fields. A null becomes the mean; a bool is 0/1.",
        choices=("standard", "log"),
        advanced=True,
    ),
    "label": Param(
        "str", "", "Label column (blank: the dataset's first label).", label="Label column"
    ),
    "slice_column": Param("str", "", "Column to break the held-out metrics down by (blank: none)."),
    "device": Param(
        "str",
        "auto",
        'Torch device: "auto" (CUDA when there is one), "cpu", "cuda", "cuda:1".',
        advanced=True,
    ),
    "threads": Param(
        "int",
        0,
        "CPU threads for torch, or LightGBM's num_threads (0: the library's default).",
        min=0,
        max=256,
        advanced=True,
    ),
    "log_every_steps": Param(
        "int", 10, "Progress and loss every N steps.", min=1, max=100_000, advanced=True
    ),
    "checkpoint_every_steps": Param(
        "int", 200, "Checkpoint every N steps.", min=1, max=10_000_000, advanced=True
    ),
    "checkpoint_every_s": Param(
        "float",
        30.0,
        "Checkpoint at least this often (seconds).",
        min=0.1,
        max=86_400.0,
        advanced=True,
    ),
    "epoch_eval": Param(
        "bool",
        True,
        "Held-out AUC and log loss after every epoch.",
        label="Evaluate after every epoch",
        advanced=True,
    ),
    "importance": Param(
        "bool",
        True,
        "Permutation feature importance on the held-out rows.",
        label="Feature importance",
        advanced=True,
    ),
    "step_sleep_s": Param(
        "float",
        0.0,
        "Pause after each step (a throttle for demos; 0: full speed).",
        min=0.0,
        max=10.0,
        advanced=True,
    ),
    "scheduler": Param(
        "object",
        {},
        "Scheduling options.",
        fields={
            "auto_recommend": Param(
                "bool",
                False,
                "Exploration jobs: apply the resource recommendation at admission.",
                label="Apply the resource recommendation at admission",
            )
        },
        advanced=True,
    ),
}


def template_schemas() -> dict[str, dict[str, Param]]:
    """Each built-in template's own params (without ``COMMON``), by template name."""
    import training.templates  # noqa: F401  (registers the built-in templates)
    from training.bundle import TEMPLATE_PARAMS

    return {name: dict(TEMPLATE_PARAMS[name]) for name in sorted(TEMPLATE_PARAMS)}


def template_names() -> list[str]:
    return list(template_schemas())


def _with_policy(schema: dict[str, Param], workspace) -> dict[str, Param]:
    """``epochs`` and ``max_steps`` bounded by the workspace's policy (``max_job_epochs``,
    ``max_job_steps``; the platform defaults without a workspace)."""
    from workspaces.selectors import workspace_policy

    policy = workspace_policy(workspace)
    limited = dict(schema)
    note = "the workspace's limit"
    limited["epochs"] = replace(schema["epochs"], max=policy.max_job_epochs, note=note)
    limited["max_steps"] = replace(schema["max_steps"], max=policy.max_job_steps, note=note)
    return limited


def params_schema(template: str = "", *, workspace=None, policy: bool = True) -> dict[str, Param]:
    """The params a job of ``template`` may be given (``COMMON`` and the template's own; only
    ``COMMON`` for an entry point or an unknown template), the training length bounded by the
    workspace's policy unless ``policy`` is false (no database then). A template may declare a
    shared param itself to give it a default of its own (``lm_full``'s ``lr``), its type and
    bounds unchanged."""
    own = template_schemas().get(template, {}) if template else {}
    # the template's own first: what a form shows first
    schema = {**own, **{name: p for name, p in COMMON.items() if name not in own}}
    return _with_policy(schema, workspace) if policy else schema


def params_defaults(template: str) -> dict[str, Any]:
    """The value each param of ``template`` has when a job is not given it."""
    return {name: param.default for name, param in params_schema(template, policy=False).items()}


def params_resolved(template: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """What a template job runs with: its params over its template's defaults."""
    return {**params_defaults(template), **params}


def check(
    schema: Mapping[str, Param], params: Any, *, free: bool, prefix: str = "params"
) -> tuple[dict[str, Any], dict[str, str]]:
    """Params against ``schema``: the normalised params and the errors by field
    (``params.<name>``). ``free`` lets names outside the schema through unchecked."""
    where = (lambda name: f"{prefix}.{name}") if prefix else str
    if not isinstance(params, dict):
        return {}, {prefix or "value": "Give an object."}
    cleaned: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, value in params.items():
        param = schema.get(name)
        if param is None:
            if free:
                cleaned[name] = value
            else:
                errors[where(name)] = "Unknown param; use one of: " + ", ".join(sorted(schema))
            continue
        try:
            cleaned[name] = param.clean(value)
        except ParamError as exc:
            errors[where(name)] = str(exc)
    return cleaned, errors


def job_params_check(
    *, template: str, entry_point: str = "", params: Any, workspace=None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The one check of a new job's params: a built-in template's job only its schema's params,
    each of its type and within its bounds (``epochs``/``max_steps`` within the workspace's
    policy); an entry point's (or an unknown template's) anything, with ``COMMON``'s rules on
    the names it shares. Returns the normalised params and the errors by ``params.<name>``."""
    known = bool(template) and not entry_point and template in template_schemas()
    cleaned, errors = check(
        params_schema(template if known else "", workspace=workspace), params, free=not known
    )
    if int(cleaned.get("cv_folds", 0) or 0) >= 2 and int(cleaned.get("members", 1) or 1) > 1:
        errors["params.cv_folds"] = (
            "cv_folds cannot be combined with members > 1 (the folds' models are the members); "
            "give one of them"
        )
    return cleaned, errors


def job_hyperparameters(job) -> list[dict[str, Any]]:
    """``[{"name", "value", "source"}]`` sorted by name; ``source`` is ``"set"`` for a param the
    job was given and ``"default"`` for one its template fills in."""
    given = dict(job.params or {})
    defaults = params_defaults(job.template) if job.template else {}
    rows = [{"name": name, "value": given[name], "source": "set"} for name in given] + [
        {"name": name, "value": value, "source": "default"}
        for name, value in defaults.items()
        if name not in given
    ]
    return sorted(rows, key=lambda row: row["name"])


def param_text(value: Any) -> str:
    """A param value as a person reads it: lists comma-separated, empty strings marked."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(param_text(v) for v in value) or "(empty list)"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {param_text(v)}" for k, v in sorted(value.items())) or "(empty)"
    if value == "":
        return "(empty)"
    return str(value)


# Below this many validation rows a job's page suggests ``cv_folds``. A row's log loss varies
# by about 0.5 around its mean (clicks near 50 %), so the validation log loss of n rows has a
# standard error of about 0.5 / sqrt(n): 0.016 at 1,000 rows, as large as the gaps between
# tuned templates on the bench's datasets (``bench/results/quality.json``), and 0.11 at the
# Criteo sample's 20, where early stopping, calibration and tuning follow noise.
CV_HINT_BELOW_VALIDATION_ROWS = 1000
CV_HINT_FOLDS = 5


def small_validation_hint(job) -> str:
    """What the job page says when the job validated on few rows and its template could have
    cross-fitted (it has ``cv_folds``, the job did not use it); empty otherwise."""
    validation = (job.metrics or {}).get("validation") or {}
    rows = validation.get("rows")
    schema = template_schemas().get(job.template or "", {})
    if "cv_folds" not in schema or not isinstance(rows, int):
        return ""
    if rows >= CV_HINT_BELOW_VALIDATION_ROWS or int(job.params.get("cv_folds") or 0) >= 2:
        return ""
    return (
        f"The validation split held only {rows} rows: early stopping, calibration and any "
        f"choice between runs follow noise at this size (a log loss over {rows} rows is "
        f"uncertain by about {0.5 / max(rows, 1) ** 0.5:.2f}). Run it again with cv_folds = "
        f"{CV_HINT_FOLDS}: each fold's model trains without it and the validation metrics "
        "are out of fold over all the training rows."
    )
