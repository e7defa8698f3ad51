"""Keeping ``Reach`` (precomputed impact) in step with the graph.

- an edge u -> v goes live: every ancestor a of u (itself included, at distance j) now reaches v
  (if v is an impact kind and live) at j + 1 and everything v reaches at j + 1 + k;
- an edge ends: the ancestors of its source are recomputed by walking down from each (rare);
- a node dies (retired ...): rows that end at it go; it comes back: its ancestors reach it again.

Depths are shortest distances; conflicting inserts keep the smaller one, so the incremental result
equals ``reach_bulk_rebuild`` over the same live edges.
"""

from __future__ import annotations

from django.db import connection

from lineage.adjacency import levels
from lineage.models import Node, Reach

IMPACT_KINDS = ("training_job", "model_version", "deployment", "experiment")
MAX_DEPTH = 10
BATCH = 5000


def _insert(workspace_id: int, rows: list[tuple[int, int, str, str, int]]) -> None:
    """Upsert (src, dst, kind, owner, depth) rows keeping the shortest depth."""
    if not rows:
        return
    table = Reach._meta.db_table
    least = "LEAST" if connection.vendor == "postgresql" else "MIN"
    sql = (
        f"INSERT INTO {table} (workspace_id, src_id, dst_id, dst_kind, dst_owner, depth) "  # noqa: S608
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (src_id, dst_id) DO UPDATE SET "
        f"depth = {least}({table}.depth, excluded.depth)"
    )
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            cursor.executemany(sql, [(workspace_id, *row) for row in rows[start : start + BATCH]])


def reach_add_edge(src: Node, dst: Node) -> None:
    ancestors = levels(src.pk, MAX_DEPTH - 1, "upstream")
    targets: list[tuple[int, str, str, int]] = []
    if dst.kind in IMPACT_KINDS and dst.live:
        targets.append((dst.pk, dst.kind, dst.owner_name, 1))
    for dst_id, kind, owner, depth in (
        Reach.objects.for_workspace(dst.workspace_id)
        .filter(src=dst)
        .values_list("dst_id", "dst_kind", "dst_owner", "depth")
    ):
        targets.append((dst_id, kind, owner, depth + 1))
    rows = [
        (a, d, kind, owner, j + k)
        for a, j in ancestors.items()
        for d, kind, owner, k in targets
        if j + k <= MAX_DEPTH and a != d
    ]
    _insert(src.workspace_id, rows)


def reach_recompute(workspace_id: int, node_ids: list[int]) -> None:
    """Recompute what each node reaches, walking down from it."""
    Reach.objects.for_workspace(workspace_id).filter(src_id__in=node_ids).delete()
    for pk in node_ids:
        below = levels(pk, MAX_DEPTH, "downstream")
        below.pop(pk, None)
        nodes = (
            Node.objects.for_workspace(workspace_id)
            .filter(pk__in=list(below), kind__in=IMPACT_KINDS, live=True)
            .values_list("pk", "kind", "owner_name")
        )
        _insert(workspace_id, [(pk, d, kind, owner, below[d]) for d, kind, owner in nodes])


def reach_edge_ended(src: Node) -> None:
    reach_recompute(src.workspace_id, list(levels(src.pk, MAX_DEPTH, "upstream")))


def reach_node_died(node: Node) -> None:
    Reach.objects.for_workspace(node.workspace_id).filter(dst=node).delete()


def reach_node_revived(node: Node) -> None:
    if node.kind not in IMPACT_KINDS:
        return
    ancestors = levels(node.pk, MAX_DEPTH, "upstream")
    ancestors.pop(node.pk, None)
    _insert(
        node.workspace_id,
        [(a, node.pk, node.kind, node.owner_name, j) for a, j in ancestors.items()],
    )


def reach_owner_changed(node: Node) -> None:
    if node.kind in IMPACT_KINDS:
        Reach.objects.for_workspace(node.workspace_id).filter(dst=node).update(
            dst_owner=node.owner_name
        )


def reach_bulk_rebuild(workspace_id: int) -> int:
    """Recompute every row of a workspace in one statement (PostgreSQL; bulk loads)."""
    Reach.objects.for_workspace(workspace_id).delete()
    if connection.vendor != "postgresql":
        ids = list(Node.objects.for_workspace(workspace_id).values_list("pk", flat=True))
        reach_recompute(workspace_id, ids)
        return Reach.objects.for_workspace(workspace_id).count()
    node, edge, reach = Node._meta.db_table, "lineage_edge", Reach._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {reach} (workspace_id, src_id, dst_id, dst_kind, dst_owner, depth)
            WITH RECURSIVE walk(src, dst, depth) AS (
                SELECT e.src_id, e.dst_id, 1 FROM {edge} e
                 WHERE e.active AND e.workspace_id = %(ws)s
                UNION
                SELECT w.src, e.dst_id, w.depth + 1 FROM walk w
                  JOIN {edge} e ON e.src_id = w.dst AND e.active
                 WHERE w.depth < %(max)s
            )
            SELECT %(ws)s, w.src, w.dst, n.kind, n.owner_name, min(w.depth)
              FROM walk w JOIN {node} n ON n.id = w.dst
             WHERE n.kind = ANY(%(kinds)s) AND n.live AND w.src <> w.dst
             GROUP BY w.src, w.dst, n.kind, n.owner_name
            """,  # noqa: S608 - fixed table names
            {"ws": workspace_id, "max": MAX_DEPTH, "kinds": list(IMPACT_KINDS)},
        )
        return cursor.rowcount
