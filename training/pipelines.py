"""Pipelines (T2): a DAG of stages per workspace, run stage after stage with nobody in between.

A pipeline's ``stages`` is a list of ``{"name", "kind", "after": [names], "params": {}}``; the
default (``DEFAULT_STAGES``) is build_samples -> train -> evaluate -> register. Each kind has a
handler in the registry; right-hand apps add theirs (serving registers ``register``,
``quality_gate``, ``release_gates``, ``challenger`` and ``deploy``; experiments ``experiment``)
with ``register_stage(kind, handler)`` in their ``AppConfig.ready``; training never imports them.

A handler is ``handler(run: PipelineRun, stage: StageRun, context: dict) -> dict | Wait``: the
dict is the stage's output (merged into ``run.context`` for the stages after it); ``WAIT`` (or
``Wait(seconds)``, for a stage that waits on people) means "not done yet, ask me again" (the
train stage waits for its job). An exception fails the stage and the run; ``pipeline_run_retry``
reruns from the failed stage with the context so far.

``pipeline_run_advance(run_id)`` (Celery task ``training.tasks.run_pipeline``) runs every stage
it can and re-queues itself while a stage waits. One advance at a time per run: it first takes
the run's lease (``lease_until``, a conditional UPDATE that works the same on SQLite and
PostgreSQL), so a duplicate delivery, a retry racing a queued wake-up or the beat's sweep
(``pipeline_runs_resume``, which re-queues running runs whose lease lapsed, e.g. after a worker
died) never runs a stage twice at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from training.models import JobState, Pipeline, PipelineRun, RunState, StageRun, TrainingJob
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError

logger = logging.getLogger(__name__)

WAIT_COUNTDOWN_S = 2.0


class Wait:
    """A handler's "not done yet, ask me again in ``seconds``" (``WAIT``: soon)."""

    def __init__(self, seconds: float = WAIT_COUNTDOWN_S) -> None:
        self.seconds = float(seconds)


WAIT = Wait()
MAX_STAGES = 30
# Longer than a synchronous stage takes (a sample build on demo data: seconds); renewed before
# each stage. A worker that dies holding it delays the run by at most this much.
LEASE_S = 300
# How late a waiting run's wake-up may arrive (a busy queue) before the sweep starts another.
PARK_GRACE_S = 120

DEFAULT_STAGES: list[dict[str, Any]] = [
    {"name": "build_samples", "kind": "build_samples", "after": [], "params": {}},
    {"name": "train", "kind": "train", "after": ["build_samples"], "params": {}},
    {"name": "evaluate", "kind": "evaluate", "after": ["train"], "params": {}},
    {"name": "register", "kind": "register", "after": ["evaluate"], "params": {}},
]

Handler = Callable[[PipelineRun, StageRun, dict[str, Any]], Any]
_HANDLERS: dict[str, Handler] = {}


def register_stage(kind: str, handler: Handler) -> None:
    """Add or replace the handler of a stage kind (see the module docstring for who adds which)."""
    _HANDLERS[kind] = handler


def stage_kinds() -> list[str]:
    return sorted(_HANDLERS)


def stage_handler(kind: str) -> Handler | None:
    """The handler registered for a stage kind, or None."""
    return _HANDLERS.get(kind)


# --- definition ---------------------------------------------------------------------------------


def ordered_stages(stages: Any) -> list[dict[str, Any]]:
    """Validate a stage list and return it in a topological order (ties keep list order)."""
    if not isinstance(stages, list) or not stages:
        raise ValidationError({"stages": "give a non-empty list of stages"})
    if len(stages) > MAX_STAGES:
        raise ValidationError({"stages": f"at most {MAX_STAGES} stages"})
    names: dict[str, dict[str, Any]] = {}
    for index, stage in enumerate(stages):
        if not isinstance(stage, dict) or not isinstance(stage.get("name"), str):
            raise ValidationError({f"stages.{index}": "each stage needs a name"})
        if stage["name"] in names:
            raise ValidationError({f"stages.{index}": f"duplicate stage {stage['name']!r}"})
        if not isinstance(stage.get("kind"), str) or stage["kind"] not in _HANDLERS:
            raise ValidationError(
                {f"stages.{index}.kind": f"unknown stage kind; use one of {stage_kinds()}"}
            )
        after = stage.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise ValidationError({f"stages.{index}.after": "a list of stage names"})
        if not isinstance(stage.get("params", {}), dict):
            raise ValidationError({f"stages.{index}.params": "an object"})
        names[stage["name"]] = {
            "name": stage["name"],
            "kind": stage["kind"],
            "after": list(after),
            "params": dict(stage.get("params") or {}),
        }
    for name, stage in names.items():
        missing = [a for a in stage["after"] if a not in names]
        if missing:
            raise ValidationError({"stages": f"{name} runs after unknown stage(s) {missing}"})
    done: list[dict[str, Any]] = []
    placed: set[str] = set()
    remaining = list(names.values())
    while remaining:
        ready = [s for s in remaining if set(s["after"]) <= placed]
        if not ready:
            raise ValidationError({"stages": "the stages form a cycle"})
        for stage in ready:
            done.append(stage)
            placed.add(stage["name"])
        remaining = [s for s in remaining if s["name"] not in placed]
    return done


@transaction.atomic
def pipeline_create(
    *, actor: Actor, workspace, name: str, description: str = "", stages=None
) -> Pipeline:
    stages = ordered_stages(stages if stages is not None else DEFAULT_STAGES)
    if Pipeline.objects.for_workspace(workspace).filter(name=name).exists():
        raise ConflictError(f"pipeline '{name}' exists", attr="name")
    pipeline = Pipeline(workspace=workspace, name=name, description=description, stages=stages)
    try:
        pipeline.full_clean(exclude=["workspace", "created_by"])
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    pipeline.created_by = actor_user(actor)
    pipeline.save()
    event_record(
        actor=actor,
        workspace=workspace,
        verb="training.pipeline.created",
        refs=[Ref.to(pipeline)],
        payload={"stages": [s["name"] for s in stages]},
    )
    return pipeline


def _dispatch(run_id: int, countdown: float = 0.0, lease: str | None = None) -> None:
    from training.tasks import run_pipeline

    def send() -> None:
        try:
            run_pipeline.apply_async(args=[run_id, lease], countdown=countdown)
        except Exception:
            logger.warning("could not queue pipeline run %s", run_id, exc_info=True)

    transaction.on_commit(send)


@transaction.atomic
def pipeline_run_start(
    *, actor: Actor, pipeline: Pipeline, params: dict | None = None, dispatch: bool = True
) -> PipelineRun:
    if params is not None and not isinstance(params, dict):
        raise ValidationError({"params": "an object"})
    run = PipelineRun.objects.create(
        workspace=pipeline.workspace,
        pipeline=pipeline,
        state=RunState.RUNNING,
        params=params or {},
        created_by=actor_user(actor),
    )
    StageRun.objects.bulk_create(
        [
            StageRun(
                workspace=pipeline.workspace, run=run, name=s["name"], kind=s["kind"], position=i
            )
            for i, s in enumerate(ordered_stages(pipeline.stages))
        ]
    )
    event_record(
        actor=actor,
        workspace=pipeline.workspace,
        verb="training.pipeline_run.started",
        refs=[Ref.to(run), Ref.to(pipeline, role="input")],
        payload={"params": params or {}},
    )
    if dispatch:
        _dispatch(run.pk)
    return run


@transaction.atomic
def pipeline_run_retry(*, actor: Actor, run: PipelineRun, dispatch: bool = True) -> PipelineRun:
    """Rerun a failed run from its failed stage (the stages before it keep their outputs)."""
    locked = PipelineRun.objects.for_workspace(run.workspace_id).select_for_update().get(pk=run.pk)
    if locked.state != RunState.FAILED:
        raise ConflictError(f"run {locked.pk} is {locked.state}, not failed", attr="state")
    stages = StageRun.objects.for_workspace(run.workspace_id).filter(run=locked)
    failed = stages.filter(state=RunState.FAILED).order_by("position").first()
    start = failed.position if failed else 0
    stages.filter(position__gte=start).update(
        state=RunState.PENDING, error="", started_at=None, finished_at=None
    )
    locked.state = RunState.RUNNING
    locked.error = ""
    locked.finished_at = None
    locked.save(update_fields=["state", "error", "finished_at"])
    event_record(
        actor=actor,
        workspace=locked.workspace,
        verb="training.pipeline_run.retried",
        refs=[Ref.to(locked)],
        payload={"from_stage": failed.name if failed else ""},
    )
    if dispatch:
        _dispatch(locked.pk)
    run.state = locked.state
    return locked


def _finish_run(run: PipelineRun, state: str, error: str = "") -> None:
    with transaction.atomic():
        run.state = state
        run.error = error[:5000]
        run.finished_at = timezone.now()
        run.save(update_fields=["state", "error", "finished_at", "context"])
        event_record(
            actor=None,
            workspace=run.workspace,
            verb=f"training.pipeline_run.{state}",
            refs=[Ref.to(run)],
            payload={"error": error[:500], "context": run.context},
        )


def _claim(run_id: int, lease: str | None = None) -> bool:
    """Take the run's lease (True) unless another advance holds it. ``lease`` is the parked
    lease a waiting run's wake-up carries: that wake-up, and only it, may take it early."""
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    if lease:
        with contextlib.suppress(ValueError):
            free |= Q(lease_until=datetime.fromisoformat(lease))
    return bool(
        PipelineRun.objects.unscoped()
        .filter(free, pk=run_id, state=RunState.RUNNING)
        .update(lease_until=now + timedelta(seconds=LEASE_S))
    )


def _park(run_id: int, seconds: float = WAIT_COUNTDOWN_S) -> str:
    """Hold the lease for the queued wake-up of a waiting run (so the beat's sweep leaves the
    run alone while its wake-up is on the way); returns the token the wake-up carries."""
    until = timezone.now() + timedelta(seconds=seconds + PARK_GRACE_S)
    PipelineRun.objects.unscoped().filter(pk=run_id).update(lease_until=until)
    return until.isoformat()


def _renew(run_id: int) -> None:
    PipelineRun.objects.unscoped().filter(pk=run_id).update(
        lease_until=timezone.now() + timedelta(seconds=LEASE_S)
    )


def _release(run_id: int) -> None:
    PipelineRun.objects.unscoped().filter(pk=run_id).update(lease_until=None)


def pipeline_runs_resume() -> int:
    """Re-queue every running run that nobody is advancing or waking (its lease lapsed or was
    never taken): the beat's safety net for a wake-up lost with a worker. Returns how many."""
    now = timezone.now()
    ids = list(
        PipelineRun.objects.unscoped()
        .filter(state=RunState.RUNNING)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("pk", flat=True)[:500]
    )
    for run_id in ids:
        with transaction.atomic():
            _dispatch(run_id)
    return len(ids)


def pipeline_run_advance(run_id: int, *, dispatch: bool = True, lease: str | None = None) -> str:
    """Run the stages that can run now; returns the run's state. Another advance of the same
    run in progress (or a wake-up on its way) makes this one return at once."""
    if not _claim(run_id, lease):
        return PipelineRun.objects.unscoped().values_list("state", flat=True).get(pk=run_id)
    wait: Wait | None = None
    try:
        state, wait = _advance(run_id)
    finally:
        if not (wait and dispatch):
            _release(run_id)
    if wait and dispatch:
        token = _park(run_id, wait.seconds)
        with transaction.atomic():
            _dispatch(run_id, wait.seconds, token)
    return state


def _advance(run_id: int) -> tuple[str, Wait | None]:
    """(the run's state, the wait of a stage that waits, if one does)."""
    run = PipelineRun.objects.unscoped().select_related("workspace", "pipeline").get(pk=run_id)
    if run.state != RunState.RUNNING:
        return run.state, None
    for stage in StageRun.objects.for_workspace(run.workspace_id).filter(run=run):
        if stage.state in {RunState.SUCCEEDED, RunState.SKIPPED}:
            continue
        handler = stage_handler(stage.kind)
        _renew(run.pk)
        if stage.state == RunState.PENDING:
            stage.state = RunState.RUNNING
            stage.attempts += 1
            stage.started_at = timezone.now()
            stage.save(update_fields=["state", "attempts", "started_at"])
        try:
            if handler is None:
                raise RuntimeError(f"no handler for stage kind {stage.kind!r}")
            output = handler(run, stage, dict(run.context))
        except Exception as exc:
            logger.info("pipeline run %s stage %s failed", run.pk, stage.name, exc_info=True)
            message = _message(exc)
            stage.state = RunState.FAILED
            stage.error = message[:5000]
            stage.finished_at = timezone.now()
            stage.save(update_fields=["state", "error", "finished_at", "output"])
            _finish_run(run, RunState.FAILED, f"{stage.name}: {message}")
            return run.state, None
        if isinstance(output, Wait):
            stage.save(update_fields=["output"])
            return run.state, output
        stage.output = {**stage.output, **(output or {})}
        stage.state = RunState.SUCCEEDED
        stage.finished_at = timezone.now()
        stage.save(update_fields=["state", "output", "finished_at"])
        run.context = {**run.context, **(output or {})}
        run.save(update_fields=["context"])
    _finish_run(run, RunState.SUCCEEDED)
    return run.state, None


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{k}: {v}" for k, v in getattr(exc, "message_dict", {}).items()) or str(
            exc
        )
    return f"{type(exc).__name__}: {exc}"


def _param(run: PipelineRun, stage: StageRun, name: str, default: Any = None) -> Any:
    stage_params = next(
        (s.get("params", {}) for s in run.pipeline.stages if s["name"] == stage.name), {}
    )
    return run.params.get(
        f"{stage.name}.{name}", stage_params.get(name, run.params.get(name, default))
    )


# --- built-in stages ----------------------------------------------------------------------------


def build_samples(run: PipelineRun, stage: StageRun, context: dict) -> dict:
    """A new version of the named dataset over the newest data (same label and features), or a
    given ``dataset_id`` as is."""
    from features import services as feature_services
    from features.models import Dataset, DatasetStatus

    dataset_id = _param(run, stage, "dataset_id")
    if dataset_id:
        dataset = Dataset.objects.for_workspace(run.workspace).get(pk=dataset_id)
    elif _param(run, stage, "stream", False):
        dataset = _build_stream(run, stage)
    else:
        name = _param(run, stage, "dataset")
        if not name:
            raise ValidationError({"dataset": "give params.dataset (a name) or dataset_id"})
        latest = Dataset.objects.for_workspace(run.workspace).filter(name=name).first()
        if latest is None:
            raise ValidationError({"dataset": f"no dataset '{name}'"})
        dataset = feature_services.dataset_create(
            actor=None,
            workspace=run.workspace,
            name=name,
            label_group=latest.label_group,
            label_columns=list(latest.label_columns),
            feature_refs=list(latest.feature_refs),
        )
    if dataset.status != DatasetStatus.READY:
        raise RuntimeError(f"dataset {dataset} is {dataset.status}: {dataset.error[:300]}")
    return {"dataset_id": dataset.pk, "rows": dataset.row_count}


STREAM_DATASET = "sample_stream"


def workspace_stream(workspace) -> dict[str, Any]:
    """The workspace's default sample stream (label source, label columns, features) with what
    is missing filled in from its newest ready dataset, so a workspace that has trained
    before has a stream to add a feature to."""
    from features.models import Dataset, DatasetStatus

    stream = dict((workspace.template or {}).get("sample_stream") or {})
    features = [f for f in stream.get("features") or [] if isinstance(f, str)]
    label_source = stream.get("label_source")
    label_columns = [c for c in stream.get("label_columns") or [] if isinstance(c, str)]
    latest = (
        Dataset.objects.for_workspace(workspace)
        .filter(status=DatasetStatus.READY)
        .select_related("label_group")
        .order_by("-created_at", "-id")
    )
    if isinstance(label_source, str) and label_source:
        latest = latest.filter(label_group__name=label_source)
    base = latest.first()
    if base is not None:
        label_source = label_source or base.label_group.name
        label_columns = label_columns or list(base.label_columns)
        seen = set(features)
        features = [f for f in base.feature_refs if f not in seen] + features
    return {
        "label_source": label_source if isinstance(label_source, str) else None,
        "label_columns": label_columns,
        "features": features,
    }


def _build_stream(run: PipelineRun, stage: StageRun):
    """A new version of the stream's dataset over its current label source and features."""
    from features import services as feature_services
    from features.models import FeatureGroup

    stream = workspace_stream(run.workspace)
    if not stream["label_source"] or not stream["label_columns"]:
        raise ValidationError(
            {"sample_stream": "the workspace has no label source yet: build a dataset first"}
        )
    if not stream["features"]:
        raise ValidationError({"sample_stream": "the workspace's sample stream has no features"})
    label_group = (
        FeatureGroup.objects.for_workspace(run.workspace)
        .filter(name=stream["label_source"])
        .first()
    )
    if label_group is None:
        raise ValidationError({"sample_stream": f"no feature group '{stream['label_source']}'"})
    return feature_services.dataset_create(
        actor=run.created_by,
        workspace=run.workspace,
        name=str(_param(run, stage, "dataset") or STREAM_DATASET),
        label_group=label_group,
        label_columns=stream["label_columns"],
        feature_refs=stream["features"],
    )


def add_feature(run: PipelineRun, stage: StageRun, context: dict) -> dict:
    """Add ``features`` (a list of ``group:feature`` refs) to the workspace's sample stream
    (seeding the stream from the newest ready dataset when it has no label source yet)."""
    from features import services as feature_services
    from workspaces.services import workspace_update

    refs = _param(run, stage, "features") or []
    if not isinstance(refs, list) or not refs:
        raise ValidationError({"features": "give a list of 'group:feature' references"})
    stream = workspace_stream(run.workspace)
    template = dict(run.workspace.template or {})
    current = dict(template.get("sample_stream") or {})
    if stream["label_source"] and not current.get("label_source"):
        template["sample_stream"] = {**current, **stream}
        run.workspace = workspace_update(actor=None, workspace=run.workspace, template=template)
    for ref in refs:
        feature_services.sample_stream_add_feature(
            actor=run.created_by, workspace=run.workspace, feature_ref=ref
        )
    run.workspace.refresh_from_db()
    return {"features_added": list(refs)}


def _model_defaults(workspace) -> tuple[str, dict[str, Any]]:
    from training.bundle import TEMPLATES

    model = (workspace.template or {}).get("model") or {}
    template = model.get("template")
    params = model.get("params") if isinstance(model.get("params"), dict) else {}
    if template not in TEMPLATES:
        template = "fine_ranking"
    return template, dict(params)


def train(run: PipelineRun, stage: StageRun, context: dict) -> Any:
    """Submit a training job (first call), then wait until it ends."""
    from features.models import Dataset
    from training.services import job_create

    job_id = stage.output.get("job_id")
    if not job_id:
        dataset = Dataset.objects.for_workspace(run.workspace).get(pk=context["dataset_id"])
        base = None
        if _param(run, stage, "incremental", False):
            base = (
                TrainingJob.objects.for_workspace(run.workspace)
                .filter(state=JobState.SUCCEEDED, template=_param(run, stage, "template", ""))
                .first()
            )
        default_template, default_params = _model_defaults(run.workspace)
        job = job_create(
            actor=None,
            workspace=run.workspace,
            name=f"{run.pipeline.name}-run{run.pk}"[:63],
            dataset=dataset,
            template=_param(run, stage, "template") or default_template,
            params=dict(_param(run, stage, "train_params") or default_params),
            base_job=base,
            priority_class=_param(run, stage, "priority_class", "production"),
            compare_deployment=str(_param(run, stage, "deployment") or ""),
        )
        stage.output = {"job_id": job.pk}
        return WAIT
    job = TrainingJob.objects.for_workspace(run.workspace).get(pk=job_id)
    if job.state == JobState.SUCCEEDED:
        return {"job_id": job.pk, "model_path": job.model_path}
    if job.state in {JobState.FAILED, JobState.CANCELLED}:
        raise RuntimeError(f"training job {job.pk} {job.state}: {job.state_reason}")
    return WAIT


def evaluate(run: PipelineRun, stage: StageRun, context: dict) -> dict:
    """The job's held-out metrics; ``min_auc`` and ``max_auc_drop`` (vs production) gate."""
    job = TrainingJob.objects.for_workspace(run.workspace).get(pk=context["job_id"])
    holdout = (job.metrics or {}).get("holdout") or {}
    auc = holdout.get("auc")
    min_auc = _param(run, stage, "min_auc")
    if min_auc is not None and (auc is None or auc < float(min_auc)):
        raise RuntimeError(f"held-out AUC {auc} is below the gate {min_auc}")
    delta = (job.metrics or {}).get("auc_delta_vs_production")
    max_drop = _param(run, stage, "max_auc_drop")
    if max_drop is not None and delta is not None and delta < -float(max_drop):
        raise RuntimeError(f"AUC is {-delta:.4f} below the production model's")
    return {"auc": auc, "logloss": holdout.get("logloss"), "auc_delta_vs_production": delta}


def register_candidate(run: PipelineRun, stage: StageRun, context: dict) -> dict:
    """Fallback until serving registers its handler: mark the model as the run's candidate."""
    with transaction.atomic():
        job = TrainingJob.objects.for_workspace(run.workspace).get(pk=context["job_id"])
        event_record(
            actor=None,
            workspace=run.workspace,
            verb="training.candidate.selected",
            refs=[Ref.to(job, role="input"), Ref.to(run)],
            payload={"model_path": job.model_path},
        )
    return {"candidate_job_id": job.pk}


# Built-ins never replace a handler another app registered first (serving's "register").
for _kind, _handler in (
    ("build_samples", build_samples),
    ("train", train),
    ("evaluate", evaluate),
    ("register", register_candidate),
    ("add_feature", add_feature),
):
    _HANDLERS.setdefault(_kind, _handler)
