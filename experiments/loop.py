"""The one action: from a feature to a running A/B experiment (``POST .../loops/``).

A loop is a run of the workspace's ``ab-loop`` pipeline, a pipeline like any other (its DAG,
retry from the failed stage, events), with these stages:

    add_feature -> build_samples -> train -> evaluate -> quality_gate -> register
    -> release_gates -> challenger -> experiment

``add_feature`` puts the feature(s) into the workspace's sample stream, ``build_samples``
builds the stream's next dataset, ``train`` trains the workspace's default template (its
held-out evaluation scores the production model of the target deployment on the same rows),
``quality_gate`` refuses a candidate worse than production (serving), ``register`` and
``release_gates`` make it a gated model version, ``challenger`` loads it inside the production
deployment, and ``experiment`` (this module's stage kind) creates and starts the A/B experiment
with the workspace's loop policy (ramp, guardrails, primary metric), within the policy that
starts it without review.

The experiments app registers the ``experiment`` stage kind in its ``AppConfig.ready`` (training
never imports it), and owns the loop because it is the one app that may use every app the loop
touches (features, training and serving).
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from experiments import services
from experiments.models import Experiment, ExperimentState, Metric
from workspaces.events import Actor
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace
from workspaces.selectors import workspace_object

LOOP_PIPELINE = "ab-loop"
LOOP_STAGES: list[dict[str, Any]] = [
    {"name": "add_feature", "kind": "add_feature", "after": [], "params": {}},
    {"name": "build_samples", "kind": "build_samples", "after": ["add_feature"],
     "params": {"stream": True}},
    {"name": "train", "kind": "train", "after": ["build_samples"], "params": {}},
    {"name": "evaluate", "kind": "evaluate", "after": ["train"], "params": {}},
    {"name": "quality_gate", "kind": "quality_gate", "after": ["evaluate"], "params": {}},
    {"name": "register", "kind": "register", "after": ["quality_gate"], "params": {}},
    {"name": "release_gates", "kind": "release_gates", "after": ["register"], "params": {}},
    {"name": "challenger", "kind": "challenger", "after": ["release_gates"], "params": {}},
    {"name": "experiment", "kind": "experiment", "after": ["challenger"], "params": {}},
]  # fmt: skip
# What each stage's output links to on the loop page: (context key, object kind).
STAGE_OBJECTS = {
    "build_samples": ("dataset_id", "dataset"),
    "train": ("job_id", "job"),
    "register": ("model_version_id", "model_version"),
    "release_gates": ("model_version_id", "model_version"),
    "challenger": ("challenger_version_id", "model_version"),
    "experiment": ("experiment_id", "experiment"),
}
# How often a loop whose experiment waits for a maintainer's review looks again.
REVIEW_POLL_S = 60.0
DEFAULT_LOOP_POLICY: dict[str, Any] = {
    "ramp_plan": [5, 10, 20],
    "ramp_interval_s": 86400,
    "guardrails": [{"metric": "ctr", "max_drop": 0.1}],
    "primary_metric": Metric.CTR,
    "min_units": 1000,
}


def loop_policy(workspace: Workspace) -> dict[str, Any]:
    """The experiment a loop starts: ``workspace.template["loop"]`` over the defaults, its ramp
    capped at what the workspace's experiment policy starts without review."""
    custom = (workspace.template or {}).get("loop") or {}
    policy = dict(DEFAULT_LOOP_POLICY)
    if isinstance(custom, dict):
        for key in policy:
            if key in custom and custom[key] is not None:
                policy[key] = custom[key]
        if isinstance(custom.get("deployment"), str):
            policy["deployment"] = custom["deployment"]
    cap = services.policy_of(workspace)["max_auto_percent"]
    plan = [p for p in policy["ramp_plan"] if isinstance(p, int | float) and 0 < p <= cap]
    policy["ramp_plan"] = plan or [min(5, cap)]
    return policy


def loop_pipeline(workspace: Workspace):
    """The workspace's ``ab-loop`` pipeline, created on first use."""
    from training import pipelines
    from training.models import Pipeline

    pipeline = Pipeline.objects.for_workspace(workspace).filter(name=LOOP_PIPELINE).first()
    if pipeline is None:
        return pipelines.pipeline_create(
            actor=None,
            workspace=workspace,
            name=LOOP_PIPELINE,
            description="Feature to running A/B experiment, in one action.",
            stages=LOOP_STAGES,
        )
    if pipeline.stages != pipelines.ordered_stages(LOOP_STAGES):
        pipeline.stages = pipelines.ordered_stages(LOOP_STAGES)
        pipeline.save(update_fields=["stages"])
    return pipeline


def _features_of(workspace: Workspace, group: Any, features: Any) -> tuple[str, list[str]]:
    from features.models import FeatureGroupVersion, Lifecycle
    from features.selectors import feature_groups_of

    if not isinstance(group, str) or not group:
        raise ValidationError({"group": "name the feature group to try"})
    found = workspace_object(
        feature_groups_of(workspace=workspace), workspace=workspace, ref=group, attr="group"
    )
    if found.status == Lifecycle.RETIRED:
        raise ValidationError({"group": f"feature group '{group}' is retired"})
    version = FeatureGroupVersion.objects.for_workspace(workspace).get(
        group=found, version=found.current_version
    )
    names = [f["name"] for f in version.features]
    if features is None:
        chosen = names
    elif isinstance(features, list) and features and all(isinstance(f, str) for f in features):
        unknown = [f for f in features if f not in names]
        if unknown:
            raise ValidationError(
                {"features": f"not in {group} v{found.current_version}: {unknown}; one of {names}"}
            )
        chosen = list(dict.fromkeys(features))
    else:
        raise ValidationError({"features": f"a list of feature names of {group}: {names}"})
    return group, [f"{group}:{name}" for name in chosen]


def _deployment_of(workspace: Workspace, deployment: Any) -> Any:
    from serving.models import Deployment

    names = list(
        Deployment.objects.for_workspace(workspace).order_by("name").values_list("name", flat=True)
    )
    if deployment in (None, ""):
        deployment = loop_policy(workspace).get("deployment")
    if deployment in (None, ""):
        if len(names) == 1:
            deployment = names[0]
        elif not names:
            raise ConflictError(
                "the workspace has no production deployment yet: deploy a model first, then "
                "try features against it",
                attr="deployment",
            )
        else:
            raise ValidationError({"deployment": f"name the production deployment: {names}"})
    if not isinstance(deployment, str):
        raise ValidationError({"deployment": f"a deployment name: {names}"})
    return workspace_object(Deployment, workspace=workspace, ref=deployment, attr="deployment")


def _check_joinable(workspace: Workspace, group: str, refs: list[str]) -> None:
    """400 now, not a failed first stage: the features must join the stream's label source."""
    from features.models import FeatureGroup
    from features.selectors import check_feature_refs
    from training.pipelines import workspace_stream

    label_source = workspace_stream(workspace)["label_source"]
    label_group = (
        FeatureGroup.objects.for_workspace(workspace).filter(name=label_source).first()
        if label_source
        else None
    )
    if label_group is None:
        return
    if label_group.name == group:
        raise ValidationError({"group": f"'{group}' is the sample stream's label source"})
    try:
        check_feature_refs(workspace, label_group, refs)
    except ValidationError as exc:
        raise ValidationError(
            {"group": [m for messages in exc.message_dict.values() for m in messages]}
        ) from exc


def loops_of(workspace: Workspace):
    from training.models import PipelineRun

    return (
        PipelineRun.objects.for_workspace(workspace)
        .filter(pipeline__name=LOOP_PIPELINE)
        .select_related("pipeline")
    )


# Candidate values have no event times (they are static attributes in the evaluation): as a
# feature group they are stamped long before any label, so every label row sees them.
CANDIDATE_EVENT_TIME = datetime(2000, 1, 1, tzinfo=UTC)


@transaction.atomic
def group_from_candidate(*, actor: Actor, workspace: Workspace, evaluation: Any) -> str:
    """The feature group that holds a finished candidate evaluation's values (registered and
    filled on first use: ``cand_<name>``, keyed like the evaluation, one feature ``value``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from django.conf import settings

    from features import services as feature_services
    from features.models import EntityKind, FeatureGroup
    from training.models import CandidateEvaluation, RunState

    evaluation = workspace_object(
        CandidateEvaluation, workspace=workspace, ref=evaluation, attr="evaluation", name_field=None
    )
    if evaluation.state != RunState.SUCCEEDED or not evaluation.values_path:
        raise ConflictError(
            f"candidate evaluation '{evaluation.name}' is {evaluation.state}: only a finished "
            "one can be tried in an experiment",
            attr="evaluation",
        )
    name = re.sub(r"[^a-z0-9_]", "_", f"cand_{evaluation.name}".lower())[:63]
    group = FeatureGroup.objects.for_workspace(workspace).filter(name=name).first()
    if group is not None:
        return group.name
    key = evaluation.key_column
    keyed = FeatureGroup.objects.for_workspace(workspace).filter(entity_keys=[key]).first()
    entity = (
        keyed.entity
        if keyed is not None
        else (EntityKind.USER if key.startswith("user") else EntityKind.ITEM)
    )
    group = feature_services.feature_group_register(
        actor=actor,
        workspace=workspace,
        name=name,
        entity=entity,
        entity_keys=[key],
        features=[{"name": "value", "dtype": evaluation.dtype}],
        description=f"Values of the candidate evaluation '{evaluation.name}'.",
        tags=["candidate"],
    )
    table = pq.read_table(f"{settings.ARTIFACT_ROOT}/{evaluation.values_path}")
    table = table.select([key, "value"]).append_column(
        "event_time", pa.array([CANDIDATE_EVENT_TIME] * table.num_rows, pa.timestamp("us", "UTC"))
    )
    table = table.filter(pc.invert(pc.is_null(table.column(key))))
    for start in range(0, table.num_rows, 100_000):
        sink = io.BytesIO()
        pq.write_table(table.slice(start, 100_000), sink)
        feature_services.batch_ingest(
            actor=actor, group=group, body=sink.getvalue(), format="parquet"
        )
    return group.name


@transaction.atomic
def loop_start(
    *,
    actor: Actor,
    workspace: Workspace,
    group: Any = None,
    features: Any = None,
    deployment: Any = None,
    evaluation: Any = None,
    dispatch: bool = True,
):
    """Start the loop for a feature group's features (all of them unless ``features`` names
    some), or for a finished candidate evaluation's values (``evaluation``), against
    ``deployment`` (default: the loop policy's, else the workspace's only one). Returns the
    pipeline run; 409 while a loop for the same group is still running."""
    from training import pipelines
    from training.models import RunState

    if evaluation is not None and group in (None, ""):
        group = group_from_candidate(actor=actor, workspace=workspace, evaluation=evaluation)
    group, refs = _features_of(workspace, group, features)
    dep = _deployment_of(workspace, deployment)
    _check_joinable(workspace, group, refs)
    running = loops_of(workspace).filter(state=RunState.RUNNING, params__group=group).first()
    if running is not None:
        raise ConflictError(
            f"a loop for '{group}' is already running (#{running.pk}); wait for it or retry it",
            attr="group",
        )
    pipeline = loop_pipeline(workspace)
    return pipelines.pipeline_run_start(
        actor=actor,
        pipeline=pipeline,
        params={"group": group, "features": refs, "deployment": dep.name, **_recipe(dep)},
        dispatch=dispatch,
    )


def _recipe(dep) -> dict[str, Any]:
    """What the candidate trains with: the workspace's default model when it names parameters
    (``template.model``), else the production model's own recipe (its job's template and
    params), so the comparison on the same rows is about the feature, not the settings."""
    model = (dep.workspace.template or {}).get("model") or {}
    if isinstance(model.get("params"), dict) and model["params"] and model.get("template"):
        return {"template": model["template"], "train_params": dict(model["params"])}
    job = dep.version.job if dep.version.job_id else None
    if job is not None and job.template:
        return {"template": job.template, "train_params": dict(job.params or {})}
    return {}


@transaction.atomic
def loop_retry(*, actor: Actor, run, quality_override: str = "", dispatch: bool = True):
    """Retry a failed loop from its failed stage; ``quality_override`` (a maintainer's reason)
    lets a candidate past a failed quality gate, recorded and flagged for audit."""
    from training import pipelines
    from training.models import PipelineRun

    reason = str(quality_override or "").strip()
    if reason:
        PipelineRun.objects.for_workspace(run.workspace_id).filter(pk=run.pk).update(
            params={
                **run.params,
                "quality_override": reason[:2000],
                "quality_override_by": getattr(actor, "username", ""),
            }
        )
    return pipelines.pipeline_run_retry(actor=actor, run=run, dispatch=dispatch)


def _key(run) -> str:
    group = str(run.params.get("group") or "feature").replace("_", "-")[:40]
    return f"loop-{run.pk}-{group}".lower()


def experiment_stage(run, stage, context: dict) -> Any:
    """Pipeline stage "experiment": create the A/B experiment (control: production, treatment:
    the challenger) with the loop policy and submit it; waits while it is under review, done when
    it runs."""
    from training.pipelines import Wait

    exp_id = stage.output.get("experiment_id") or context.get("experiment_id")
    exp = Experiment.objects.for_workspace(run.workspace).filter(pk=exp_id).first()
    if exp is None:
        exp = Experiment.objects.for_workspace(run.workspace).filter(key=_key(run)).first()
    if exp is None:
        policy = loop_policy(run.workspace)
        dep = _deployment_of(run.workspace, run.params.get("deployment"))
        features = ", ".join(run.params.get("features") or [])
        exp = services.experiment_create(
            actor=run.created_by,
            workspace=run.workspace,
            key=_key(run),
            hypothesis=(
                f"Adding {features} to the sample stream lifts {policy['primary_metric']} "
                f"(loop #{run.pk}: the candidate passed the quality gate against production)."
            ),
            deployment=dep.pk,
            treatment_versions=[int(context["challenger_version_id"])],
            guardrails=policy["guardrails"],
            primary_metric=policy["primary_metric"],
            ramp_plan=policy["ramp_plan"],
            ramp_interval_s=int(policy["ramp_interval_s"]),
            min_units=int(policy["min_units"]),
        )
    stage.output = {"experiment_id": exp.pk, "experiment": exp.key}
    if exp.state == ExperimentState.DRAFT:
        exp = services.experiment_submit(actor=run.created_by, experiment=exp)
    if exp.state == ExperimentState.RUNNING:
        return {
            "experiment_id": exp.pk,
            "experiment": exp.key,
            "traffic_percent": exp.traffic_percent,
        }
    if exp.state == ExperimentState.PENDING_REVIEW:
        return Wait(REVIEW_POLL_S)  # a maintainer decides: minutes, not seconds
    raise RuntimeError(f"experiment {exp.key} is {exp.state}: {exp.stop_reason}")


def _object_link(workspace: Workspace, kind: str, object_id: Any) -> dict[str, Any] | None:
    """The loop page's link for a stage's object (None when it is gone)."""
    from django.urls import reverse

    from features.models import Dataset
    from serving.models import ModelVersion
    from training.models import TrainingJob

    ws = workspace.slug
    if kind == "dataset":
        found = Dataset.objects.for_workspace(workspace).filter(pk=object_id).first()
        if found is None:
            return None
        url = reverse("features-dataset", args=[ws, found.name, found.version])
        return {"kind": kind, "id": found.pk, "label": f"{found.name} v{found.version}", "url": url}
    if kind == "job":
        found = TrainingJob.objects.for_workspace(workspace).filter(pk=object_id).first()
        if found is None:
            return None
        url = reverse("training-job", args=[ws, found.pk])
        return {"kind": kind, "id": found.pk, "label": str(found), "url": url}
    if kind == "model_version":
        found = (
            ModelVersion.objects.for_workspace(workspace)
            .select_related("model")
            .filter(pk=object_id)
            .first()
        )
        if found is None:
            return None
        url = reverse("serving-version", args=[ws, found.model.name, found.version])
        return {"kind": kind, "id": found.pk, "label": str(found), "url": url}
    if kind == "experiment":
        found = Experiment.objects.for_workspace(workspace).filter(pk=object_id).first()
        if found is None:
            return None
        url = reverse("experiments-detail", args=[ws, found.key])
        return {"kind": kind, "id": found.pk, "label": found.key, "url": url, "state": found.state}
    return None


def loop_summary(run, *, links: bool = True) -> dict[str, Any]:
    """Each stage of a loop with its state, error and linked object (API and page alike); lists
    pass ``links=False`` (a fixed number of queries per page, not per loop)."""
    stages = []
    context = dict(run.context or {})
    for stage in sorted(run.stage_runs.all(), key=lambda s: s.position):
        output = {**(stage.output or {})}
        link = None
        if links and stage.name in STAGE_OBJECTS:
            key, kind = STAGE_OBJECTS[stage.name]
            object_id = output.get(key) or (
                context.get(key) if stage.state == "succeeded" else None
            )
            if object_id:
                link = _object_link(run.workspace, kind, object_id)
        seconds = None
        if stage.started_at and stage.finished_at:
            seconds = round((stage.finished_at - stage.started_at).total_seconds(), 1)
        stages.append(
            {
                "name": stage.name,
                "kind": stage.kind,
                "state": stage.state,
                "attempts": stage.attempts,
                "error": stage.error,
                "seconds": seconds,
                "started_at": stage.started_at,
                "finished_at": stage.finished_at,
                "object": link,
            }
        )
    failed = next((s for s in stages if s["state"] == "failed"), None)
    quality = context.get("quality") or {}
    return {
        "id": run.pk,
        "state": run.state,
        "group": run.params.get("group"),
        "features": run.params.get("features") or [],
        "deployment": run.params.get("deployment"),
        "error": run.error,
        "failed_stage": failed["name"] if failed else None,
        "quality_gate_failed": bool(
            failed and failed["kind"] == "quality_gate" and not run.params.get("quality_override")
        ),
        "quality": quality,
        "stages": stages,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
    }
