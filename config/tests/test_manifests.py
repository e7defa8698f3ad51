"""The production stacks as files: every long-running container of the Kubernetes manifests
(and of the templates the platform renders itself) has liveness and readiness probes and
resource requests and limits, no image is left on ``latest``, and compose publishes its ports on
the loopback with CPU and memory limits on every service."""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path

import pytest
import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
K8S = ROOT / "platform" / "k8s"
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def documents(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".tmpl":
        names = {m.group(1) or m.group(2) for m in re.finditer(r"\$(?:\{(\w+)\}|(\w+))", text)}
        # Placeholder values; an optional suffix such as $gpu_limit renders empty.
        text = string.Template(text).safe_substitute(
            {n: "" if n.endswith("_limit") else "1" for n in names}
        )
    return [d for d in yaml.safe_load_all(text) if d]


def manifests() -> list[tuple[str, dict]]:
    files = sorted(K8S.glob("*.yaml")) + sorted(K8S.glob("*/*.yaml.tmpl"))
    return [(f.relative_to(ROOT).as_posix(), d) for f in files for d in documents(f)]


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec) if doc["kind"] != "Pod" else spec
    return list(pod.get("containers", []))


def long_running():
    for name, doc in manifests():
        if doc["kind"] in LONG_RUNNING or doc["kind"] == "Pod":
            for container in containers(doc):
                yield pytest.param(doc, container, id=f"{name}:{container['name']}")


@pytest.mark.parametrize(("doc", "container"), list(long_running()))
def test_every_long_running_container_has_probes_and_limits(doc, container):
    assert "livenessProbe" in container, "no livenessProbe"
    assert "readinessProbe" in container, "no readinessProbe"
    resources = container.get("resources", {})
    assert resources.get("requests", {}).get("cpu"), "no CPU request"
    assert resources.get("limits", {}).get("memory"), "no memory limit"


def test_the_stack_covers_every_long_running_process():
    names = {
        c["name"]
        for _, doc in manifests()
        if doc["kind"] in LONG_RUNNING | {"Pod"}
        for c in containers(doc)
    }
    assert {"web", "worker", "beat", "agent", "model-server", "jupyterlab"} <= names


def test_no_image_floats_on_latest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["newTag"] == version()  # the release the manifests were written for
    for name, doc in manifests():
        for container in containers(doc) if "kind" in doc else []:
            ref = str(container.get("image", ""))
            assert not ref.endswith(":latest"), f"{name}: {ref}"
    assert f"rankops:{version()}" == settings.RANKOPS_IMAGE
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service, body in compose["services"].items():
        assert not str(body.get("image", "")).endswith(":latest"), service


def test_the_web_deployment_has_a_disruption_budget_and_an_autoscaler_once():
    kinds = [(doc["kind"], doc.get("metadata", {}).get("name")) for _, doc in manifests()]
    for wanted in [
        ("PodDisruptionBudget", "rankops-web"),
        ("HorizontalPodAutoscaler", "rankops-web"),
    ]:
        assert kinds.count(wanted) == 1, wanted  # once: kustomize refuses a duplicate
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert "web-availability.yaml" in listed


def test_compose_publishes_on_the_loopback_and_limits_every_service():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = []
    for service, body in compose["services"].items():
        for port in body.get("ports", []):
            published.append(service)
            assert str(port).startswith("${RANKOPS_BIND:-127.0.0.1}:"), (service, port)
        limits = body.get("deploy", {}).get("resources", {}).get("limits", {})
        assert limits.get("memory") and limits.get("cpus"), service
        assert "healthcheck" not in body or not body["healthcheck"].get("disable"), service
    assert {"web", "gateway", "features-online"} <= set(published)
