"""Deployment controllers: make each backend match the deployment's desired state, and say so.

The deployment services (``serving.deployments``) only write the desired state (the
``Deployment`` row and its ``generation``) and its event, in one transaction, then enqueue
``serving.deployment_reconcile`` after the commit. The controller of the deployment's backend
makes it so here, outside any transaction (``deployment_reconcile`` refuses to run inside one),
and writes what it observed into ``DeploymentStatus``; the beat's resync
(``serving.deployments_reconcile``) retries failures, catches up with anything whose task was
lost, and restarts what died. Reconciling a converged deployment again does nothing new.

Backends:

- ``embedded``: the gateway processes load the versions their routing table names before the
  table takes traffic (``TableCache.prepare``); the controller loads and warms the version in
  its own process, which proves the bundle loads with this code, and reports Ready.
- ``local``: model-server processes (``serving.model_server serve``) supervised on this node by
  ``LocalSupervisor``; Ready once every replica answers its readiness probe.
- ``kubernetes``: a Deployment + Service rendered from
  ``platform/k8s/serving/model-server.yaml.tmpl`` and applied with the official ``kubernetes``
  client (server-side apply, field manager ``rankops``) to the cluster ``SERVING_KUBECONFIG``
  names; Ready once the cluster reports every replica of the current spec ready. Stopping
  deletes both objects. The gateway sends the production version's rows to the Service
  (``serving.replicas``).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import string
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import F
from django.utils import timezone

from serving import artifacts, routing
from serving.models import (
    Backend,
    Deployment,
    DeploymentPhase,
    DeploymentState,
    DeploymentStatus,
)
from training import sandbox as user_code
from workspaces import kube
from workspaces.kube import manifest_objects

log = logging.getLogger(__name__)
TEMPLATE = Path(settings.BASE_DIR) / "platform" / "k8s" / "serving" / "model-server.yaml.tmpl"


class ControllerInTransactionError(RuntimeError):
    """A controller was called inside a transaction: its side effects (model loads, processes,
    cluster calls) would run under the caller's row locks, the thing controllers exist to avoid."""


class BackendUnavailableError(RuntimeError):
    """The backend cannot be reached or is not configured (the status says which, and why)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a controller saw of the backend after acting (or instead of acting)."""

    phase: str
    ready_replicas: int
    detail: dict[str, Any]
    message: str = ""
    manifest: str | None = None


def wanted_replicas(dep: Deployment) -> int:
    """Replicas the backend should run: the row's (scaling policies move it), 0 once stopped."""
    return 0 if dep.state != DeploymentState.ACTIVE else dep.replicas


# ---------------------------------------------------------------------------------------------
# Embedded


class EmbeddedController:
    """The version loads and is warm in the controller's process; gateways load it themselves."""

    def apply(self, dep: Deployment) -> Observation:
        """Load and warm the production version (a cache hit once warm)."""
        from serving.inference import MODELS

        if dep.state != DeploymentState.ACTIVE:
            return Observation(DeploymentPhase.STOPPED, 0, {"embedded": True})
        # Production, and the rollback target, which stays loaded for a one-second rollback.
        warm = [v for v in (dep.version_id, dep.previous_version_id) if v]
        for version_id in warm:
            MODELS.get(version_id)
        return Observation(DeploymentPhase.READY, dep.replicas, {"embedded": True, "warm": warm})

    def drifted(self, dep: Deployment, status: DeploymentStatus) -> bool:
        """Nothing to supervise once the version was shown to load: never drifts."""
        return False


# ---------------------------------------------------------------------------------------------
# Local model-server processes


def free_port() -> int:
    """A TCP port free on the loopback now (a replica binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_ready(port: int, timeout: float = 0.5) -> bool:
    """Whether the model server on ``port`` answers its readiness probe (OIP health/ready)."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/v2/health/ready", timeout=timeout
        ) as response:
            return response.status == 200
    except OSError:
        return False


class LocalSupervisor:
    """Model-server processes of local deployments on this node, restarted when they die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.procs: dict[int, list[dict[str, Any]]] = {}

    def matches(self, dep: Deployment, want: int) -> bool:
        """Whether exactly ``want`` live replicas of the deployment's version run here."""
        with self._lock:
            current = self.procs.get(dep.pk, [])
            return len(current) == want and all(
                e["proc"].poll() is None and e["version_id"] == dep.version_id for e in current
            )

    def reconcile(self, dep: Deployment, replicas: int | None = None) -> list[dict[str, Any]]:
        """Start, replace or stop processes until ``replicas`` (default: the deployment's wanted
        count) live replicas of its version run; returns them as ``{pid, port}``."""
        want = wanted_replicas(dep) if replicas is None else replicas
        path = artifacts.resolve_artifact(dep.version.artifact_path) if want else None
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
                if path is None:  # want > 0 resolved it above
                    raise RuntimeError(f"deployment {dep.pk}: no artifact to start")
                current.append(self._start(dep, path))
            return [{"pid": e["proc"].pid, "port": e["port"]} for e in current]

    @staticmethod
    def _start(dep: Deployment, path: Path) -> dict[str, Any]:
        port = free_port()
        # A replica loads a user artifact: as a uid of its own, from a private copy, with no
        # platform credential in its environment (training.sandbox).
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
        return {"proc": proc, "port": port, "version_id": dep.version_id, "scratch": scratch}

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
        """Stop every replica (a worker shutting down, a test cleaning up)."""
        with self._lock:
            for entries in self.procs.values():
                for entry in entries:
                    self._stop(entry)
            self.procs.clear()


SUPERVISOR = LocalSupervisor()


class LocalController:
    """Replicas are processes of this node's ``SUPERVISOR``, Ready once each answers ready."""

    def __init__(self, supervisor: LocalSupervisor) -> None:
        self.supervisor = supervisor

    def apply(self, dep: Deployment) -> Observation:
        """Start or replace processes, then probe each once (no waiting: a Progressing status
        is taken up again by the follow-up task or the resync)."""
        want = wanted_replicas(dep)
        processes = self.supervisor.reconcile(dep, want)
        answering = [p for p in processes if replica_ready(p["port"])]
        ready = len(answering)
        detail = {
            "processes": processes,
            "model": dep.name,
            "endpoints": [f"http://127.0.0.1:{p['port']}" for p in answering],
        }
        if want == 0:
            return Observation(DeploymentPhase.STOPPED, 0, detail)
        if ready < want:
            return Observation(
                DeploymentPhase.PROGRESSING, ready, detail, f"{ready} of {want} replicas ready"
            )
        return Observation(DeploymentPhase.READY, ready, detail)

    def drifted(self, dep: Deployment, status: DeploymentStatus) -> bool:
        """A replica died, or this process does not run the deployment's replicas (a restarted
        worker): the next apply starts them again."""
        return not self.supervisor.matches(dep, wanted_replicas(dep))


# ---------------------------------------------------------------------------------------------
# Kubernetes


MODEL_SERVER_PORT = 8080  # a pod's model server, and its Service


def kubernetes_name(dep: Deployment) -> str:
    """The Kubernetes object name of a deployment (a DNS label, at most 63 characters)."""
    return f"ms-{dep.workspace.slug}-{dep.name}".replace("_", "-")[:63].rstrip("-")


def render_manifest(dep: Deployment) -> str:
    """The deployment's Kubernetes objects as YAML, from the platform template."""
    version = dep.version
    gpu = ', "nvidia.com/gpu": 1' if dep.device == "gpu" else ""
    return string.Template(TEMPLATE.read_text()).substitute(
        name=kubernetes_name(dep),
        namespace=settings.SERVING_K8S_NAMESPACE,
        workspace=dep.workspace.slug,
        model=version.model.name,
        version=version.version,
        version_id=version.pk,
        bundle_path=artifacts.clean_relative_path(version.artifact_path),
        replicas=wanted_replicas(dep),
        cpu="1",
        memory="1Gi",
        gpu_limit=gpu,
        device="cuda" if gpu else "cpu",
        port=MODEL_SERVER_PORT,
        image=settings.SERVING_IMAGE,
    )


class KubernetesController:
    """Server-side apply of the Deployment and Service with the official client; readiness
    from the Deployment's status as the cluster reports it."""

    timeout_s = 30

    def _client(self):
        try:
            return kube.new_client(settings.SERVING_KUBECONFIG, setting="SERVING_KUBECONFIG")
        except kube.ClusterUnavailableError as exc:
            raise BackendUnavailableError(str(exc)) from None

    def apply(self, dep: Deployment) -> Observation:
        """Apply both objects (idempotent: the same body twice changes nothing), then read the
        Deployment's rollout from what the API server answered."""
        manifest = render_manifest(dep)
        applied: dict[str, Any] = {}
        if wanted_replicas(dep) == 0:
            return self._delete(dep, manifest)
        with self._client() as api_client:
            for body in manifest_objects(manifest):
                applied[body["kind"]] = kube.apply(api_client, body, timeout=self.timeout_s)
        observation = self._rollout(dep, applied["Deployment"])
        return dataclasses.replace(observation, manifest=manifest)

    def _delete(self, dep: Deployment, manifest: str) -> Observation:
        """A stopped deployment: its Deployment and Service are deleted from the cluster (its
        pods go with them), not left at zero replicas."""
        deleted = []
        with self._client() as api_client:
            for body in manifest_objects(manifest):
                kind, meta = body["kind"], body["metadata"]
                name, namespace = meta["name"], meta["namespace"]
                if kube.delete(api_client, kind, name, namespace, timeout=self.timeout_s):
                    deleted.append(kind)
        meta = manifest_objects(manifest)[0]["metadata"]
        detail = {"name": meta["name"], "namespace": meta["namespace"], "deleted": deleted}
        return Observation(DeploymentPhase.STOPPED, 0, detail)

    def drifted(self, dep: Deployment, status: DeploymentStatus) -> bool:
        """The cluster's Deployment is gone, runs another version or replica count, or is not
        all ready: apply again (server-side apply is idempotent). A stopped deployment drifted
        when its Deployment is back."""
        meta = manifest_objects(render_manifest(dep))[0]["metadata"]
        with self._client() as api_client:
            live = kube.read(
                api_client,
                "Deployment",
                meta["name"],
                meta["namespace"],
                timeout=self.timeout_s,
            )
        if wanted_replicas(dep) == 0:
            return live is not None
        if live is None:
            return True
        labels = (live.spec.template.metadata.labels or {}) if live.spec else {}
        if live.spec.replicas != wanted_replicas(dep) or labels.get("rankops.io/version-id") != str(
            dep.version_id
        ):
            return True
        return self._rollout(dep, live).phase != status.phase

    @staticmethod
    def _rollout(dep: Deployment, live) -> Observation:
        want = wanted_replicas(dep)
        state = live.status
        ready = int((state.ready_replicas if state else 0) or 0)
        updated = int((state.updated_replicas if state else 0) or 0)
        seen = int((state.observed_generation if state else 0) or 0)
        generation = int(live.metadata.generation or 0)
        detail = {
            "name": live.metadata.name,
            "namespace": live.metadata.namespace,
            "cluster_generation": generation,
            "ready_replicas": ready,
            "model": dep.name,
            # The Service in front of the replicas (the template's; cluster DNS).
            "endpoints": [
                f"http://{live.metadata.name}.{live.metadata.namespace}.svc:{MODEL_SERVER_PORT}"
            ]
            if ready
            else [],
        }
        if want == 0:
            return Observation(DeploymentPhase.STOPPED, ready, detail)
        if seen >= generation and updated >= want and ready >= want:
            return Observation(DeploymentPhase.READY, ready, detail)
        return Observation(
            DeploymentPhase.PROGRESSING,
            ready,
            detail,
            f"{ready} of {want} replicas ready in the cluster",
        )


CONTROLLERS: dict[str, Any] = {
    Backend.EMBEDDED: EmbeddedController(),
    Backend.LOCAL: LocalController(SUPERVISOR),
    Backend.KUBERNETES: KubernetesController(),
}


# ---------------------------------------------------------------------------------------------
# The reconcile loop


def status_row(dep: Deployment) -> DeploymentStatus:
    """The deployment's status row (made Pending at generation 0 when it has none yet)."""
    found, _ = DeploymentStatus.objects.for_workspace(dep.workspace_id).get_or_create(
        deployment=dep, defaults={"workspace_id": dep.workspace_id}
    )
    return found


def _record(
    dep: Deployment,
    generation: int,
    *,
    phase: str,
    previous: str,
    message: str = "",
    ready_replicas: int | None = None,
    detail: dict[str, Any] | None = None,
    manifest: str | None = None,
    failed: bool = False,
) -> bool:
    """Write what this attempt at ``generation`` saw, unless an attempt at a newer generation
    took the row over meanwhile (an old attempt never overwrites a newer one). Returns whether
    it wrote."""
    now = timezone.now()
    fields: dict[str, Any] = {
        "observed_generation": generation,
        "phase": phase,
        "message": message[:500],
        "reconciled_at": now,
    }
    if ready_replicas is not None:
        fields["ready_replicas"] = ready_replicas
    if detail is not None:
        fields["detail"] = detail
    if manifest is not None:
        fields["manifest"] = manifest
    if phase != previous:
        fields["last_transition_at"] = now
    if failed:
        fields["failures"] = F("failures") + 1
    elif phase != DeploymentPhase.PROGRESSING:
        fields["failures"] = 0
    # One UPDATE (its own short transaction): the generation guard makes it compare-and-set.
    rows = DeploymentStatus.objects.for_workspace(dep.workspace_id).filter(
        deployment_id=dep.pk, observed_generation__lte=generation
    )
    return rows.update(**fields) == 1


def deployment_reconcile(*, deployment_id: int) -> str:
    """Make the deployment's backend match its desired state and record what was observed.

    Returns ``gone`` (no such deployment), ``unchanged`` (already converged and nothing
    drifted: nothing was done), or the phase written. A backend error becomes ``Failed`` with
    its message; the resync tries again. Runs only outside transactions, so no model load,
    process start or cluster call ever waits under a row lock."""
    if connection.in_atomic_block:
        raise ControllerInTransactionError(
            "deployment controllers run outside transactions (after the commit, in a task)"
        )
    dep = (
        Deployment.objects.unscoped()
        .select_related("workspace", "model", "version", "version__model")
        .filter(pk=deployment_id)
        .first()
    )
    if dep is None:
        return "gone"
    controller = CONTROLLERS[dep.backend]
    status = status_row(dep)
    generation = dep.generation
    converged = status.observed_generation == generation and status.phase in (
        DeploymentPhase.READY,
        DeploymentPhase.STOPPED,
    )
    previous = status.phase
    try:
        if converged and not controller.drifted(dep, status):
            return "unchanged"
        if previous != DeploymentPhase.PROGRESSING or status.observed_generation != generation:
            _record(dep, generation, phase=DeploymentPhase.PROGRESSING, previous=previous)
            previous = DeploymentPhase.PROGRESSING
        seen = controller.apply(dep)
    except Exception as exc:
        log.warning("reconciling deployment %s failed", dep.pk, exc_info=True)
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        _record(
            dep,
            generation,
            phase=DeploymentPhase.FAILED,
            previous=previous,
            message=message,
            failed=True,
        )
        return DeploymentPhase.FAILED
    written = _record(
        dep,
        generation,
        phase=seen.phase,
        previous=previous,
        message=seen.message,
        ready_replicas=seen.ready_replicas,
        detail=seen.detail,
        manifest=seen.manifest,
    )
    if written and (
        seen.phase != status.phase
        or (seen.detail or {}).get("endpoints") != (status.detail or {}).get("endpoints")
    ):
        routing.publish()  # the gateways' tables name the replicas they send traffic to
    return seen.phase


def deployment_status(dep: Deployment, status: DeploymentStatus | None = None) -> dict[str, Any]:
    """The status to show and poll: the controller's report, except that a report about an
    older generation than the desired one is never Ready (it says Pending instead)."""
    if status is None:
        try:
            status = dep.observed
        except DeploymentStatus.DoesNotExist:
            status = DeploymentStatus(workspace_id=dep.workspace_id, deployment=dep)
    current = status.observed_generation == dep.generation
    phase = status.phase if current else DeploymentPhase.PENDING
    message = status.message
    if not current:
        message = (
            f"waiting for the {dep.backend} controller to take up generation {dep.generation}"
            + (
                f" (last observed {status.observed_generation})"
                if status.observed_generation
                else ""
            )
        )
    return {
        "phase": phase,
        "message": message,
        "generation": dep.generation,
        "observed_generation": status.observed_generation,
        "desired_replicas": wanted_replicas(dep),
        "ready_replicas": status.ready_replicas if current else 0,
        "failures": status.failures,
        "last_transition_at": status.last_transition_at,
        "reconciled_at": status.reconciled_at,
    }
