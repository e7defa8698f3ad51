"""Pipeline glue: serving's stage kinds ("register", "quality_gate", "release_gates",
"challenger", "deploy"), the tuning registrar that registers a tuning job's best trial, and the
production-model resolver, which training calls through its plugin registries (training never
imports serving)."""

from __future__ import annotations

import logging
from typing import Any

from serving.models import Deployment, GateStatus, ModelVersion
from workspaces.events import Actor, Ref, event_record

log = logging.getLogger(__name__)


def gates_and_deploy(
    *, actor: Actor, workspace, version: ModelVersion, deployment: str = ""
) -> ModelVersion:
    """Run the release gates; when they pass and ``deployment`` is named, release to it (created
    on first use)."""
    from serving.deployments import deployment_create, deployment_release
    from serving.gates import version_gates_run

    version = version_gates_run(actor=actor, workspace=workspace, version=version)
    if not deployment or version.gate_status != GateStatus.PASSED:
        return version
    dep = Deployment.objects.for_workspace(workspace).filter(name=deployment).first()
    if dep is None:
        deployment_create(actor=actor, workspace=workspace, name=deployment, version=version)
    else:
        deployment_release(
            actor=actor,
            workspace=workspace,
            deployment=dep,
            version=version,
            reason="automatic release: gates passed",
        )
    return version


def _param(run, stage, name: str, default: Any = None) -> Any:
    stage_params = next(
        (s.get("params", {}) for s in run.pipeline.stages if s.get("name") == stage.name), {}
    )
    return run.params.get(
        f"{stage.name}.{name}", stage_params.get(name, run.params.get(name, default))
    )


def register_stage(run, stage, context: dict) -> dict:
    """Pipeline stage "register": the trained job's bundle becomes the next model version.

    Params: ``model`` (default: the model of the ``deployment`` param, else the pipeline's
    name). A quality verdict from an earlier ``quality_gate`` stage goes onto the version."""
    from serving.registry import model_version_register
    from training.models import TrainingJob

    job = TrainingJob.objects.for_workspace(run.workspace).get(pk=context["job_id"])
    name = _param(run, stage, "model")
    if not name and _param(run, stage, "deployment"):
        dep = production_deployment(run.workspace, str(_param(run, stage, "deployment")))
        name = dep.model.name if dep else ""
    name = str(name or run.pipeline.name).replace("_", "-")
    version = model_version_register(
        actor=run.created_by, workspace=run.workspace, name=name, job=job
    )
    if isinstance(context.get("quality"), dict):
        ModelVersion.objects.for_workspace(run.workspace).filter(pk=version.pk).update(
            quality=context["quality"]
        )
    return {"model_version_id": version.pk, "model": name, "version": version.version}


def register_tuning_best(*, actor: Actor, workspace, name: str, job, description: str = "") -> dict:
    """A tuning job's best trial becomes the next version of model ``name`` (training's
    ``training.tuning.register_model_registrar`` hook)."""
    from serving.registry import model_version_register

    version = model_version_register(
        actor=actor, workspace=workspace, name=name, job=job, description=description
    )
    return {"id": version.pk, "label": f"{name} v{version.version}", "version": version.version}


def _stage_deployment(run, stage) -> Deployment:
    name = str(_param(run, stage, "deployment") or "")
    dep = production_deployment(run.workspace, name)
    if dep is None:
        raise RuntimeError(
            f"no deployment '{name}' in this workspace"
            if name
            else "name the production deployment (param 'deployment')"
        )
    return dep


def quality_gate_stage(run, stage, context: dict) -> dict:
    """Pipeline stage "quality_gate" (after "train"): the candidate against the production model
    of ``deployment`` on the same held-out rows. A failure fails the stage naming the metric and
    both values; a maintainer's retry with ``quality_override`` (a reason) lets it pass, recorded
    and flagged for audit."""
    from serving import quality
    from training.models import TrainingJob

    job = TrainingJob.objects.for_workspace(run.workspace).get(pk=context["job_id"])
    dep = _stage_deployment(run, stage)
    verdict = quality.job_verdict(job, dep)
    if verdict["status"] == quality.FAILED:
        reason = str(run.params.get("quality_override") or "").strip()
        if not reason:
            raise RuntimeError(verdict["message"])
        verdict["override"] = {
            "by": str(run.params.get("quality_override_by") or "a maintainer"),
            "reason": reason[:2000],
            "at": verdict["checked_at"],
        }
        event_record(
            actor=run.created_by,
            workspace=run.workspace,
            verb="serving.candidate.quality_overridden",
            refs=[Ref.to(job), Ref.to(run, role="related")],
            payload={"reason": reason[:2000], "failures": verdict["failures"]},
        )
    return {"quality": verdict}


def release_gates_stage(run, stage, context: dict) -> dict:
    """Pipeline stage "release_gates" (after "register"): the release gates, no release; a
    failed gate fails the stage naming it."""
    from serving.gates import version_gates_run

    version = (
        ModelVersion.objects.for_workspace(run.workspace)
        .select_related("model")
        .get(pk=context["model_version_id"])
    )
    version = version_gates_run(actor=run.created_by, workspace=run.workspace, version=version)
    if version.gate_status != GateStatus.PASSED:
        failed = [g for g, r in (version.gates or {}).items() if r.get("status") != "passed"]
        raise RuntimeError(f"{version} failed the release gate(s): {', '.join(failed)}")
    return {"gate_status": version.gate_status}


def challenger_stage(run, stage, context: dict) -> dict:
    """Pipeline stage "challenger" (after "release_gates"): the version becomes the model's
    ``challenger`` inside the production deployment, loaded beside production so the gateway
    can route an experiment's share to it without a cold start."""
    from serving.deployments import version_warm
    from serving.registry import model_alias_set

    dep = _stage_deployment(run, stage)
    version = (
        ModelVersion.objects.for_workspace(run.workspace)
        .select_related("model")
        .get(pk=context["model_version_id"])
    )
    if version.model_id != dep.model_id:
        raise RuntimeError(f"{version} is not a version of {dep.model.name}, served by {dep.name}")
    model_alias_set(
        actor=run.created_by,
        workspace=run.workspace,
        model=version.model,
        alias="challenger",
        version=version,
    )
    version_warm(version)
    return {"deployment": dep.name, "challenger_version_id": version.pk}


def deploy_stage(run, stage, context: dict) -> dict:
    """Pipeline stage "deploy" (after "register"): release gates, then an automatic release to
    the deployment (param ``deployment``, default the model's name) when they pass; a failed gate
    fails the stage, naming the gate."""
    version = (
        ModelVersion.objects.for_workspace(run.workspace)
        .select_related("model")
        .get(pk=context["model_version_id"])
    )
    deployment = str(_param(run, stage, "deployment") or version.model.name)
    version = gates_and_deploy(
        actor=run.created_by, workspace=run.workspace, version=version, deployment=deployment
    )
    if version.gate_status != GateStatus.PASSED:
        failed = [g for g, r in (version.gates or {}).items() if r.get("status") != "passed"]
        raise RuntimeError(f"{version} failed the release gate(s): {', '.join(failed)}")
    return {"deployment": deployment, "gate_status": version.gate_status}


def production_deployment(workspace, deployment: str = "") -> Deployment | None:
    """The named deployment, or the workspace's only one when no name is given (with several,
    none: which production a model competes with must be said, not guessed)."""
    qs = Deployment.objects.for_workspace(workspace).select_related("version", "model")
    if deployment:
        return qs.filter(name=deployment).first()
    found = list(qs[:2])
    return found[0] if len(found) == 1 else None


def production_model_resolver(workspace, deployment: str = ""):
    """The production version's bundle directory of ``deployment`` (for training's evaluation
    against production on the same held-out rows)."""
    from serving import artifacts

    dep = production_deployment(workspace, deployment)
    if dep is None:
        return None
    return artifacts.resolve_artifact(dep.version.artifact_path)
