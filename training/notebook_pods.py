"""Notebook servers as pods (``NOTEBOOK_BACKEND=kubernetes``): render the server's objects from
``platform/k8s/notebooks/notebook-server.yaml.tmpl``, apply them, read the pod's phase back and
delete them. ``training.notebooks`` owns the server's row, its token and its events; this module
only speaks to the cluster (``workspaces.kube``).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from training.models import NotebookServer
from workspaces import kube

TEMPLATE = Path(settings.BASE_DIR) / "platform" / "k8s" / "notebooks" / "notebook-server.yaml.tmpl"
PORT = 8888
TIMEOUT_S = 30

# What the server's pod is doing, as ``observe`` reads it.
STARTING, READY, SUCCEEDED, FAILED, GONE = "starting", "ready", "succeeded", "failed", "gone"


def errors(*others: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The failures of a call to the cluster (none configured, an API error, no answer), with
    ``others``: for ``except`` clauses (the client is imported when one is raised, not at the
    platform's start)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (kube.ClusterUnavailableError, ApiException, HTTPError, OSError, *others)


@dataclass(frozen=True)
class Seen:
    phase: str
    detail: str = ""


def name(server: NotebookServer) -> str:
    """The server's objects' name (a DNS label, at most 63 characters)."""
    return f"nb-{server.workspace.slug}-{server.pk}".replace("_", "-")[:63].rstrip("-")


def home_claim(server: NotebookServer) -> str:
    """The member's folder in the workspace: one claim per member and workspace, kept."""
    return f"nb-home-{server.workspace.slug}-{server.user_id}".replace("_", "-")[:63].rstrip("-")


def base_url(server: NotebookServer) -> str:
    """The path JupyterLab serves under, behind the Ingress."""
    return f"/notebooks/{server.pk}/"


def namespace() -> str:
    return str(settings.NOTEBOOK_K8S_NAMESPACE)


def render(server: NotebookServer, *, key: str, platform_url: str, config: dict) -> str:
    """The server's Secret, claim, Pod, Service and Ingress as YAML."""
    return string.Template(TEMPLATE.read_text()).substitute(
        name=name(server),
        namespace=namespace(),
        workspace=server.workspace.slug,
        user_id=server.user_id,
        server_id=server.pk,
        home_claim=home_claim(server),
        storage=settings.NOTEBOOK_STORAGE,
        image=settings.NOTEBOOK_IMAGE,
        base_url=base_url(server),
        platform_url=json.dumps(platform_url),
        rankops_token=json.dumps(key),
        jupyter_token=json.dumps(server.secret),
        jupyter_config=json.dumps(json.dumps(config)),
        cpu="1",
        memory="2Gi",
    )


def _client() -> Any:
    return kube.new_client(settings.NOTEBOOK_KUBECONFIG, setting="NOTEBOOK_KUBECONFIG")


def start(server: NotebookServer, *, key: str, platform_url: str, config: dict) -> None:
    """Apply the server's objects (the Secret first: the pod reads it); fills in the row's
    ``port``, ``folder`` (the claim) and ``isolation``, which the caller saves."""
    manifest = render(server, key=key, platform_url=platform_url, config=config)
    with _client() as api_client:
        for body in kube.manifest_objects(manifest):
            kube.apply(api_client, body, timeout=TIMEOUT_S)
    server.port, server.pid = PORT, None
    server.folder, server.isolation = home_claim(server), "pod"


def observe(server: NotebookServer) -> Seen:
    """The pod's phase: starting (Pending, or Running not yet ready), ready, succeeded, failed
    or gone, with what the cluster says of how it ended."""
    with _client() as api_client:
        pod = kube.read(api_client, "Pod", name(server), namespace(), timeout=TIMEOUT_S)
    if pod is None:
        return Seen(GONE, "its pod is gone from the cluster")
    status = pod.status
    phase = (status.phase if status else "") or "Pending"
    if phase == "Running":
        ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
        return Seen(READY if ready else STARTING)
    if phase in ("Succeeded", "Failed"):
        ended = [
            c.state.terminated
            for c in (status.container_statuses or [])
            if c.state is not None and c.state.terminated is not None
        ]
        how = "; ".join(
            f"exit code {t.exit_code}"
            + (f" ({t.reason})" if t.reason else "")
            + (f": {t.message}" if t.message else "")
            for t in ended
        )
        detail = f"its pod {phase.lower()}" + (f", {how}" if how else "")
        if status.message:
            detail += f" ({status.message})"
        return Seen(SUCCEEDED if phase == "Succeeded" else FAILED, detail)
    return Seen(STARTING)


def delete(server: NotebookServer) -> None:
    """Delete the server's Pod, Service, Ingress and Secret (gone ones are fine); the member's
    claim stays."""
    with _client() as api_client:
        for kind in ("Pod", "Service", "Ingress", "Secret"):
            kube.delete(api_client, kind, name(server), namespace(), timeout=TIMEOUT_S)
