"""Finding lineage nodes by the names people use ("ctr-model v3", "clicks v1", "ctr-prod"), and
the left-to-right order of kinds that the graph page lays its columns out in.

Every read here takes the workspace: another workspace's objects are never found nor suggested.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from django.db.models import Case, IntegerField, Q, QuerySet, Value, When

from lineage.models import Node
from lineage.projection import canonical_kind
from workspaces.models import Workspace

# Columns of the graph, left to right: data flows from features to experiments.
KIND_RANKS: dict[str, int] = {
    "external_dataset": 0,
    "feature_group": 0,
    "feature_group_version": 0,
    "feature": 0,
    "dataset": 1,
    "record_set": 1,
    "sample_stream": 1,
    "external_job": 2,
    "training_pipeline": 2,
    "pipeline": 2,
    "pipeline_run": 2,
    "pipelinerun": 2,
    "training_job": 2,
    "registered_model": 3,
    "model_version": 3,
    "deployment": 4,
    "experiment": 5,
    "experiment_layer": 5,
}
# A kind the table does not know (a producer's own) sits with the jobs, in the middle.
OTHER_RANK = 2

KIND_NAMES: dict[str, str] = {
    "external_dataset": "external dataset",
    "feature_group": "feature group",
    "feature_group_version": "feature group version",
    "dataset": "dataset",
    "record_set": "record set",
    "sample_stream": "sample stream",
    "annotation_task": "annotation task",
    "external_job": "external job",
    "training_pipeline": "pipeline",
    "pipeline_run": "pipeline run",
    "training_job": "training job",
    "registered_model": "registered model",
    "model_version": "model version",
    "deployment": "deployment",
    "experiment": "experiment",
    "experiment_layer": "experiment layer",
}
# What people type in ?kind=: the page's words and a few short ones.
KIND_WORDS: dict[str, str] = {
    "model": "model_version",
    "models": "model_version",
    "version": "model_version",
    "job": "training_job",
    "jobs": "training_job",
    "training": "training_job",
    "group": "feature_group",
    "feature-group": "feature_group",
    "features": "feature_group",
    "sample": "dataset",
    "samples": "dataset",
    "datasets": "dataset",
    "records": "record_set",
    "record-set": "record_set",
    "record-sets": "record_set",
    "deploy": "deployment",
    "deployments": "deployment",
    "experiments": "experiment",
}
# When several kinds share a name, the one most people mean comes first.
KIND_PREFERENCE = (
    "model_version",
    "deployment",
    "experiment",
    "training_job",
    "dataset",
    "feature_group",
)
VERSIONED = re.compile(r"^(?P<name>.+?) v(?P<version>\d+)$")


def kind_rank(kind: str) -> int:
    return KIND_RANKS.get(kind, OTHER_RANK)


def kind_name(kind: str) -> str:
    return KIND_NAMES.get(kind, kind.replace("_", " "))


def kind_parse(word: str, *, workspace: Workspace | None = None) -> str | None:
    """The node kind ``word`` names ("model", "model version", "model_version"), or None.

    With a ``workspace``, a kind its graph holds counts too, whether the tables above know it or
    not (an OpenLineage producer's own, or one a later app adds): the page's own links name
    every node by its kind, so every one of them must open."""
    given = (word or "").strip()
    cleaned = given.lower().replace(" ", "_")
    if not cleaned:
        return None
    kind = canonical_kind(
        KIND_WORDS.get(cleaned) or KIND_WORDS.get(cleaned.replace("_", "-")) or cleaned
    )
    if kind in KIND_RANKS or kind in KIND_NAMES:
        return kind
    if workspace is not None:
        held = Node.objects.for_workspace(workspace).filter(kind__in={given, cleaned})
        return held.values_list("kind", flat=True).first()
    return None


def _preferred(nodes: QuerySet[Node]) -> QuerySet[Node]:
    order = Case(
        *(When(kind=k, then=Value(i)) for i, k in enumerate(KIND_PREFERENCE)),
        default=Value(len(KIND_PREFERENCE)),
        output_field=IntegerField(),
    )
    return nodes.annotate(preference=order).order_by("preference", "-live", "-last_event_id")


@dataclass
class NodeLookup:
    """What a search found: the node to centre on (or None), others with the same name, and
    names close to the query when nothing matched."""

    query: str
    kind: str | None
    node: Node | None = None
    namesakes: list[Node] = field(default_factory=list)
    suggestions: list[Node] = field(default_factory=list)
    by_key: bool = False


def node_find(
    *, workspace: Workspace, query: str, kind: str | None = None, key: str = ""
) -> NodeLookup:
    """The node a person means by ``query`` (a name, "name vN", or a bare model/dataset name for
    its newest version), optionally of one ``kind``; ``key`` (<kind>:<id>) still works.

    A name used by several objects picks the preferred kind, then a live one, then the newest,
    and lists the others as namesakes. Nothing matching: suggestions, never an error.
    """
    nodes = Node.objects.for_workspace(workspace)
    query = (query or "").strip()
    found = NodeLookup(query=query or key, kind=kind)
    if not key and ":" in query and kind_parse(query.partition(":")[0]):
        key, query = query, ""  # an internal id, e.g. experiment:1
    if key and not query:
        found.by_key = True
        node_kind, _, object_id = key.partition(":")
        found.node = nodes.filter(kind=canonical_kind(node_kind), object_id=object_id).first()
        if found.node is None:
            found.suggestions = node_suggest(workspace=workspace, query=object_id, limit=8)
        return found
    if kind:
        nodes = nodes.filter(kind=kind)
    matches = list(_preferred(nodes.filter(label__iexact=query))[:20])
    if not matches:
        # "ctr-model" names every version of the model: take the newest.
        candidates = nodes.filter(label__istartswith=f"{query} v")
        newest: dict[str, tuple[int, Node]] = {}
        for node in candidates[:500]:
            match = VERSIONED.match(node.label)
            if match and match["name"].lower() == query.lower():
                version = int(match["version"])
                if node.kind not in newest or version > newest[node.kind][0]:
                    newest[node.kind] = (version, node)
        matches = sorted(
            (node for _, node in newest.values()),
            key=lambda n: KIND_PREFERENCE.index(n.kind) if n.kind in KIND_PREFERENCE else 99,
        )
    if matches:
        found.node, found.namesakes = matches[0], matches[1:]
        return found
    found.suggestions = node_suggest(workspace=workspace, query=query, kind=kind, limit=8)
    return found


def node_suggest(
    *, workspace: Workspace, query: str, kind: str | None = None, limit: int = 10
) -> list[Node]:
    """Nodes whose name contains ``query`` (names that start with it first), else names close to
    it (a typo), for the search box's suggestions."""
    nodes = Node.objects.for_workspace(workspace).exclude(label="")
    if kind:
        nodes = nodes.filter(kind=kind)
    query = (query or "").strip()
    if not query:
        return list(nodes.order_by("-last_event_id")[:limit])
    starts = Case(
        When(label__istartswith=query, then=Value(0)), default=Value(1), output_field=IntegerField()
    )
    found = list(
        nodes.filter(label__icontains=query)
        .annotate(starts=starts)
        .order_by("starts", "label", "-last_event_id")[:limit]
    )
    if found:
        return found
    labels = list(nodes.order_by("-last_event_id").values_list("label", flat=True)[:2000])
    close = difflib.get_close_matches(query.lower(), [label.lower() for label in labels], n=limit)
    if not close:
        return []
    matches = Q()
    for label in close:
        matches |= Q(label__iexact=label)
    by_label = {n.label.lower(): n for n in nodes.filter(matches).order_by("last_event_id")}
    return [by_label[label] for label in close if label in by_label]
