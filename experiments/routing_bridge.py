"""The thin layer between the experiment services and serving: what they ask of serving (its
routing services, release gates, quality check, deployments and prediction log) goes through
here, so a change of serving's API is fixed in one place. Serving never imports experiments.
(``assignment`` uses ``serving.selectors.bucket`` directly, so a unit's bucket is the gateway's
by construction; the loop, its pages and the demo read serving's models directly.)"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from serving import selectors as routing_reads
from serving.models import Deployment, GateStatus, ModelVersion, PredictionLog
from workspaces.events import Actor
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace
from workspaces.selectors import workspace_object


def deployment_of(workspace: Workspace, deployment: Any) -> Deployment:
    """The workspace's deployment given as the object, its id or its name (404 naming
    ``deployment`` otherwise)."""
    return workspace_object(Deployment, workspace=workspace, ref=deployment, attr="deployment")


def version_of(workspace: Workspace, version_id: Any) -> ModelVersion:
    """The workspace's model version given as the object or its id (404 naming
    ``treatment_versions`` otherwise)."""
    return workspace_object(
        ModelVersion,
        workspace=workspace,
        ref=version_id.pk if isinstance(version_id, ModelVersion) else version_id,
        attr="treatment_versions",
        name_field=None,
        invalid="give model version ids",
    )


def version_gated(version: ModelVersion) -> bool:
    """Whether the version passed its release gates (only those may take traffic)."""
    from serving.services import require_deployable

    if version.gate_status != GateStatus.PASSED:
        return False
    try:
        require_deployable(version)
    except ConflictError:
        return False
    return True


def require_quality(exp) -> None:
    """409 naming the metric when a treatment is worse than the deployment's production on the
    same held-out rows (serving's quality gate) and no maintainer overrode it."""
    from serving.services import require_quality as serving_require_quality

    dep = (
        Deployment.objects.for_workspace(exp.workspace_id)
        .select_related("version")
        .get(pk=exp.deployment_id)
    )
    for arm in exp.arms[1:]:
        serving_require_quality(version_of(exp.workspace, arm["version_id"]), dep)


def set_allocations(
    *, actor: Actor, workspace, deployment, experiment_key, layer, salt, allocations
) -> None:
    from serving.services import routing_experiment_set

    routing_experiment_set(
        actor=actor,
        workspace=workspace,
        deployment=deployment,
        experiment_key=experiment_key,
        layer=layer,
        salt=salt,
        allocations=allocations,
    )


def clear(*, actor: Actor, workspace, deployment, experiment_key, reason: str) -> bool:
    from serving.services import routing_experiment_clear

    return routing_experiment_clear(
        actor=actor,
        workspace=workspace,
        deployment=deployment,
        experiment_key=experiment_key,
        reason=reason,
    )


def table(workspace: Workspace, deployment: Any) -> dict[str, Any]:
    return routing_reads.routing_table(workspace, deployment)


def route(table_: dict[str, Any], unit_id: str):
    return routing_reads.route(table_, unit_id)


def promote(*, actor: Actor, workspace, deployment, version_id: int, reason: str) -> None:
    """Make ``version_id`` the deployment's production version (serving's release service:
    the gateway loads it before traffic moves, so no request is dropped; serving's controller
    applies the backend after the commit)."""
    from serving import services as serving_services

    dep = deployment_of(workspace, deployment.pk if hasattr(deployment, "pk") else deployment)
    version = version_of(workspace, version_id)
    serving_services.deployment_release(
        actor=actor, workspace=workspace, deployment=dep, version=version, reason=reason
    )


def predictions_by_request(workspace: Workspace, request_ids: Iterable[str]) -> dict[str, dict]:
    rows = (
        PredictionLog.objects.for_workspace(workspace)
        .filter(request_id__in=list(request_ids))
        .values("request_id", "unit_id", "experiment_key", "arm")
    )
    return {row["request_id"]: row for row in rows}


def exposed_units(workspace: Workspace, experiment_key: str) -> Iterable[tuple[str, str]]:
    """Distinct (arm, unit) pairs the gateway served for an experiment."""
    return (
        PredictionLog.objects.for_workspace(workspace)
        .filter(experiment_key=experiment_key)
        .values_list("arm", "unit_id")
        .distinct()
    )


def deployment_choices(workspace: Workspace) -> list[tuple[int, str]]:
    """(id, label) of the workspace's deployments, for the experiment form's select."""
    return [
        (dep.pk, f"{dep.name} ({dep.model.name} v{dep.version.version} in production)")
        for dep in Deployment.objects.for_workspace(workspace)
        .select_related("model", "version")
        .order_by("name")
    ]


def version_choices(workspace: Workspace) -> list[tuple[int, str]]:
    """(id, label) of the versions of deployed models, newest first, with their gate status:
    the candidates for an experiment's treatment arms."""
    deployments = Deployment.objects.for_workspace(workspace)
    models = deployments.values_list("model_id", flat=True)
    production: dict[int, list[str]] = {}
    for dep in deployments.only("name", "version_id"):
        production.setdefault(dep.version_id, []).append(dep.name)
    return [
        (
            v.pk,
            f"{v.model.name} v{v.version} (#{v.pk}, gates {v.gate_status}"
            + (f"; production of {', '.join(production[v.pk])}" if v.pk in production else "")
            + ")",
        )
        for v in ModelVersion.objects.for_workspace(workspace)
        .filter(model_id__in=models)
        .select_related("model")
        .order_by("model__name", "-version")
    ]
