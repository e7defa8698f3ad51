"""Deployments (S3, S4, S6): create, release a new version, roll back, scale, stop.

Backends:

- ``embedded`` (default): every gateway process loads the deployment's versions in memory. A
  routing-table change is applied by a process only after it loaded and warmed every version the
  new table routes to (``TableCache.prepare``), so traffic moves to a warm model; the previous
  production version stays loaded, so a rollback is a table flip (well under a second).
- ``local``: the deployment's replicas are model-server processes (``serving.model_server
  serve``) started and supervised on this node (``LocalSupervisor``; dead ones are restarted by
  ``serving.tasks.deployments_reconcile``); the gateway still scores in process.
- ``kubernetes``: a Deployment + Service manifest rendered from
  ``platform/k8s/serving/model-server.yaml.tmpl``, stored on the row and applied with ``kubectl``
  only when ``SERVING_KUBECONFIG`` names a cluster.

Replicas follow ``scaling``: fixed, a schedule of UTC windows, or load (QPS per replica).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import string
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from serving import artifacts
from serving.gates import require_deployable
from serving.models import (
    Backend,
    Deployment,
    DeploymentChange,
    DeploymentState,
    ModelVersion,
    name_validator,
)
from serving.quality import require_quality
from serving.registry import model_alias_assign
from serving.routing import publish
from training import sandbox as user_code
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

log = logging.getLogger(__name__)
TEMPLATE = Path(settings.BASE_DIR) / "platform" / "k8s" / "serving" / "model-server.yaml.tmpl"
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
# Backends


def render_manifest(dep: Deployment) -> str:
    version = dep.version
    gpu = ', "nvidia.com/gpu": 1' if dep.device == "gpu" else ""
    name = f"ms-{dep.workspace.slug}-{dep.name}".replace("_", "-")[:63].rstrip("-")
    return string.Template(TEMPLATE.read_text()).substitute(
        name=name,
        namespace=getattr(settings, "SERVING_K8S_NAMESPACE", "rankops"),
        workspace=dep.workspace.slug,
        model=version.model.name,
        version=version.version,
        version_id=version.pk,
        bundle_path=artifacts.clean_relative_path(version.artifact_path),
        replicas=dep.replicas,
        cpu="1",
        memory="1Gi",
        gpu_limit=gpu,
        port=8080,
    )


def kubernetes_apply(manifest: str) -> dict[str, Any]:
    kubeconfig = getattr(settings, "SERVING_KUBECONFIG", "") or os.environ.get(
        "SERVING_KUBECONFIG", ""
    )
    if not kubeconfig:
        return {"applied": False, "detail": "no cluster configured (SERVING_KUBECONFIG)"}
    proc = subprocess.run(  # noqa: S603 - fixed arguments, the manifest goes to stdin
        ["kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-"],  # noqa: S607 - operator's PATH
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {"applied": proc.returncode == 0, "detail": (proc.stdout or proc.stderr)[-500:]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSupervisor:
    """Model-server processes of local deployments on this node, restarted when they die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.procs: dict[int, list[dict[str, Any]]] = {}

    def reconcile(self, dep: Deployment, replicas: int | None = None) -> list[dict[str, Any]]:
        want = 0 if dep.state != DeploymentState.ACTIVE else (replicas or dep.replicas)
        path = artifacts.resolve_artifact(dep.version.artifact_path)
        with self._lock:
            current = self.procs.setdefault(dep.pk, [])
            # Replace processes of another version or that died.
            for entry in list(current):
                if entry["proc"].poll() is not None or entry["version_id"] != dep.version_id:
                    self._stop(entry)
                    current.remove(entry)
            while len(current) > want:
                self._stop(current.pop())
            while len(current) < want:
                port = _free_port()
                # A replica loads a user artifact: as a uid of its own, from a private copy,
                # with no platform credential in its environment (training.sandbox).
                scratch, staged = user_code.prepare_server(path, owner_id=dep.version_id)
                try:
                    proc = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
                        [
                            sys.executable,
                            "-m",
                            "serving.model_server",
                            "serve",
                            "--path",
                            str(staged),
                            "--port",
                            str(port),
                            "--name",
                            dep.name,
                            "--version",
                            str(dep.version.version),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        **user_code.server_popen_args(scratch),
                    )
                except BaseException:
                    scratch.remove()
                    raise
                current.append(
                    {
                        "proc": proc,
                        "port": port,
                        "version_id": dep.version_id,
                        "scratch": scratch,
                    }
                )
            return [{"pid": e["proc"].pid, "port": e["port"]} for e in current]

    @staticmethod
    def _stop(entry: dict[str, Any]) -> None:
        proc = entry["proc"]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if entry.get("scratch") is not None:
            entry["scratch"].remove()

    def stop_all(self) -> None:
        with self._lock:
            for entries in self.procs.values():
                for entry in entries:
                    self._stop(entry)
            self.procs.clear()


SUPERVISOR = LocalSupervisor()


def _apply_backend(dep: Deployment, replicas: int | None = None) -> dict[str, Any]:
    if dep.backend == Backend.KUBERNETES:
        manifest = render_manifest(dep)
        Deployment.objects.for_workspace(dep.workspace_id).filter(pk=dep.pk).update(
            manifest=manifest
        )
        dep.manifest = manifest
        return kubernetes_apply(manifest)
    if dep.backend == Backend.LOCAL:
        return {"processes": SUPERVISOR.reconcile(dep, replicas)}
    return {"embedded": True}


def _warm(version: ModelVersion) -> None:
    """Load and warm the version in this process before any table routes to it."""
    from serving.inference import MODELS

    MODELS.get(version.pk)


def version_warm(version: ModelVersion) -> None:
    """Warm ``version`` here ahead of a release (a caller about to lock rows of its own, such
    as an experiment's conclusion, warms first so no model loads under its locks)."""
    _warm(version)


def _apply_after_commit(dep: Deployment) -> None:
    """Make the backend match the row once the change commits (at once outside a transaction):
    ``kubectl`` and model-server processes never run under the caller's row locks."""

    def apply() -> None:
        status = _apply_backend(dep)
        Deployment.objects.for_workspace(dep.workspace_id).filter(pk=dep.pk).update(
            status_detail=status
        )

    transaction.on_commit(apply, robust=True)


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


def _change(dep, kind, *, actor: Actor, from_version, to_version, reason="", detail=None):
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
    _warm(version)
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
            },
        )
    status = _apply_backend(dep)
    Deployment.objects.for_workspace(workspace).filter(pk=dep.pk).update(status_detail=status)
    dep.status_detail = status
    return dep


def _switch(dep: Deployment, *, to, kind: str, actor: Actor, reason: str):
    """Inside the caller's transaction, on the locked row: production moves to ``to``, the
    current version stays loaded as the rollback target, the routing table is republished and
    the production alias follows. Returns the version that served before."""
    old = dep.version
    dep.previous_version, dep.version = old, to
    dep.routing_version += 1
    dep.save(update_fields=["previous_version", "version", "routing_version", "updated_at"])
    _change(dep, kind, actor=actor, from_version=old, to_version=to, reason=reason)
    publish()  # first on-commit callback: traffic moves before anything else
    model_alias_assign(actor=actor, model=to.model, alias="production", version=to)
    return old


def deployment_release(
    *, actor: Actor, workspace: Workspace, deployment: Deployment, version: Any, reason: str = ""
) -> Deployment:
    """Move production traffic to ``version``; the current one becomes the rollback target."""
    version = _version(workspace, version)
    if version.model_id != deployment.model_id:
        raise ValidationError({"version_id": f"not a version of model '{deployment.model.name}'"})
    require_deployable(version)
    if deployment.version_id != version.pk:
        # 409 naming the metric when it is worse than production on the same held-out rows.
        require_quality(version, deployment)
    _warm(version)  # loads and warms before traffic moves (a cache hit when warmed ahead)
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
            },
        )
    _apply_after_commit(dep)
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
            },
        )
    if dep.backend != Backend.EMBEDDED:
        _apply_after_commit(dep)
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
    dep.save(update_fields=["replicas", "scaling", "updated_at"])
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
        payload={"before": before, "replicas": dep.replicas, "scaling": dep.scaling},
    )
    transaction.on_commit(lambda: _apply_backend(dep))
    return dep


@transaction.atomic
def deployment_stop(
    *, actor: Actor, workspace: Workspace, deployment: Deployment, reason: str = ""
) -> Deployment:
    dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=deployment.pk)
    dep.state = DeploymentState.STOPPED
    dep.routing_version += 1
    dep.save(update_fields=["state", "routing_version", "updated_at"])
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
        payload={"reason": str(reason)[:500]},
    )
    publish()
    transaction.on_commit(lambda: _apply_backend(dep))
    return dep
