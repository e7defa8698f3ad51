"""Training writes. ``job_transition`` is the only function that changes a job's ``state``."""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from curation.models import RecordSet, RecordSetStatus
from features import selectors as features_selectors
from features.models import Dataset, DatasetStatus
from training.models import (
    JOB_MOVES,
    TERMINAL_STATES,
    EntryPoint,
    EntryPointKind,
    JobMetric,
    JobState,
    PriorityClass,
    TrainingJob,
)
from training.params import job_params_check
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

if TYPE_CHECKING:
    from training.data import JobSpec
    from training.tuning import Registrar


class StaleAttempt(ConflictError):
    """A write from an attempt the job has moved past (its node was declared lost and the job
    runs, or ran, elsewhere): refused, and the writer should stop its child."""


def _fence(locked: TrainingJob, attempt: int | None) -> None:
    """Refuse a write from ``attempt`` unless it is the job's running attempt (the fencing
    token: ``attempts`` grows by one every time an agent starts the job)."""
    if attempt is None:
        return
    if locked.attempts != attempt or locked.state != JobState.RUNNING:
        raise StaleAttempt(
            f"attempt {attempt} of job {locked.pk} was superseded: the job is {locked.state} "
            f"at attempt {locked.attempts}",
            attr="attempt",
        )


@transaction.atomic
def job_transition(
    *,
    job: TrainingJob,
    to: str,
    actor: Actor = None,
    reason: str = "",
    expect: str | set[str] | None = None,
    resources: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    attempt: int | None = None,
    **fields: Any,
) -> TrainingJob:
    """Move ``job`` to state ``to`` (locking its row), set ``fields`` and record the event.

    ``expect`` guards against races: the move happens only if the locked row is still in that
    state (or one of those states); otherwise ``ConflictError``. Illegal moves raise too.
    ``attempt`` (a node agent's fencing token) refuses the move with ``StaleAttempt`` unless that
    attempt is the one running. The event verb is ``training.job.<to>`` with the job as subject
    and its dataset as input.
    """
    locked = TrainingJob.objects.unscoped().select_for_update().get(pk=job.pk)
    _fence(locked, attempt)
    if expect is not None:
        allowed = {expect} if isinstance(expect, str) else set(expect)
        if locked.state not in allowed:
            raise ConflictError(
                f"job {locked.pk} is {locked.state}, not {'/'.join(sorted(allowed))}", attr="state"
            )
    if to not in JOB_MOVES[locked.state]:
        raise ConflictError(
            f"job {locked.pk} cannot move from {locked.state} to {to}", attr="state"
        )
    now = timezone.now()
    locked.state = to
    locked.state_reason = reason[:500]
    if to == JobState.RUNNING and locked.started_at is None:
        locked.started_at = now
    if to in TERMINAL_STATES:
        locked.finished_at = now
    for name, value in fields.items():
        setattr(locked, name, value)
    locked.save()
    refs = [Ref.to(locked)]
    if locked.dataset_id:
        refs.append(Ref.to(locked.dataset, role="input"))
    if locked.record_set_id:
        refs.append(Ref.to(locked.record_set, role="input"))
    if locked.node_id:
        refs.append(Ref.to(locked.node, role="related"))
    event_record(
        actor=actor,
        workspace=locked.workspace,
        verb=f"training.job.{to}",
        refs=refs,
        resources=resources,
        payload={"reason": reason, **(payload or {})},
    )
    if to in TERMINAL_STATES:
        _wake_tuning(locked.pk)
    # Keep the caller's instance in step with the row.
    for field in locked._meta.concrete_fields:
        setattr(job, field.attname, getattr(locked, field.attname))
    return job


def job_attempt_current(job_id: int, attempt: int) -> bool:
    """Whether ``attempt`` is still the running attempt of the job (a read; the agent checks
    it before it copies a checkpoint into the job's folder)."""
    return (
        TrainingJob.objects.unscoped()
        .filter(pk=job_id, attempts=attempt, state=JobState.RUNNING)
        .exists()
    )


# --- jobs: create, stop, progress ---------------------------------------------------------------

STOP_MODES = {"preempt", "cancel"}
JOBS_DIR = "training/jobs"
ENTRY_POINTS_DIR = "training/entry_points"


def job_work_dir(job: TrainingJob) -> Path:
    """The job's folder under ARTIFACT_ROOT: spec, checkpoint, log, model bundle."""
    return Path(settings.ARTIFACT_ROOT) / JOBS_DIR / f"ws={job.workspace_id}" / f"job={job.pk}"


def job_max_wall_s(job: TrainingJob) -> float:
    """How long one attempt of ``job`` may run, in seconds: the workspace's policy
    (``max_job_wall_s``, platform default when the workspace sets none). The node agent stops a
    child that runs past it and the job ends failed."""
    from workspaces.selectors import workspace_policy

    return float(workspace_policy(job.workspace_id).max_job_wall_s)


def _known_templates() -> set[str]:
    """The built-in templates: those registered with a param schema."""
    from training.params import template_schemas

    return set(template_schemas())


def _model_kind(template: str, entry_point: str) -> str:
    """``"gbdt"`` (boosted trees, ``training.gbdt``) or ``"torch"`` for a job's model: an
    incremental job's base model must be of its own kind."""
    from training.bundle import template_kind

    return "torch" if entry_point or not template else template_kind(template)


MAX_WORKERS = 16


def _single_process(template: str, entry_point: str, params: dict[str, Any]) -> str:
    """What in a job keeps it to one process (blank: data-parallel ranks can train it)."""
    if _model_kind(template, entry_point) != "torch":
        return f"template {template}"
    if template and not entry_point:
        import training.templates  # noqa: F401  (registers the built-in templates' params)
        from training.bundle import TEMPLATE_PARAMS, averaged_members

        solver = TEMPLATE_PARAMS.get(template, {}).get("solver")
        if str(params.get("solver") or (solver.default if solver else "")) == "lbfgs":
            return "the lbfgs solver (give solver adam for data-parallel ranks)"
        if averaged_members(template, params) > 1:
            return "an averaged or cross-fitted members run"
    return ""


def check_job_input(
    *,
    workspace: Workspace,
    template: str,
    entry_point: str,
    dataset: Dataset | None,
    base_job: TrainingJob | None,
    params: Any,
    resources: dict[str, Any],
    priority_class: str,
    record_set: RecordSet | None = None,
) -> dict[str, Any]:
    """Every rule on a new job's input at once (``ValidationError`` by field); returns the
    params normalised by their schema (``training.params.job_params_check``). A language-model
    job (``lm_lora``, ``lm_full``) trains on a ready ``record_set``, every other job on a ready
    ``dataset``."""
    # What the job names must be of this workspace (404, another's like a missing one) ...
    if (
        entry_point
        and not template
        and not EntryPoint.objects.for_workspace(workspace).filter(name=entry_point).exists()
    ):
        raise ReferenceNotFound("no such entry point in this workspace", attr="entry_point")
    if dataset is not None and dataset.workspace_id != workspace.pk:
        raise ReferenceNotFound("no such dataset in this workspace", attr="dataset")
    if record_set is not None and record_set.workspace_id != workspace.pk:
        raise ReferenceNotFound("no such record set in this workspace", attr="record_set")
    if base_job is not None and base_job.workspace_id != workspace.pk:
        raise ReferenceNotFound("no such job in this workspace", attr="base_job")
    # ... and the rest is bad input (400), every field at once.
    errors: dict[str, str] = {}
    if bool(template) == bool(entry_point):
        errors["template"] = "give either a template or an entry_point"
    elif template and template not in _known_templates():
        errors["template"] = f"unknown template; use one of {sorted(_known_templates())}"
    language_model = bool(template) and template in LM_TEMPLATES and not entry_point
    if language_model:
        errors.update(_record_set_errors(record_set))
        if dataset is not None:
            errors["dataset"] = f"a {template} job trains on a record_set, not a dataset"
        if base_job is not None:
            errors["base_job"] = f"a {template} job starts from its base_model_path, not a job"
    elif record_set is not None:
        # a ranking sample built by a pipeline (format to: ranking) instead of a dataset
        errors.update(_ranking_record_set_errors(record_set, entry_point=bool(entry_point)))
        if dataset is not None:
            errors["dataset"] = "give a dataset or a record_set, not both"
    elif dataset is None:
        errors["dataset"] = "required"
    elif dataset.status != DatasetStatus.READY:
        errors["dataset"] = f"dataset is {dataset.status}, not ready"
    if base_job is None or language_model:
        pass  # nothing to continue from (a language model's base is its base_model_path)
    elif base_job.state != JobState.SUCCEEDED:
        errors["base_job"] = "must be a succeeded job of this workspace"
    elif "template" not in errors:
        kinds = (_model_kind(template, entry_point), _model_kind(base_job.template, ""))
        if kinds[0] != kinds[1]:
            errors["base_job"] = (
                "a lightgbm job continues only from a lightgbm job's trees, and a neural "
                f"template or entry point only from a neural model; job {base_job.pk} trained "
                f"{base_job.template or base_job.entry_point}"
            )
    if not isinstance(params, dict):
        errors["params"] = "must be an object"
    else:
        params, param_errors = job_params_check(
            template=template, entry_point=entry_point, params=params, workspace=workspace
        )
        errors.update(param_errors)
        if language_model and "params.base_model_path" not in errors:
            problem = base_model_path_problem(str(params.get("base_model_path") or ""))
            if problem:
                errors["params.base_model_path"] = problem
        split_column = params.get("split_column") if isinstance(params, dict) else ""
        if split_column and dataset is not None and "dataset" not in errors:
            columns = features_selectors.dataset_columns(dataset)
            if columns is not None and split_column not in columns:
                errors["params.split_column"] = (
                    f"the dataset has no column {split_column!r}; its columns: "
                    + ", ".join(sorted(columns))
                )
    for name in ("cpu_milli", "memory_mb"):
        value = resources.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors[name] = "must be a positive integer"
    for name in ("gpu_count", "gpu_milli"):
        value = resources.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors[name] = "must be a non-negative integer"
    if resources.get("gpu_milli", 0) > 999:
        errors["gpu_milli"] = "a fraction of one GPU: 1-999 (use gpu_count for whole GPUs)"
    workers = resources.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        errors["workers"] = f"data-parallel ranks: an integer 1-{MAX_WORKERS}"
    elif workers > 1 and "template" not in errors:
        why = _single_process(template, entry_point, params if isinstance(params, dict) else {})
        if why:
            errors["workers"] = f"{why} trains in one process: give workers 1"
    if priority_class not in PriorityClass.values:
        errors["priority_class"] = f"use one of {PriorityClass.values}"
    if errors:
        raise ValidationError(errors)
    return params


# The templates that fine-tune a language model on a record set (``training.lm``).
LM_TEMPLATES = frozenset({"lm_lora", "lm_full"})
# A record set a language-model job can read: instruction rows, or chat rows.
INSTRUCTION_COLUMNS = ("instruction", "output")
CHAT_COLUMN = "messages"


def _record_set_errors(record_set: RecordSet | None) -> dict[str, str]:
    if record_set is None:
        return {"record_set": "required"}
    if record_set.status != RecordSetStatus.READY:
        return {"record_set": f"record set is {record_set.status}, not ready"}
    columns = {str(c.get("name")) for c in record_set.columns or [] if isinstance(c, dict)}
    if CHAT_COLUMN not in columns and not set(INSTRUCTION_COLUMNS) <= columns:
        return {
            "record_set": "needs the columns instruction and output (input optional), or a "
            f"messages column of {{role, content}}; it has: {', '.join(sorted(columns))}"
        }
    return {}


def _ranking_record_set_errors(record_set: RecordSet, *, entry_point: bool) -> dict[str, str]:
    if entry_point:
        return {"record_set": "an entry point trains on a dataset; give a dataset"}
    if record_set.status != RecordSetStatus.READY:
        return {"record_set": f"record set is {record_set.status}, not ready"}
    from curation.services import ranking_features

    try:
        ranking_features(record_set)
    except (ValueError, OSError) as exc:
        return {
            "record_set": f"a ranking template trains on a ranking sample; this record set {exc}"
        }
    return {}


def base_model_roots() -> list[Path]:
    """The folders a language-model job's ``base_model_path`` may lie under."""
    return [Path(os.path.realpath(p)) for p in getattr(settings, "TRAINING_BASE_MODEL_ROOTS", [])]


def base_model_path_problem(path: str) -> str:
    """Why ``path`` cannot be a language-model job's base model folder (blank: it can): it must
    be an absolute path under one of ``TRAINING_BASE_MODEL_ROOTS`` (the agent copies it into
    the job's sandbox, so a job must not name any other folder of the node)."""
    if not path:
        return "required: the base model's folder (Hugging Face format)"
    if not os.path.isabs(path):
        return "must be an absolute path"
    real = Path(os.path.realpath(path))
    roots = base_model_roots()
    if not any(real == root or real.is_relative_to(root) for root in roots):
        return "must lie under one of the allowed base model folders: " + ", ".join(
            str(root) for root in roots
        )
    return ""


def _request_tick_on_commit() -> None:
    try:
        from training.scheduler.tasks import request_tick
    except ImportError:
        return
    transaction.on_commit(request_tick)


@transaction.atomic
def job_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    dataset: Dataset | None,
    template: str = "",
    record_set: RecordSet | None = None,
    entry_point: str = "",
    params: dict[str, Any] | None = None,
    base_job: TrainingJob | None = None,
    cpu_milli: int = 1000,
    memory_mb: int = 1024,
    gpu_count: int = 0,
    gpu_milli: int = 0,
    gpu_type: str = "",
    workers: int = 1,
    priority_class: str = PriorityClass.EXPERIMENT,
    preemptible: bool = False,
    max_attempts: int = 3,
    compare_deployment: str = "",
) -> TrainingJob:
    """Create a pending job; the scheduler admits and places it (``request_tick`` on commit).
    ``compare_deployment`` names the deployment whose production model the held-out evaluation
    scores on the same rows (blank: the workspace's only deployment, when it has exactly one).

    The dataset's features become consumers (kind ``training_job``) so they cannot be retired
    under a model being trained on them.
    """
    params = check_job_input(
        workspace=workspace,
        template=template,
        entry_point=entry_point,
        dataset=dataset,
        record_set=record_set,
        base_job=base_job,
        params={} if params is None else params,
        resources={
            "cpu_milli": cpu_milli,
            "memory_mb": memory_mb,
            "gpu_count": gpu_count,
            "gpu_milli": gpu_milli,
            "workers": workers,
        },
        priority_class=priority_class,
    )
    job = TrainingJob(
        workspace=workspace,
        name=name,
        template=template,
        entry_point=entry_point,
        params=params,
        dataset=dataset,
        record_set=record_set,
        base_job=base_job,
        cpu_milli=cpu_milli,
        memory_mb=memory_mb,
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_type=gpu_type,
        workers=workers,
        priority_class=priority_class,
        preemptible=preemptible,
        max_attempts=max_attempts,
        compare_deployment=compare_deployment,
        created_by=actor_user(actor),
    )
    try:
        job.full_clean(
            exclude=["workspace", "dataset", "record_set", "base_job", "created_by", "node"]
        )
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    job.save()
    # check_job_input refused a job with neither
    data_input = dataset if dataset is not None else record_set
    assert data_input is not None
    refs = [Ref.to(job), Ref.to(data_input, role="input")]
    if base_job is not None:
        refs.append(Ref.to(base_job, role="input"))
    event_record(
        actor=actor,
        workspace=workspace,
        verb="training.job.created",
        refs=refs,
        payload={
            "template": template,
            "entry_point": entry_point,
            "dataset": str(dataset) if dataset is not None else "",
            **({"record_set": str(record_set)} if record_set is not None else {}),
            "priority_class": priority_class,
            "resources": {
                "cpu_milli": cpu_milli,
                "memory_mb": memory_mb,
                "gpu_count": gpu_count,
                "gpu_milli": gpu_milli,
                "gpu_type": gpu_type,
            },
        },
    )
    _register_consumers(actor=actor, job=job)
    _request_tick_on_commit()
    return job


def _register_consumers(*, actor: Actor, job: TrainingJob) -> None:
    from features.models import FeatureGroup
    from features.selectors import FeatureRef
    from features.services import consumer_register

    dataset = job.dataset
    if dataset is None:  # every submitted job has one; nothing to register without it
        return
    label = f"training job {job.name} #{job.pk}"
    groups: dict[str, FeatureGroup | None] = {}
    for index, text in enumerate(dataset.feature_refs):
        ref = FeatureRef.parse(text, index=index)
        if ref.group not in groups:
            groups[ref.group] = (
                FeatureGroup.objects.for_workspace(job.workspace).filter(name=ref.group).first()
            )
        group = groups[ref.group]
        if group is None:
            continue
        consumer_register(
            actor=actor,
            group=group,
            kind=JOB_CONSUMER_KIND,
            object_id=job.pk,
            label=label,
            feature_name=ref.feature,
        )


JOB_CONSUMER_KIND = "training_job"


@transaction.atomic
def job_request_stop(
    *, job: TrainingJob, mode: str, reason: str, actor: Actor = None
) -> TrainingJob:
    """Ask a job to stop: ``preempt`` (checkpoint, then ``preempted`` and requeued by the
    scheduler) or ``cancel`` (checkpoint, then ``cancelled``).

    A job not yet running stops at once (nothing to checkpoint); a running one gets
    ``stop_requested`` and its agent SIGTERMs the child within about half a second.
    """
    if mode not in STOP_MODES:
        raise ValidationError({"mode": f"use one of {sorted(STOP_MODES)}"})
    locked = TrainingJob.objects.unscoped().select_for_update().get(pk=job.pk)
    if locked.is_terminal:
        raise ConflictError(f"job {locked.pk} is already {locked.state}", attr="state")
    if locked.state == JobState.RUNNING or (locked.state == JobState.PLACED and mode == "preempt"):
        TrainingJob.objects.unscoped().filter(pk=locked.pk).update(stop_requested=mode)
        locked.stop_requested = mode
        event_record(
            actor=actor,
            workspace=locked.workspace,
            verb="training.job.stop_requested",
            refs=[Ref.to(locked)],
            payload={"mode": mode, "reason": reason},
        )
    elif mode == "cancel":
        job_transition(job=locked, to=JobState.CANCELLED, actor=actor, reason=reason)
    else:
        raise ConflictError(f"job {locked.pk} is {locked.state}; nothing to preempt", attr="state")
    for f in locked._meta.concrete_fields:
        setattr(job, f.attname, getattr(locked, f.attname))
    return job


def _wake_tuning(job_id: int) -> None:
    """A trial job of a tuning job ended or reached a new epoch: its controller runs after the
    commit (``training.tuning``)."""
    from training.tuning import tuning_wake_for_job

    tuning_wake_for_job(job_id)


def job_record_progress(
    *,
    job_id: int,
    metrics: list[tuple[int, str, float]],
    attempt: int | None = None,
    **fields: Any,
) -> None:
    """The agent streams progress: job row fields (no state change) and metric rows.

    With ``attempt`` (the agent's fencing token) nothing is written unless that attempt is the
    job's running one; ``StaleAttempt`` tells the agent to stop."""
    fields["progress_at"] = timezone.now()
    with transaction.atomic():
        if attempt is not None:
            locked = TrainingJob.objects.unscoped().select_for_update().get(pk=job_id)
            _fence(locked, attempt)
            workspace_id = locked.workspace_id
            TrainingJob.objects.unscoped().filter(pk=job_id).update(**fields)
        else:
            TrainingJob.objects.unscoped().filter(pk=job_id).update(**fields)
            workspace_id = None
        if metrics:
            workspace_id = workspace_id or (
                TrainingJob.objects.unscoped()
                .filter(pk=job_id)
                .values_list("workspace_id", flat=True)
                .first()
            )
            JobMetric.objects.bulk_create(
                [
                    # A job streams metrics only while its row exists, so workspace_id is set.
                    JobMetric(workspace_id=workspace_id, job_id=job_id, step=s, name=n, value=v)  # type: ignore[misc]
                    for s, n, v in metrics
                    if v is not None and math.isfinite(v)
                ]
            )
            if any(name.startswith("val_") for _, name, _ in metrics):
                _wake_tuning(job_id)


# --- entry points ------------------------------------------------------------------------------

MAX_SCRIPT_BYTES = 1_000_000


@transaction.atomic
def entry_point_register(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    module: str = "",
    script: bytes | None = None,
    description: str = "",
) -> EntryPoint:
    """Register user training code: an importable module, or a script stored under
    ARTIFACT_ROOT (see ``EntryPoint`` for the contract)."""
    errors: dict[str, str] = {}
    if bool(module) == bool(script):
        errors["module"] = "give either module (a dotted path) or script (Python source)"
    elif module and not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", module):
        errors["module"] = "not a dotted Python module path"
    if script is not None and len(script) > MAX_SCRIPT_BYTES:
        errors["script"] = f"at most {MAX_SCRIPT_BYTES} bytes"
    if script:
        try:
            compile(script, f"<entry point {name}>", "exec")
        except (SyntaxError, ValueError) as exc:
            errors["script"] = f"not valid Python: {exc}"
    if EntryPoint.objects.for_workspace(workspace).filter(name=name).exists():
        raise ConflictError(f"entry point '{name}' exists", attr="name")
    if errors:
        raise ValidationError(errors)
    entry = EntryPoint(
        workspace=workspace,
        name=name,
        kind=EntryPointKind.SCRIPT if script else EntryPointKind.MODULE,
        module=module,
        description=description,
        created_by=actor_user(actor),
    )
    try:
        entry.full_clean(exclude=["workspace", "created_by"])
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    if script:
        digest = hashlib.sha256(script).hexdigest()
        relative = f"{ENTRY_POINTS_DIR}/ws={workspace.pk}/{name}-{digest[:12]}.py"
        target = Path(settings.ARTIFACT_ROOT) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(script)
        os.replace(tmp, target)
        entry.script_path = relative
        entry.sha256 = digest
    entry.save()
    event_record(
        actor=actor,
        workspace=workspace,
        verb="training.entry_point.registered",
        refs=[Ref.to(entry)],
        payload={"kind": entry.kind, "module": module, "sha256": entry.sha256},
    )
    return entry


def entry_point_target(entry: EntryPoint) -> str:
    """What the runner imports: the dotted path, or the script's absolute file path."""
    if entry.kind == EntryPointKind.SCRIPT:
        return str(Path(settings.ARTIFACT_ROOT) / entry.script_path)
    return entry.module


# --- for the other apps: what they ask of training's private modules -------------------------


def job_spec(job: TrainingJob) -> JobSpec:
    """The ``JobSpec`` the agent runs ``job`` with (``training.agent.build_job_spec``): serving's
    quality gate evaluates a bundle on the job's own held-out rows with it."""
    from training.agent import build_job_spec

    return build_job_spec(job)


def mlflow_run_url(workspace_slug: str, run_id: str) -> str:
    """The MLflow UI page of a run, through the platform's MLflow proxy."""
    from training.mlflow_server import run_ui_url

    return run_ui_url(workspace_slug, run_id)


def register_model_registrar(registrar: Registrar) -> None:
    """Serving's registry registers a tuning job's best trial (``training.tuning``): called once,
    from serving's ``AppConfig.ready``."""
    from training.tuning import register_model_registrar as register

    register(registrar)
