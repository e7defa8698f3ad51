"""Kubernetes as the platform's controllers speak it: a client from a kubeconfig file,
server-side apply of a rendered manifest's objects, reads and deletes that take a 404 as "gone".

Used by serving's Kubernetes deployment backend (``serving.controllers``), by notebook servers
run as pods (``training.notebooks``) and by training through Kueue (``training.trainjobs``).
Every call goes through the official ``kubernetes`` client, typed per kind (``KINDS``, and
``CUSTOM_KINDS`` through its ``CustomObjectsApi``); the objects come from the platform's
templates under ``platform/k8s/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FIELD_MANAGER = "rankops"

# kind -> (the client's API class, the suffix of its ``*_namespaced_<suffix>`` methods)
KINDS: dict[str, tuple[str, str]] = {
    "Deployment": ("AppsV1Api", "deployment"),
    "Service": ("CoreV1Api", "service"),
    "Pod": ("CoreV1Api", "pod"),
    "Secret": ("CoreV1Api", "secret"),
    "PersistentVolumeClaim": ("CoreV1Api", "persistent_volume_claim"),
    "Ingress": ("NetworkingV1Api", "ingress"),
}


# Custom resources: kind -> (group, version, plural), through the client's CustomObjectsApi.
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}


class ClusterUnavailableError(RuntimeError):
    """No cluster is configured, or it cannot be reached: the message says which."""


def new_client(kubeconfig: str, *, setting: str) -> Any:
    """An API client for the cluster ``kubeconfig`` names (``setting``: the setting that holds
    it, named in the error when it is empty)."""
    if not kubeconfig:
        raise ClusterUnavailableError(f"no cluster configured ({setting})")
    from kubernetes import config

    return config.new_client_from_config(config_file=kubeconfig)


def manifest_objects(manifest: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest, as the bodies the API server takes."""
    import yaml

    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _method(api_client: Any, kind: str, verb: str) -> Callable[..., Any]:
    """The client's ``<verb>_namespaced_*`` call for ``kind``, taking ``(name, namespace, ...)``
    for built-in and custom kinds alike."""
    from kubernetes import client as k8s

    if kind in CUSTOM_KINDS:
        group, version, plural = CUSTOM_KINDS[kind]
        call = getattr(k8s.CustomObjectsApi(api_client), f"{verb}_namespaced_custom_object")

        def custom(name: str, namespace: str, *args: Any, **kwargs: Any) -> Any:
            return call(group, version, namespace, plural, name, *args, **kwargs)

        return custom
    api_class, suffix = KINDS[kind]
    return getattr(getattr(k8s, api_class)(api_client), f"{verb}_namespaced_{suffix}")


def apply(api_client: Any, body: dict[str, Any], *, timeout: float) -> Any:
    """Server-side apply of one object (idempotent: the same body twice changes nothing); the
    object as the API server answered it."""
    meta = body["metadata"]
    return _method(api_client, body["kind"], "patch")(
        meta["name"],
        meta["namespace"],
        body,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type="application/apply-patch+yaml",
        _request_timeout=timeout,
    )


def read(api_client: Any, kind: str, name: str, namespace: str, *, timeout: float) -> Any:
    """The live object, or ``None`` when the cluster has none of that name."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _method(api_client, kind, "read")(name, namespace, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def delete(api_client: Any, kind: str, name: str, namespace: str, *, timeout: float) -> bool:
    """Delete the object; ``False`` when it was already gone."""
    from kubernetes.client.exceptions import ApiException

    try:
        _method(api_client, kind, "delete")(name, namespace, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
