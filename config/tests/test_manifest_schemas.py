"""The Kubernetes manifests render and validate: ``kubectl kustomize`` builds each kustomization
(the platform's and Kueue's queueing), the templates the platform renders itself are filled, and
every resource validates, strictly (an unknown field fails), against its schema:

- built-in kinds against Kubernetes' own (``kubernetes-validate``, its bundled schemas);
- Kueue's and Kubeflow Trainer's kinds against their CRD schemas, vendored under
  ``platform/k8s/crds`` (``vendor.py`` there, NOTICE.md for the sources and commits).
"""

from __future__ import annotations

import copy
import json
import shutil
import string
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from config.tests.test_manifests import K8S, ROOT
from training.models import PRIORITY_RANK

pytestmark = pytest.mark.one_backend  # files only: nothing a database changes

KUBERNETES_VERSION = "1.34"
CRDS = K8S / "crds"
KUSTOMIZATIONS = [K8S, K8S / "kueue"]
TEMPLATES = sorted(K8S.glob("*/*.yaml.tmpl"))
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


def kustomize(folder: Path) -> list[dict]:
    done = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the API server would drop or refuse them
    (an object with ``properties`` and no ``x-kubernetes-preserve-unknown-fields``)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(api_version: str, kind: str) -> dict | None:
    group, _, version = api_version.partition("/")
    path = CRDS / f"{group}_{kind}_{version}.json"
    if not path.exists():
        return None
    schema = strict(json.loads(path.read_text()))
    # The API server owns these; a manifest gives only name, namespace, labels, annotations.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate(resource: dict) -> None:
    """Raise (naming the field) unless ``resource`` validates against its kind's schema."""
    schema = crd_schema(resource["apiVersion"], resource["kind"])
    if schema is not None:
        jsonschema.Draft202012Validator(schema).validate(copy.deepcopy(resource))
        return
    # Kubernetes' own kinds; any other kind has no schema there and fails (SchemaNotFoundError).
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


# What the platform fills the templates with (serving.controllers.render_manifest,
# training.notebook_pods.render, the TrainJob's placeholders), as the types it gives them.
SAMPLE = {
    "name": "rankops-ads-ctr-7",
    "namespace": "rankops",
    "workspace": "ads",
    "model": "ctr",
    "version": 3,
    "version_id": 7,
    "bundle_path": "models/ads/ctr/3",
    "replicas": 2,
    "cpu": "1",
    "memory": "2Gi",
    "gpu_limit": ', "nvidia.com/gpu": "1"',
    "gpus": "1",
    "device": "cuda",
    "port": 8080,
    "image": "rankops:0.1.0",
    "user_id": 3,
    "server_id": 5,
    "home_claim": "rankops-home-ads-3",
    "storage": "10Gi",
    "base_url": "/notebooks/5/",
    "platform_url": json.dumps("http://rankops-web.rankops:8000"),
    "rankops_token": json.dumps("rk_sample"),
    "jupyter_token": json.dumps("jt_sample"),
    "jupyter_config": json.dumps(json.dumps({"ServerApp": {"base_url": "/notebooks/5/"}})),
    "priority": "experiment",
    "workers": 2,
}


def filled(template: Path) -> list[dict]:
    text = string.Template(template.read_text()).substitute(SAMPLE)
    return [d for d in yaml.safe_load_all(text) if d]


def rendered() -> list[tuple[str, dict]]:
    out = []
    for folder in KUSTOMIZATIONS:
        name = folder.relative_to(ROOT).as_posix()
        out.extend((f"kustomize {name}", d) for d in kustomize(folder))
    for template in TEMPLATES:
        name = template.relative_to(ROOT).as_posix()
        out.extend((name, d) for d in filled(template))
    return out


RESOURCES = rendered()


@pytest.mark.parametrize(
    "resource",
    [r for _, r in RESOURCES],
    ids=[f"{where}:{r['kind']}/{r['metadata'].get('name')}" for where, r in RESOURCES],
)
def test_every_rendered_resource_validates_strictly_against_its_schema(resource):
    validate(resource)


def test_the_renders_hold_the_platform_and_its_queueing_and_the_training_and_serving_kinds():
    kinds = {(r["apiVersion"], r["kind"]) for _, r in RESOURCES}
    assert {
        ("apps/v1", "Deployment"),
        ("kueue.x-k8s.io/v1beta1", "ClusterQueue"),
        ("kueue.x-k8s.io/v1beta1", "LocalQueue"),
        ("kueue.x-k8s.io/v1beta1", "ResourceFlavor"),
        ("kueue.x-k8s.io/v1beta1", "WorkloadPriorityClass"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    } <= kinds
    sources = {where for where, _ in RESOURCES}
    assert "platform/k8s/serving/model-server.yaml.tmpl" in sources


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0, "livenessProbes"), {}),
        ("ClusterQueue", ("spec", "preemption", "withinClusterQueue"), "Sometimes"),
        ("TrainJob", ("spec", "trainer", "numNode"), 2),
        ("WorkloadPriorityClass", ("value",), "high"),
    ],
)
def test_a_misspelt_field_or_a_wrong_value_fails_validation(kind, path, value):
    resource = copy.deepcopy(next(r for _, r in RESOURCES if r["kind"] == kind))
    node: Any = resource
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(resource)


def test_kueues_priority_classes_are_the_platforms():
    classes = {
        r["metadata"]["name"]: r["value"]
        for _, r in RESOURCES
        if r["kind"] == "WorkloadPriorityClass"
    }
    assert classes == {f"rankops-{name}": rank for name, rank in PRIORITY_RANK.items()}
    (job,) = (r for _, r in RESOURCES if r["kind"] == "TrainJob")
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] in {
        r["metadata"]["name"] for _, r in RESOURCES if r["kind"] == "LocalQueue"
    }
    assert job["spec"]["suspend"] is True  # Kueue starts it when admitted
