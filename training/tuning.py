"""Tuning jobs (Katib's Experiment on this platform): the writes and the controller.

A tuning job's trials are ordinary training jobs: ``tuning_job_advance`` creates each one with
``training.services.job_create`` (so the scheduler admits and places it and the workspace's quota
applies) and records it as a ``TuningTrial``. The controller is idempotent and runs under the
tuning job's row lock; each call:

1. reads what the trial jobs did: the per-epoch ``val_<metric>`` rows the agent stored, and for a
   finished job its final validation metric (``metrics["validation"]`` only: the trial row has
   no place for a held-out metric, so the test rows choose nothing);
2. asks the pruner (``training.tuner.prune_decision``) about each running trial that reached a
   new epoch, and cancels the job of one it rejects (``job_request_stop``: it checkpoints and
   ends cancelled; the trial is ``pruned``);
3. stops running trials once the time budget (``max_minutes``) is spent;
4. starts new trials while fewer than ``parallelism`` trial jobs are unfinished and fewer than
   ``n_trials`` have started, each with the params Optuna's TPE asks for next from the study
   rebuilt from the trials recorded (``training.tuner``): a restarted controller repeats nothing;
5. when every trial job has ended and the budget is spent, registers the best complete trial's
   model and marks the tuning job succeeded (failed when no trial completed); with
   ``refit_cv_folds`` it first starts one more job, the best trial's params with
   ``cv_folds = k`` (its ``refit_job``), and registers that job's model when it succeeds (a
   refit that fails or is cancelled fails the tuning job, saying so; the trials stay).

It runs when a trial job ends or stores a validation value (``job_transition`` and
``job_record_progress`` call ``tuning_wake_for_job``, which queues ``advance_tuning_job`` after
the commit), when the tuning job is created, and from the beat's sweep
(``tuning_jobs_advance_all``), the safety net for a lost wake-up.

Registration belongs to serving, to the right of training: serving hands its registry function
to ``register_model_registrar`` in its ``AppConfig.ready``; training never imports serving.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from features.models import Dataset
from training import tuner
from training.models import (
    JobMetric,
    JobState,
    PriorityClass,
    TrainingJob,
    TrialState,
    TuningJob,
    TuningMetric,
    TuningPruner,
    TuningState,
    TuningTrial,
)
from training.params import ParamError, params_schema, template_names, template_schemas
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

MAX_TRIALS = 200
MAX_PARALLELISM = 16
MAX_MINUTES = 7 * 24 * 60
PRUNER_STARTUP_TRIALS = 2
PRUNER_WARMUP_EPOCHS = 1

Registrar = Callable[..., dict[str, Any]]
_REGISTRAR: list[Registrar] = []


def register_model_registrar(registrar: Registrar) -> None:
    """Serving's registry: ``registrar(actor=, workspace=, name=, job=, description=)`` registers
    the job's bundle as the next version of model ``name`` and returns ``{"id", "label"}``."""
    _REGISTRAR[:] = [registrar]


# --- create, cancel -----------------------------------------------------------------------------


def default_space_json(template: str) -> dict[str, Any]:
    """The default search space of ``template`` as JSON (what the form and the API show)."""
    return tuner.space_to_json(tuner.default_space(template))


def parallelism_limit(workspace: Workspace, resources: dict[str, Any]) -> int | None:
    """How many trials with ``resources`` fit the workspace's quotas at once (None: no quota)."""
    try:
        from training.scheduler.models import WorkspaceQuota
    except ImportError:
        return None
    need = {
        "cpu_milli": int(resources.get("cpu_milli") or 0),
        "memory_mb": int(resources.get("memory_mb") or 0),
        "gpu_milli": int(resources.get("gpu_count") or 0) * 1000
        + (0 if resources.get("gpu_count") else int(resources.get("gpu_milli") or 0)),
    }
    gpu_type = str(resources.get("gpu_type") or "")
    limit: int | None = None
    for quota in WorkspaceQuota.objects.for_workspace(workspace):
        if quota.gpu_type and quota.gpu_type not in gpu_type.split("|"):
            continue
        for key in ("cpu_milli", "memory_mb", "gpu_milli"):
            cap = getattr(quota, key)
            if cap is None or not need[key]:
                continue
            fits = cap // need[key]
            limit = fits if limit is None else min(limit, fits)
    return limit


def _int_in(errors: dict[str, str], name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors[name] = f"a whole number from {low} to {high}"


def _check_refit(
    errors: dict[str, str],
    template: str,
    folds: Any,
    fixed: dict[str, Any],
    searched: tuner.SearchSpace,
) -> None:
    """``refit_cv_folds``: 0 or 1 (off), else within the template's ``cv_folds`` bounds, for
    a template that has it, with trials that are not cross-fitted or averaged themselves."""
    if isinstance(folds, bool) or not isinstance(folds, int):
        errors["refit_cv_folds"] = "give a whole number: 0 (off) or the folds, e.g. 5"
        return
    if folds in (0, 1):
        return
    param = params_schema(template, policy=False).get("cv_folds")
    if param is None:
        having = [name for name in template_names() if "cv_folds" in template_schemas()[name]]
        errors["refit_cv_folds"] = (
            f"template '{template}' has no cv_folds; leave 0, or use one of: {', '.join(having)}"
        )
        return
    try:
        param.clean(folds)
    except ParamError as exc:
        errors["refit_cv_folds"] = str(exc)
        return
    if int(fixed.get("cv_folds") or 0) >= 2 or "cv_folds" in searched:
        errors["refit_cv_folds"] = (
            "the trials are cross-fitted already (cv_folds in the params or the space); leave 0"
        )
    elif int(fixed.get("members") or 1) > 1 or "members" in searched:
        errors["refit_cv_folds"] = (
            "cv_folds cannot be combined with members > 1 (the folds' models are the members); "
            "leave 0 or drop members"
        )


@transaction.atomic
def tuning_job_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    dataset: Dataset | None = None,
    template: str = "",
    params: dict[str, Any] | None = None,
    base_job: TrainingJob | None = None,
    space: dict[str, Any] | None = None,
    metric: str = TuningMetric.LOGLOSS,
    pruner: str = TuningPruner.MEDIAN,
    n_trials: int = 8,
    max_minutes: int | None = None,
    parallelism: int = 2,
    seed: int = 0,
    model_name: str = "",
    refit_cv_folds: int = 0,
    cpu_milli: int | None = None,
    memory_mb: int | None = None,
    gpu_count: int | None = None,
    gpu_milli: int | None = None,
    gpu_type: str | None = None,
    priority_class: str | None = None,
    dispatch: bool = True,
) -> TuningJob:
    """Create a queued tuning job; its controller starts the first trials after the commit.

    ``base_job`` (a job of this workspace) gives what is not given: template, dataset, params
    (less the searched ones), resources and priority class. ``space`` defaults to the
    template's (``training.tuner.DEFAULT_SPACES``) and is checked against its param schema;
    ``parallelism`` may not exceed what the workspace's quota holds at once.
    ``refit_cv_folds`` (k >= 2; the template must have ``cv_folds``) trains the best trial's
    params once more with ``cv_folds = k`` when the trials are done, and registers that job's
    model instead. Every bad field at once: ``ValidationError`` by field (``space.<param>``,
    ``params.<param>``, ...)."""
    from training.services import check_job_input

    if base_job is not None:
        if base_job.workspace_id != workspace.pk:
            raise ReferenceNotFound("no such job in this workspace", attr="base_job")
        template = template or base_job.template
        dataset = dataset or base_job.dataset
        if params is None:
            params = dict(base_job.params or {})
        cpu_milli = base_job.cpu_milli if cpu_milli is None else cpu_milli
        memory_mb = base_job.memory_mb if memory_mb is None else memory_mb
        gpu_count = base_job.gpu_count if gpu_count is None else gpu_count
        gpu_milli = base_job.gpu_milli if gpu_milli is None else gpu_milli
        gpu_type = base_job.gpu_type if gpu_type is None else gpu_type
        priority_class = priority_class or base_job.priority_class
    resources = {
        "cpu_milli": 1000 if cpu_milli is None else cpu_milli,
        "memory_mb": 1024 if memory_mb is None else memory_mb,
        "gpu_count": gpu_count or 0,
        "gpu_milli": gpu_milli or 0,
    }
    gpu_type = gpu_type or ""
    priority_class = priority_class or PriorityClass.EXPERIMENT
    params = {} if params is None else params

    errors: dict[str, str] = {}
    searched: tuner.SearchSpace = {}
    if not template:
        errors["template"] = (
            "give a built-in template (or a base_job that has one): the search space is over "
            "its params"
        )
    try:
        cleaned = check_job_input(
            workspace=workspace,
            template=template,
            entry_point="",
            dataset=dataset,
            base_job=None,
            params=params,
            resources=resources,
            priority_class=priority_class,
        )
    except ReferenceNotFound:
        raise  # another workspace's dataset: 404, like one that does not exist
    except ValidationError as exc:
        found = {k: "; ".join(v) for k, v in exc.message_dict.items()}
        errors.update({k: v for k, v in found.items() if k not in errors})
        cleaned = params if isinstance(params, dict) else {}
    if "template" not in errors:
        if space is None:
            searched = tuner.default_space(template)
        else:
            try:
                searched = tuner.space_from_json(template, space)
            except tuner.SpaceError as exc:
                errors.update(exc.errors)
    if base_job is not None:
        cleaned = {k: v for k, v in cleaned.items() if k not in searched}
    for param in sorted(set(cleaned) & set(searched)):
        errors[f"params.{param}"] = "searched in the space; leave it out of the fixed params"
    if metric not in TuningMetric.values:
        errors["metric"] = f"use one of {TuningMetric.values}"
    if pruner not in TuningPruner.values:
        errors["pruner"] = f"use one of {TuningPruner.values}"
    _int_in(errors, "n_trials", n_trials, 1, MAX_TRIALS)
    _int_in(errors, "parallelism", parallelism, 1, MAX_PARALLELISM)
    _int_in(errors, "seed", seed, 0, 2**31 - 1)
    if max_minutes is not None:
        _int_in(errors, "max_minutes", max_minutes, 1, MAX_MINUTES)
    if "template" not in errors:
        _check_refit(errors, template, refit_cv_folds, cleaned, searched)
    if "parallelism" not in errors and not any(k in errors for k in resources):
        limit = parallelism_limit(workspace, {**resources, "gpu_type": gpu_type})
        if limit is not None and parallelism > limit:
            errors["parallelism"] = (
                f"the workspace's quota holds {limit} trial(s) of these resources at once; "
                f"use at most {limit}"
            )
    if errors:
        raise ValidationError(errors)

    tuning = TuningJob(
        workspace=workspace,
        name=name,
        template=template,
        dataset=dataset,
        base_job=base_job,
        params=cleaned,
        space=tuner.space_to_json(searched),
        metric=metric,
        direction=tuner.direction_of(metric),
        pruner=pruner,
        n_trials=n_trials,
        max_minutes=max_minutes,
        parallelism=parallelism,
        seed=seed,
        model_name=(model_name or name),
        refit_cv_folds=refit_cv_folds if refit_cv_folds >= 2 else 0,
        gpu_type=gpu_type,
        priority_class=priority_class,
        created_by=actor_user(actor),
        **resources,
    )
    try:
        tuning.full_clean(
            exclude=["workspace", "dataset", "base_job", "created_by", "best_trial", "refit_job"]
        )
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    tuning.save()
    refs = [Ref.to(tuning), Ref.to(dataset, role="input")]
    if base_job is not None:
        refs.append(Ref.to(base_job, role="input"))
    event_record(
        actor=actor,
        workspace=workspace,
        verb="training.tuning_job.created",
        refs=refs,
        payload={
            "template": template,
            "space": tuning.space,
            "metric": metric,
            "n_trials": n_trials,
            "max_minutes": max_minutes,
            "parallelism": parallelism,
            "refit_cv_folds": tuning.refit_cv_folds,
        },
    )
    if dispatch:
        _dispatch(tuning.pk)
    return tuning


@transaction.atomic
def tuning_job_cancel(*, actor: Actor, tuning_job: TuningJob) -> TuningJob:
    """Stop a tuning job: its unfinished trial jobs are cancelled and nothing is registered."""
    locked = TuningJob.objects.for_workspace(tuning_job.workspace_id).select_for_update()
    locked = locked.get(pk=tuning_job.pk)
    if locked.is_terminal:
        raise ConflictError(f"tuning job {locked.pk} is already {locked.state}", attr="state")
    reason = f"cancelled by {actor}" if actor is not None else "cancelled"
    _stop_open_trials(locked, _trials(locked), reason=reason, actor=actor)
    _stop_refit(locked, reason=reason, actor=actor)
    _set_state(locked, TuningState.CANCELLED, actor=actor, reason=reason)
    for field in locked._meta.concrete_fields:
        setattr(tuning_job, field.attname, getattr(locked, field.attname))
    return tuning_job


# --- the controller ----------------------------------------------------------------------------


def _dispatch(tuning_job_id: int, countdown: float = 0.0) -> None:
    def send() -> None:
        from training.tasks import advance_tuning_job

        try:
            advance_tuning_job.apply_async(args=[tuning_job_id], countdown=countdown)
        except Exception:
            logger.warning("could not queue tuning job %s", tuning_job_id, exc_info=True)

    transaction.on_commit(send)


def tuning_of_job(job_id: int) -> int | None:
    """The id of the tuning job that ``job_id`` is a trial or the refit of (``None``: neither)."""
    tuning_id = (
        TuningTrial.objects.unscoped()
        .filter(job_id=job_id)
        .values_list("tuning_job_id", flat=True)
        .first()
    )
    if tuning_id is None:
        tuning_id = (
            TuningJob.objects.unscoped()
            .filter(refit_job_id=job_id)
            .values_list("pk", flat=True)
            .first()
        )
    return tuning_id


def tuning_wake_for_job(job_id: int) -> None:
    """A trial job (or a refit job) ended or stored a validation value: advance its tuning job
    after the commit (nothing for a job of no tuning job)."""
    tuning_id = tuning_of_job(job_id)
    if tuning_id is not None:
        _dispatch(tuning_id)


def tuning_jobs_advance_all() -> int:
    """The beat's safety net: advance every queued or running tuning job; returns how many."""
    ids = list(
        TuningJob.objects.unscoped()
        .filter(state__in=[TuningState.QUEUED, TuningState.RUNNING])
        .values_list("pk", flat=True)[:500]
    )
    for tuning_id in ids:
        try:
            tuning_job_advance(tuning_id)
        except Exception:
            logger.exception("tuning job %s could not advance", tuning_id)
    return len(ids)


def _trials(tuning: TuningJob) -> list[TuningTrial]:
    return list(
        TuningTrial.objects.for_workspace(tuning.workspace_id)
        .filter(tuning_job=tuning)
        .select_related("job")
        .order_by("number")
    )


def trial_record(trial: TuningTrial) -> tuner.TrialRecord:
    """What the tuner sees of a trial (validation only); a cancelled trial counts as failed."""
    state = "failed" if trial.state == TrialState.CANCELLED else trial.state
    return tuner.TrialRecord(
        number=trial.number,
        params=dict(trial.params),
        state=state,
        value=trial.value,
        intermediate={int(epoch): float(value) for epoch, value in trial.intermediate or []},
        pruner_attrs=dict(trial.pruner_attrs or {}),
    )


def trial_row_losses(trials: list[TuningTrial]) -> dict[int, Any]:
    """Each complete trial's per-row validation losses, from the file its run left beside its
    model (``runner.SELECTION_ROWS_FILE``); trials without one are left out."""
    from training import runner
    from training.services import job_work_dir

    losses = {}
    for trial in trials:
        if trial.state == TrialState.COMPLETE and trial.job_id is not None:
            rows = runner.selection_row_losses(job_work_dir(trial.job))
            if rows is not None:
                losses[trial.number] = rows
    return losses


def tuning_space(tuning: TuningJob) -> tuner.SearchSpace:
    return tuner.space_from_json(tuning.template, tuning.space)


def _pruner(tuning: TuningJob) -> tuner.PrunerConfig:
    return tuner.PrunerConfig(
        kind=tuning.pruner,
        n_startup_trials=PRUNER_STARTUP_TRIALS,
        warmup_epochs=PRUNER_WARMUP_EPOCHS,
    )


def _set_state(
    tuning: TuningJob, state: str, *, actor: Actor = None, reason: str = "", **payload
) -> None:
    now = timezone.now()
    tuning.state = state
    tuning.state_reason = reason[:500]
    if state == TuningState.RUNNING and tuning.started_at is None:
        tuning.started_at = now
    if state in {TuningState.SUCCEEDED, TuningState.FAILED, TuningState.CANCELLED}:
        tuning.finished_at = now
    tuning.save()
    refs = [Ref.to(tuning)]
    if tuning.best_trial_id:
        refs.append(Ref.to(tuning.best_trial.job, role="input"))
    event_record(
        actor=actor,
        workspace=tuning.workspace,
        verb=f"training.tuning_job.{state}",
        refs=refs,
        payload={"reason": reason, **payload},
    )


def _trial_state(
    tuning: TuningJob, trial: TuningTrial, state: str, *, actor: Actor = None, reason: str = ""
) -> None:
    trial.state = state
    if state != TrialState.RUNNING:
        trial.finished_at = timezone.now()
    trial.save()
    event_record(
        actor=actor,
        workspace=tuning.workspace,
        verb=f"training.tuning_trial.{state}",
        refs=[Ref.to(trial), Ref.to(tuning, role="related"), Ref.to(trial.job)],
        payload={
            "number": trial.number,
            "params": trial.params,
            "value": trial.value,
            "reason": reason,
        },
    )


def _read_curves(trials: list[TuningTrial], metric: str) -> dict[int, list[tuple[int, float]]]:
    """Each trial job's ``val_<metric>`` points, ``{job_id: [(step, value), ...]}``."""
    if not trials:
        return {}
    rows = (
        JobMetric.objects.for_workspace(trials[0].workspace_id)
        .filter(job_id__in=[t.job_id for t in trials], name=f"val_{metric}")
        .order_by("job_id", "step", "id")
        .values_list("job_id", "step", "value")
    )
    points: dict[int, list[tuple[int, float]]] = {}
    for job_id, step, value in rows:
        points.setdefault(job_id, []).append((step, value))
    return points


def _sync(tuning: TuningJob, trials: list[TuningTrial]) -> list[TuningTrial]:
    """Bring the unfinished trials up to date with their jobs; returns those that reached a new
    epoch and still run (the pruner's to judge)."""
    open_trials = [t for t in trials if t.state in {TrialState.RUNNING, TrialState.PRUNED}]
    points = _read_curves(open_trials, tuning.metric)
    judge: list[TuningTrial] = []
    for trial in open_trials:
        job = trial.job
        curve = tuner.validation_curve(points.get(trial.job_id, []))
        seen = len(trial.intermediate or [])
        trial.intermediate = [[epoch, value] for epoch, value in sorted(curve.items())]
        if job.state == JobState.SUCCEEDED:
            # The validation block, nothing else, is what a trial is judged by.
            trial.value = tuner.validation_value(
                (job.metrics or {}).get("validation"), tuning.metric
            )
            if trial.value is None:
                _trial_state(
                    tuning, trial, TrialState.FAILED, reason="the job reported no validation metric"
                )
            else:
                _trial_state(tuning, trial, TrialState.COMPLETE, reason="training finished")
        elif job.state == JobState.FAILED and trial.state == TrialState.RUNNING:
            _trial_state(tuning, trial, TrialState.FAILED, reason=job.state_reason)
        elif job.state == JobState.CANCELLED and trial.state == TrialState.RUNNING:
            _trial_state(tuning, trial, TrialState.CANCELLED, reason=job.state_reason)
        else:
            trial.save(update_fields=["intermediate"])
            if trial.state == TrialState.RUNNING and len(trial.intermediate) > seen:
                judge.append(trial)
    return judge


def _prune(tuning: TuningJob, trials: list[TuningTrial], judge: list[TuningTrial]) -> None:
    from training.services import job_request_stop

    space = tuning_space(tuning)
    pruner = _pruner(tuning)
    for trial in judge:
        records = [trial_record(t) for t in trials]
        stop, attrs = tuner.prune_decision(
            space, records, trial.number, metric=tuning.metric, seed=tuning.seed, pruner=pruner
        )
        trial.pruner_attrs = attrs
        if not stop:
            trial.save(update_fields=["pruner_attrs"])
            continue
        epoch, value = trial.intermediate[-1]
        trial.value = value
        reason = (
            f"pruned by the {tuning.pruner} pruner after epoch {epoch} "
            f"({tuning.metric} {value:.5g})"
        )
        _trial_state(tuning, trial, TrialState.PRUNED, reason=reason)
        if not trial.job.is_terminal:
            # A job that ended meanwhile is read by the next advance.
            with contextlib.suppress(ConflictError):
                job_request_stop(job=trial.job, mode="cancel", reason=reason)


def _deadline_passed(tuning: TuningJob, now) -> bool:
    if not tuning.max_minutes or tuning.started_at is None:
        return False
    return now >= tuning.started_at + timedelta(minutes=tuning.max_minutes)


def _stop_open_trials(
    tuning: TuningJob, trials: list[TuningTrial], *, reason: str, actor: Actor = None
):
    """Cancel every unfinished trial job (a pruned one is already on its way out)."""

    for trial in trials:
        if trial.state == TrialState.RUNNING:
            _trial_state(tuning, trial, TrialState.CANCELLED, actor=actor, reason=reason)
        _cancel_job(trial.job, reason=reason, actor=actor)


def _cancel_job(job: TrainingJob, *, reason: str, actor: Actor = None) -> None:
    """Cancel a child job that is neither ended nor already asked to stop."""
    from training.services import job_request_stop

    if not job.is_terminal and not job.stop_requested:
        with contextlib.suppress(ConflictError):  # it ended meanwhile
            job_request_stop(job=job, mode="cancel", reason=reason, actor=actor)


def _stop_refit(tuning: TuningJob, *, reason: str, actor: Actor = None) -> None:
    if tuning.refit_job_id is not None:
        job = TrainingJob.objects.for_workspace(tuning.workspace_id).get(pk=tuning.refit_job_id)
        _cancel_job(job, reason=reason, actor=actor)


def _child_name(tuning: TuningJob, suffix: str) -> str:
    return f"{tuning.name[: 63 - len(suffix)]}{suffix}"


def _child_job(tuning: TuningJob, *, name: str, params: dict[str, Any]) -> TrainingJob:
    """A training job of the tuning job's template and dataset with ``params``, asking for
    the resources and priority each of its jobs asks for (a trial or the refit)."""
    from training.services import job_create

    return job_create(
        actor=tuning.created_by,
        workspace=tuning.workspace,
        name=name,
        dataset=tuning.dataset,
        template=tuning.template,
        params=params,
        cpu_milli=tuning.cpu_milli,
        memory_mb=tuning.memory_mb,
        gpu_count=tuning.gpu_count,
        gpu_milli=tuning.gpu_milli,
        gpu_type=tuning.gpu_type,
        priority_class=tuning.priority_class,
    )


def _start_trial(tuning: TuningJob, trials: list[TuningTrial]) -> TuningTrial:
    space = tuning_space(tuning)
    number = len(trials)
    sampled = tuner.ask(
        space, [trial_record(t) for t in trials], metric=tuning.metric, seed=tuning.seed
    )
    params = {**tuning.params, **tuner.derived_params(tuning.template, sampled)}
    job = _child_job(tuning, name=_child_name(tuning, f"-t{number}"), params=params)
    trial = TuningTrial.objects.create(
        workspace=tuning.workspace, tuning_job=tuning, number=number, job=job, params=sampled
    )
    event_record(
        actor=None,
        workspace=tuning.workspace,
        verb="training.tuning_trial.started",
        refs=[Ref.to(trial), Ref.to(tuning, role="related"), Ref.to(job, role="output")],
        payload={"number": number, "params": sampled},
    )
    return trial


def _finish(tuning: TuningJob, trials: list[TuningTrial]) -> None:
    kept = tuner.chosen_trial(
        [trial_record(t) for t in trials],
        tuning.metric,
        tuning_space(tuning),
        trial_row_losses(trials),
    )
    if kept is None:
        _set_state(tuning, TuningState.FAILED, reason="no trial completed")
        return
    best = kept.trial
    winner = next(t for t in trials if t.number == best.number)
    tuning.best_trial = winner
    tuning.best_value = best.value
    chosen = f"trial {winner.number}, validation {tuning.metric} {best.value:.5g} ({kept.reason})"
    source = winner.job
    if tuning.refit_cv_folds >= 2:
        refit = _refit(tuning, winner)
        if refit is None or not refit.is_terminal:
            return  # started now, or still training: its end wakes this job again
        if refit.state != JobState.SUCCEEDED:
            _set_state(
                tuning,
                TuningState.FAILED,
                reason=f"the refit job {refit.name} #{refit.pk} {refit.state}: "
                f"{refit.state_reason}",
                best_trial=winner.number,
                best_value=best.value,
            )
            return
        source = refit
        folded = tuner.validation_value((refit.metrics or {}).get("validation"), tuning.metric)
        chosen += f"; refit with cv_folds={tuning.refit_cv_folds}" + (
            f" (out-of-fold {tuning.metric} {folded:.5g})" if folded is not None else ""
        )
    registered: dict[str, Any] = {}
    if _REGISTRAR:
        try:
            with transaction.atomic():
                registered = _REGISTRAR[0](
                    actor=tuning.created_by,
                    workspace=tuning.workspace,
                    name=tuning.model_name.replace("_", "-"),
                    job=source,
                    description=f"best of tuning job {tuning.name} #{tuning.pk}: {chosen}",
                )
        except Exception as exc:  # any failure ends the job saying why (logged)
            logger.warning("tuning job %s: registration failed", tuning.pk, exc_info=True)
            _set_state(tuning, TuningState.FAILED, reason=f"registering the best trial: {exc}")
            return
        tuning.model_version_id = registered.get("id")
        tuning.model_version_label = str(registered.get("label") or "")[:100]
    _set_state(
        tuning,
        TuningState.SUCCEEDED,
        reason=f"best: {chosen}"
        + (f", registered as {tuning.model_version_label}" if registered else ""),
        best_trial=winner.number,
        best_value=best.value,
        best_params=winner.params,
        model_version_id=tuning.model_version_id,
        refit_job=tuning.refit_job_id,
    )


def _refit(tuning: TuningJob, winner: TuningTrial) -> TrainingJob | None:
    """The tuning job's refit job: the one started before, else a new one (``None`` when it
    could not start: the tuning job is failed, saying why). The new job has the best trial's
    params with ``cv_folds``, its resources and priority."""
    if tuning.refit_job_id is not None:
        return TrainingJob.objects.for_workspace(tuning.workspace_id).get(pk=tuning.refit_job_id)
    try:
        job = _child_job(
            tuning,
            name=_child_name(tuning, "-refit"),
            params={**winner.job.params, "cv_folds": tuning.refit_cv_folds},
        )
    except ValidationError as exc:
        _set_state(
            tuning,
            TuningState.FAILED,
            reason=f"could not start the refit of trial {winner.number}: {exc}",
            best_trial=winner.number,
            best_value=tuning.best_value,
        )
        return None
    tuning.refit_job = job
    tuning.state_reason = (
        f"refitting trial {winner.number} with cv_folds={tuning.refit_cv_folds}: job {job.name}"
    )[:500]
    tuning.save()
    event_record(
        actor=None,
        workspace=tuning.workspace,
        verb="training.tuning_job.refit_started",
        refs=[Ref.to(tuning), Ref.to(winner.job, role="input"), Ref.to(job, role="output")],
        payload={"best_trial": winner.number, "cv_folds": tuning.refit_cv_folds},
    )
    return job


def trial_cap(tuning: TuningJob, trials: list[TuningTrial]) -> int:
    """How many trials the job may start: ``n_trials``, capped by the validation rows the
    first finished trial reported (``tuner.trial_budget``: past about one trial per few
    validation rows, the best trial wins by the validation noise, as the quality bench showed).
    Until a trial reports, the cap is ``n_trials``."""
    for trial in trials:
        rows = ((trial.job.metrics or {}).get("validation") or {}).get("rows")
        if isinstance(rows, int):
            return tuner.trial_budget(tuning.n_trials, rows)
    return tuning.n_trials


def tuning_job_advance(tuning_job_id: int) -> str:
    """Move the tuning job as far as it can go now (see the module docstring); returns its
    state. Safe to call any number of times, from any number of workers."""
    with transaction.atomic():
        tuning = (
            TuningJob.objects.unscoped()
            .select_for_update(of=("self",))
            .select_related("workspace", "dataset", "created_by")
            .filter(pk=tuning_job_id)
            .first()
        )
        if tuning is None:
            return "missing"
        if tuning.is_terminal:
            return tuning.state
        if tuning.state == TuningState.QUEUED:
            _set_state(tuning, TuningState.RUNNING, reason="started")
        trials = _trials(tuning)
        judge = _sync(tuning, trials)
        if judge and tuning.pruner != TuningPruner.NONE:
            _prune(tuning, trials, judge)
        now = timezone.now()
        over_time = _deadline_passed(tuning, now)
        if over_time:
            reason = f"the time budget of {tuning.max_minutes} min is spent"
            _stop_open_trials(tuning, trials, reason=reason)
        unfinished = [t for t in trials if not t.job.is_terminal]
        try:
            while (
                not over_time
                and len(trials) < trial_cap(tuning, trials)
                and len(unfinished) < tuning.parallelism
            ):
                trial = _start_trial(tuning, trials)
                trials.append(trial)
                unfinished.append(trial)
        except ValidationError as exc:
            _stop_open_trials(tuning, trials, reason="the tuning job failed")
            _set_state(tuning, TuningState.FAILED, reason=f"could not start a trial: {exc}")
            return tuning.state
        if not unfinished:
            _finish(tuning, trials)
        return tuning.state


def tuning_importances(tuning: TuningJob, trials: list[TuningTrial]) -> dict[str, float]:
    """Optuna's parameter importances over the tuning job's complete trials (``{}`` with
    fewer than two), most important first."""
    records = [trial_record(t) for t in trials]
    values = tuner.param_importances(
        tuning_space(tuning), records, metric=tuning.metric, seed=tuning.seed
    )
    return dict(sorted(values.items(), key=lambda item: -item[1]))
