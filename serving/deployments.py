"""Deployments (S3, S4, S6): create, release a new version, roll back, scale, stop.

These services write the desired state only: the ``Deployment`` row (production and previous
version, replicas, scaling, state, backend) with its ``generation`` bumped, the change record,
the routing table (published after the commit) and the event, in one transaction. The backend is
made to match afterwards by its controller (``serving.controllers``: embedded warm-up, local
model-server processes, Kubernetes through the official client), in a task enqueued after the
commit and by the beat's resync; the API answers 202 with the status to follow. No model load,
process start or cluster call runs in a request's transaction or under a row lock.

The embedded gateway processes load every version a new routing table routes to before that
table takes traffic (``TableCache.prepare``), so traffic moves to a warm model; the previous
production version stays loaded, so a rollback is a table flip (well under a second).

Replicas follow ``scaling``: fixed, a schedule of UTC windows, or load (QPS per replica).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from serving.gates import require_deployable
from serving.models import (
    Backend,
    Deployment,
    DeploymentChange,
    DeploymentState,
    DeploymentStatus,
    ModelVersion,
    name_validator,
)
from serving.quality import require_quality
from serving.registry import model_alias_assign
from serving.review import require_review
from serving.routing import publish
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

log = logging.getLogger(__name__)
MAX_REPLICAS = 64


# ---------------------------------------------------------------------------------------------
# Scaling policy


def clean_scaling(scaling: Any) -> dict[str, Any]:
    if scaling in (None, {}):
        return {"mode": "fixed"}
    if not isinstance(scaling, dict):
        raise ValidationError({"scaling": "give an object with a mode"})
    mode = scaling.get("mode", "fixed")
    if mode == "fixed":
        return {"mode": "fixed"}
    if mode == "schedule":
        windows = scaling.get("windows")
        if not isinstance(windows, list) or not windows or len(windows) > 48:
            raise ValidationError({"scaling.windows": "give 1-48 windows"})
        clean = []
        for i, w in enumerate(windows):
            try:
                start = datetime.strptime(str(w["start"]), "%H:%M").strftime("%H:%M")
                end = datetime.strptime(str(w["end"]), "%H:%M").strftime("%H:%M")
                replicas = int(w["replicas"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValidationError(
                    {f"scaling.windows.{i}": "give start and end as HH:MM (UTC) and replicas"}
                ) from exc
            if not 1 <= replicas <= MAX_REPLICAS:
                raise ValidationError({f"scaling.windows.{i}.replicas": f"1-{MAX_REPLICAS}"})
            clean.append({"start": start, "end": end, "replicas": replicas})
        return {"mode": "schedule", "windows": clean}
    if mode == "load":
        try:
            target = float(scaling["target_qps_per_replica"])
            low, high = int(scaling.get("min", 1)), int(scaling.get("max", 8))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError({"scaling": "load mode needs target_qps_per_replica"}) from exc
        if not (math.isfinite(target) and target > 0 and 1 <= low <= high <= MAX_REPLICAS):
            raise ValidationError(
                {"scaling": f"need target > 0 and 1 <= min <= max <= {MAX_REPLICAS}"}
            )
        return {"mode": "load", "target_qps_per_replica": target, "min": low, "max": high}
    raise ValidationError({"scaling.mode": "use fixed, schedule or load"})


def desired_replicas(dep: Deployment, *, now: datetime | None = None, qps: float = 0.0) -> int:
    scaling = dep.scaling or {}
    mode = scaling.get("mode", "fixed")
    if mode == "schedule":
        now = now or timezone.now()
        hhmm = now.strftime("%H:%M")
        for w in scaling["windows"]:
            inside = (
                w["start"] <= hhmm < w["end"]
                if w["start"] <= w["end"]
                else (hhmm >= w["start"] or hhmm < w["end"])
            )
            if inside:
                return w["replicas"]
        return dep.replicas
    if mode == "load":
        want = math.ceil(qps / scaling["target_qps_per_replica"]) if qps > 0 else scaling["min"]
        return max(scaling["min"], min(scaling["max"], want))
    return dep.replicas


# ---------------------------------------------------------------------------------------------
# Handing over to the controllers


def version_warm(version: ModelVersion) -> None:
    """Load and warm ``version`` in this process (a pipeline stage readying a challenger beside
    production). Never called by the deployment services: their controllers warm."""
    from serving.inference import MODELS

    MODELS.get(version.pk)


def controller_enqueue(dep: Deployment) -> None:
    """After the commit, ask the backend's controller to reconcile (a task on
    ``SERVING_CONTROLLER_QUEUE``). A lost or failed publish costs only time: the beat's resync
    takes up every deployment whose observed generation lags."""
    deployment_id = dep.pk

    def send() -> None:
        from serving.tasks import deployment_reconcile_task

        try:
            deployment_reconcile_task.apply_async(
                args=[deployment_id], queue=settings.SERVING_CONTROLLER_QUEUE
            )
        except Exception:  # noqa: BLE001 - the resync catches up
            log.warning("could not enqueue the controller of deployment %s", deployment_id)

    transaction.on_commit(send)


# ---------------------------------------------------------------------------------------------
# Services


def _version(workspace: Workspace, version: Any) -> ModelVersion:
    if isinstance(version, ModelVersion):
        if version.workspace_id != workspace.pk:
            raise ReferenceNotFound("no such model version", attr="version_id")
        return version
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValidationError({"version_id": "give a model version id"})
    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model")
        .filter(pk=version)
        .first()
    )
    if found is None:
        raise ReferenceNotFound("no such model version", attr="version_id")
    return found


def _change(
    dep: Deployment,
    kind: str,
    *,
    actor: Actor,
    from_version: ModelVersion | None,
    to_version: ModelVersion | None,
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> DeploymentChange:
    return DeploymentChange.objects.create(
        workspace=dep.workspace,
        deployment=dep,
        kind=kind,
        from_version=from_version,
        to_version=to_version,
        reason=str(reason)[:500],
        detail=detail or {},
        actor=actor_user(actor),
    )


def deployment_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    version: Any,
    backend: str = Backend.EMBEDDED,
    replicas: int = 1,
    device: str = "cpu",
    scaling: Any = None,
) -> Deployment:
    """A deployment serving ``version`` in production. The row is the desired state; the
    backend's controller makes it so after the commit (its status says when it is Ready)."""
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from exc
    if backend not in Backend.values:
        raise ValidationError({"backend": f"use one of {', '.join(Backend.values)}"})
    if device not in ("cpu", "gpu"):
        raise ValidationError({"device": "use cpu or gpu"})
    if (
        not isinstance(replicas, int)
        or isinstance(replicas, bool)
        or not 1 <= replicas <= MAX_REPLICAS
    ):
        raise ValidationError({"replicas": f"give 1-{MAX_REPLICAS}"})
    scaling = clean_scaling(scaling)
    version = _version(workspace, version)
    require_deployable(version)
    with transaction.atomic():
        try:
            with transaction.atomic():
                dep = Deployment.objects.create(
                    workspace=workspace,
                    name=name,
                    model=version.model,
                    backend=backend,
                    device=device,
                    replicas=replicas,
                    scaling=scaling,
                    version=version,
                    created_by=actor_user(actor),
                )
        except IntegrityError as exc:
            raise ConflictError(f"deployment '{name}' already exists", attr="name") from exc
        DeploymentStatus.objects.create(workspace=workspace, deployment_id=dep.pk)
        _change(
            dep, DeploymentChange.Kind.CREATE, actor=actor, from_version=None, to_version=version
        )
        publish()  # first on-commit callback: traffic moves before anything else
        model_alias_assign(actor=actor, model=version.model, alias="production", version=version)
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.deployment.created",
            refs=[Ref.to(version, role="input"), Ref.to(dep, role="output")],
            payload={
                "name": name,
                "version": version.version,
                "model": version.model.name,
                "backend": backend,
                "replicas": replicas,
                "device": device,
                "scaling": scaling,
                "generation": dep.generation,
            },
        )
        controller_enqueue(dep)
    return dep


def _switch(
    dep: Deployment, *, to: ModelVersion, kind: str, actor: Actor, reason: str
) -> ModelVersion:
    """Inside the caller's transaction, on the locked row: production moves to ``to``, the
    current version stays loaded as the rollback target, the routing table is republished and
    the production alias follows. Returns the version that served before."""
    old = dep.version
    dep.previous_version, dep.version = old, to
    dep.routing_version += 1
    dep.generation += 1
    dep.save(
        update_fields=["previous_version", "version", "routing_version", "generation", "updated_at"]
    )
    _change(dep, kind, actor=actor, from_version=old, to_version=to, reason=reason)
    publish()  # first on-commit callback: traffic moves before anything else
    model_alias_assign(actor=actor, model=to.model, alias="production", version=to)
    controller_enqueue(dep)
    return old


def deployment_release(
    *, actor: Actor, workspace: Workspace, deployment: Deployment, version: Any, reason: str = ""
) -> Deployment:
    """Move production traffic to ``version``; the current one becomes the rollback target."""
    version = _version(workspace, version)
    if version.model_id != deployment.model_id:
        raise ValidationError({"version_id": f"not a version of model '{deployment.model.name}'"})
    # 409 naming the review when the workspace's policy wants a passed human review first.
    require_review(version)
    require_deployable(version)
    if deployment.version_id != version.pk:
        # 409 naming the metric when it is worse than production on the same held-out rows.
        require_quality(version, deployment)
    # Gateways load the version before their table routes to it; the controller warms it too.
    with transaction.atomic():
        dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=deployment.pk)
        if dep.version_id == version.pk:
            return dep
        old = _switch(
            dep, to=version, kind=DeploymentChange.Kind.RELEASE, actor=actor, reason=reason
        )
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.deployment.released",
            refs=[
                Ref.to(version, role="input"),
                Ref.to(dep, role="output"),
                Ref.to(old, role="related"),
            ],
            payload={
                "from_version": old.version,
                "to_version": version.version,
                "reason": str(reason)[:500],
                "routing_version": dep.routing_version,
                "generation": dep.generation,
            },
        )
    return dep


def deployment_rollback(
    *, actor: Actor, workspace: Workspace, deployment: Deployment, reason: str
) -> Deployment:
    """All traffic back to the previous (still loaded) version; who and why are recorded."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError({"reason": "say why you roll back"})
    with transaction.atomic():
        dep = (
            Deployment.objects.for_workspace(workspace)
            .select_for_update(of=("self",))
            .select_related("version", "previous_version")
            .get(pk=deployment.pk)
        )
        if dep.previous_version_id is None:
            raise ConflictError(f"deployment '{dep.name}' has no previous version", attr="version")
        good = dep.previous_version
        bad = _switch(dep, to=good, kind=DeploymentChange.Kind.ROLLBACK, actor=actor, reason=reason)
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.deployment.rolled_back",
            refs=[Ref.to(dep), Ref.to(bad, role="related"), Ref.to(good, role="related")],
            payload={
                "from_version": bad.version,
                "to_version": good.version,
                "reason": reason.strip()[:500],
                "routing_version": dep.routing_version,
                "generation": dep.generation,
            },
        )
    return dep


@transaction.atomic
def deployment_scale(
    *,
    actor: Actor,
    workspace: Workspace,
    deployment: Deployment,
    replicas: Any = None,
    scaling: Any = None,
) -> Deployment:
    """New replicas and/or scaling policy (the resync applies schedule and load policies)."""
    dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=deployment.pk)
    before = {"replicas": dep.replicas, "scaling": dep.scaling}
    if replicas is not None:
        if (
            not isinstance(replicas, int)
            or isinstance(replicas, bool)
            or not 1 <= replicas <= MAX_REPLICAS
        ):
            raise ValidationError({"replicas": f"give 1-{MAX_REPLICAS}"})
        dep.replicas = replicas
    if scaling is not None:
        dep.scaling = clean_scaling(scaling)
    dep.generation += 1
    dep.save(update_fields=["replicas", "scaling", "generation", "updated_at"])
    _change(
        dep,
        DeploymentChange.Kind.SCALE,
        actor=actor,
        from_version=dep.version,
        to_version=dep.version,
        detail={"before": before, "replicas": dep.replicas, "scaling": dep.scaling},
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.deployment.scaled",
        refs=[Ref.to(dep)],
        payload={
            "before": before,
            "replicas": dep.replicas,
            "scaling": dep.scaling,
            "generation": dep.generation,
        },
    )
    controller_enqueue(dep)
    return dep


@transaction.atomic
def deployment_stop(
    *, actor: Actor, workspace: Workspace, deployment: Deployment, reason: str = ""
) -> Deployment:
    """Stop serving: the gateway refuses the deployment at once; the controller stops its
    replicas after the commit."""
    dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=deployment.pk)
    if dep.state == DeploymentState.STOPPED:
        return dep
    dep.state = DeploymentState.STOPPED
    dep.routing_version += 1
    dep.generation += 1
    dep.save(update_fields=["state", "routing_version", "generation", "updated_at"])
    _change(
        dep,
        DeploymentChange.Kind.STOP,
        actor=actor,
        from_version=dep.version,
        to_version=None,
        reason=reason,
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.deployment.stopped",
        refs=[Ref.to(dep)],
        payload={"reason": str(reason)[:500], "generation": dep.generation},
    )
    publish()
    controller_enqueue(dep)
    return dep
