"""Reads of the lineage graph: bounded traversals, impact, consumers, unused features.

Traversals walk the adjacency table level by level (one indexed query per level over the covering
indexes ``lineage_edge_down``/``lineage_edge_up``), keeping a visited set, so each node is read
once and the work is bounded by ``depth`` and ``max_nodes``. It runs the same on PostgreSQL and
SQLite.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Count, Max, Q
from django.utils import timezone

from lineage.adjacency import levels, neighbours
from lineage.conf import setting
from lineage.links import object_url
from lineage.models import Edge, EdgeType, Node, Reach
from lineage.projection import canonical_kind
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Workspace

FEATURE_KINDS = ("feature_group", "feature")


def graph_summary() -> str:
    return (
        f"{Node.objects.unscoped().count()} nodes, "
        f"{Edge.objects.unscoped().filter(active=True).count()} live edges"
    )


def parse_node_key(key: str) -> tuple[str, str]:
    kind, sep, object_id = (key or "").partition(":")
    if not sep or not kind or not object_id:
        raise ValidationError({"node": "Give the node as <kind>:<id>, e.g. feature_group:12."})
    return canonical_kind(kind), object_id


def node_get(*, workspace: Workspace, key: str) -> Node:
    kind, object_id = parse_node_key(key)
    node = Node.objects.for_workspace(workspace).filter(kind=kind, object_id=object_id).first()
    if node is None:
        message = f"No lineage node {kind}:{object_id} in this workspace."
        raise ReferenceNotFound(message, attr="node")
    return node


def node_dict(node: Node) -> dict[str, Any]:
    return {
        "key": node.key,
        "kind": node.kind,
        "object_id": node.object_id,
        "label": node.label,
        "owner": node.owner_name,
        "live": node.live,
        "status": node.status,
        "first_seen_at": node.first_seen_at,
        "last_seen_at": node.last_seen_at,
    }


def _check(direction: str, depth: int) -> None:
    if direction not in ("upstream", "downstream"):
        raise ValidationError({"direction": "Use upstream, downstream or both."})
    if not 1 <= depth <= int(setting("LINEAGE_MAX_DEPTH")):
        raise ValidationError(
            {"depth": f"Depth must be between 1 and {setting('LINEAGE_MAX_DEPTH')}."}
        )


def traverse(
    *,
    workspace: Workspace,
    node: Node,
    direction: str = "downstream",
    depth: int = 3,
    max_nodes: int | None = None,
    with_ended: bool = False,
) -> dict[str, Any]:
    """The subgraph within ``depth`` steps of ``node`` in one direction (or ``both``)."""
    directions = ["upstream", "downstream"] if direction == "both" else [direction]
    for d in directions:
        _check(d, depth)
    cap = max_nodes or int(setting("LINEAGE_MAX_NODES"))
    levels = {node.pk: 0}
    edges: dict[tuple[int, int, str], bool] = {}
    truncated = False
    for d in directions:
        frontier = [node.pk]
        for level in range(1, depth + 1):
            nxt: list[int] = []
            for near, far, edge_type, active in neighbours(frontier, d, with_ended=with_ended):
                if far not in levels:
                    if len(levels) >= cap:
                        truncated = True
                        continue
                    levels[far] = level if d == "downstream" else -level
                    nxt.append(far)
                key = (near, far, edge_type) if d == "downstream" else (far, near, edge_type)
                edges[key] = active
            frontier = nxt
            if not frontier:
                break
    nodes = Node.objects.for_workspace(workspace).filter(pk__in=list(levels))
    by_id = {n.pk: n for n in nodes}
    return {
        "root": node.key,
        "direction": direction,
        "depth": depth,
        "truncated": truncated,
        "nodes": [
            {
                **node_dict(by_id[pk]),
                "level": level,
                "url": object_url(workspace.slug, by_id[pk]),
            }
            for pk, level in sorted(levels.items(), key=lambda item: (item[1], item[0]))
            if pk in by_id
        ],
        "edges": [
            {"src": by_id[s].key, "dst": by_id[t].key, "type": edge_type, "active": active}
            for (s, t, edge_type), active in edges.items()
            if s in by_id and t in by_id
        ],
    }


def downstream_ids(node_id: int, depth: int, direction: str = "downstream") -> set[int]:
    found = set(levels(node_id, depth, direction))
    found.discard(node_id)
    return found


def impact(*, workspace: Workspace, node: Node, depth: int = 6, limit: int = 100) -> dict[str, Any]:
    """What breaks if ``node`` is retired: the live jobs, model versions, deployments and
    experiments within ``depth`` steps downstream (counts by kind, the first ``limit`` of them)
    and their owners. Reads the precomputed ``Reach`` rows: two index range scans."""
    _check("downstream", depth)
    reached = Reach.objects.for_workspace(workspace).filter(src=node, depth__lte=depth)
    counts: Counter[str] = Counter()
    owners: Counter[str] = Counter()
    for kind, owner, n in (
        reached.values_list("dst_kind", "dst_owner").annotate(n=Count("dst_id")).order_by()
    ):
        counts[kind] += n
        if owner:
            owners[owner] += n
    items = [
        {"key": f"{kind}:{object_id}", "kind": kind, "label": label, "owner": owner, "depth": d}
        for kind, object_id, label, owner, d in reached.order_by("dst_kind", "dst_id").values_list(
            "dst_kind", "dst__object_id", "dst__label", "dst_owner", "depth"
        )[:limit]
    ]
    total = sum(counts.values())
    return {
        "root": node.key,
        "depth": depth,
        "counts": dict(sorted(counts.items())),
        "total": total,
        "owners": [{"owner": name, "items": n} for name, n in owners.most_common()],
        "items": items,
        "truncated": total > len(items),
    }


def consumers_of(*, workspace: Workspace, node: Node) -> list[Node]:
    """Objects that use ``node`` now (live consumes edges out of it)."""
    return list(
        Node.objects.for_workspace(workspace)
        .filter(in_edges__src=node, in_edges__active=True, in_edges__type=EdgeType.CONSUMES)
        .distinct()
        .order_by("kind", "object_id")
    )


def related_of_kind(
    *, workspace: Workspace, node: Node, direction: str, kinds: tuple[str, ...], depth: int = 6
) -> list[Node]:
    ids = downstream_ids(node.pk, depth, direction)
    return list(
        Node.objects.for_workspace(workspace)
        .filter(pk__in=list(ids), kind__in=kinds)
        .order_by("kind", "label")
    )


def features_of_model(*, workspace: Workspace, node: Node) -> list[Node]:
    return related_of_kind(
        workspace=workspace, node=node, direction="upstream", kinds=FEATURE_KINDS
    )


def models_of_feature(*, workspace: Workspace, node: Node) -> list[Node]:
    return related_of_kind(
        workspace=workspace, node=node, direction="downstream", kinds=("model_version",)
    )


def unused_features(*, workspace: Workspace, days: int = 30) -> list[dict[str, Any]]:
    """Live feature groups and features with no live consumer for ``days`` days."""
    since = timezone.now() - timedelta(days=days)
    consumes = Q(out_edges__type=EdgeType.CONSUMES)
    candidates = (
        Node.objects.for_workspace(workspace)
        .filter(kind__in=FEATURE_KINDS, live=True)
        .exclude(
            pk__in=Edge.objects.for_workspace(workspace)
            .filter(type=EdgeType.CONSUMES, active=True)
            .values("src_id")
        )
        .annotate(last_consumed=Max("out_edges__ended_at", filter=consumes))
        .order_by("kind", "label")
    )
    unused = []
    for node in candidates:
        idle_since = node.last_consumed or node.first_seen_at
        if idle_since <= since:
            unused.append({**node_dict(node), "idle_since": idle_since})
    return unused
