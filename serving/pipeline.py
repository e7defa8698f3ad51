"""Pipeline glue: the "register" and "deploy" stages and the production-model resolver that
training calls through its plugin registries (training never imports serving)."""

from __future__ import annotations

import logging
from typing import Any

from serving.models import Deployment, GateStatus, ModelVersion

log = logging.getLogger(__name__)


def gates_and_deploy(
    *, actor, workspace, version: ModelVersion, deployment: str = ""
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

    Params: ``model`` (default: the pipeline's name)."""
    from serving.registry import model_version_register
    from training.models import TrainingJob

    job = TrainingJob.objects.for_workspace(run.workspace).get(pk=context["job_id"])
    name = str(_param(run, stage, "model") or run.pipeline.name).replace("_", "-")
    version = model_version_register(
        actor=run.created_by, workspace=run.workspace, name=name, job=job
    )
    return {"model_version_id": version.pk, "model": name, "version": version.version}


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


def production_model_resolver(workspace, name: str | None = None):
    """The production version's bundle directory (for training's evaluation against production)."""
    from serving import artifacts

    qs = Deployment.objects.for_workspace(workspace).select_related("version")
    if name:
        qs = qs.filter(model__name=name)
    dep = qs.order_by("-updated_at").first()
    if dep is None:
        return None
    return artifacts.resolve_artifact(dep.version.artifact_path)
