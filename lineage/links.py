"""Where a node's own page is, per kind: ``register_object_url(kind, fn)`` (fn(slug, node) -> a
URL or ""). Links are built from URL names only, so lineage imports no other app."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.urls import NoReverseMatch, reverse

from lineage.models import Node

_URLS: dict[str, Callable[[str, Node], str]] = {}


def register_object_url(kind: str, build: Callable[[str, Node], str]) -> None:
    _URLS[kind] = build


def object_url(slug: str, node: Node) -> str:
    build = _URLS.get(node.kind)
    if build is None:
        return ""
    try:
        return build(slug, node)
    except (NoReverseMatch, ValueError):
        return ""


def _dataset(slug: str, node: Node) -> str:
    match = re.fullmatch(r"(\S+) v(\d+)", node.label)
    if match is None:
        return ""
    name, version = match.groups()
    return reverse("features-dataset", kwargs={"ws": slug, "name": name, "version": int(version)})


def _model_version(slug: str, node: Node) -> str:
    match = re.fullmatch(r"(\S+) v(\d+)", node.label)
    if match is None:
        return ""
    name, version = match.groups()
    return reverse("serving-version", kwargs={"ws": slug, "name": name, "version": int(version)})


register_object_url(
    "feature_group", lambda slug, n: reverse("features-group", kwargs={"ws": slug, "name": n.label})
)
register_object_url(
    "feature",
    lambda slug, n: reverse(
        "features-group", kwargs={"ws": slug, "name": n.label.split(":", 1)[0]}
    ),
)
register_object_url("dataset", _dataset)


def _record_set(slug: str, node: Node) -> str:
    match = re.fullmatch(r"(\S+) v(\d+)", node.label)
    if match is None:
        return ""
    name, version = match.groups()
    return reverse(
        "curation-record-set", kwargs={"ws": slug, "name": name, "version": int(version)}
    )


register_object_url("record_set", _record_set)
register_object_url(
    "annotation_task",
    lambda slug, n: reverse("curation-task", kwargs={"ws": slug, "name": n.label}),
)
register_object_url(
    "training_job",
    lambda slug, n: reverse("training-job", kwargs={"ws": slug, "pk": int(n.object_id)}),
)
register_object_url(
    "tuning_job",
    lambda slug, n: reverse("training-tuning-job", kwargs={"ws": slug, "pk": int(n.object_id)}),
)
register_object_url(
    "deployment",
    lambda slug, n: reverse("serving-deployment", kwargs={"ws": slug, "name": n.label}),
)
register_object_url("model_version", _model_version)
register_object_url(
    "experiment",
    lambda slug, n: reverse("experiments-detail", kwargs={"ws": slug, "key": n.label}),
)
