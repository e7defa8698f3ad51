"""Low-level reads of the adjacency table: one indexed query per step of a walk."""

from __future__ import annotations

from collections import defaultdict

from django.db import connection

from lineage.models import Edge

SQLITE_CHUNK = 900


def neighbours(ids: list[int], direction: str, *, with_ended: bool = False) -> list[tuple]:
    """(from, to, type, active) rows of the edges leaving ``ids`` in ``direction``."""
    if not ids:
        return []
    near, far = ("src_id", "dst_id") if direction == "downstream" else ("dst_id", "src_id")
    active = "" if with_ended else " AND active"
    table = Edge._meta.db_table
    rows: list[tuple] = []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT {near}, {far}, type, active FROM {table} "  # noqa: S608 - fixed names
                f"WHERE {near} = ANY(%s){active}",
                [ids],
            )
            return cursor.fetchall()
        for start in range(0, len(ids), SQLITE_CHUNK):
            chunk = ids[start : start + SQLITE_CHUNK]
            marks = ",".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT {near}, {far}, type, active FROM {table} "  # noqa: S608 - fixed names
                f"WHERE {near} IN ({marks}){active}",
                chunk,
            )
            rows.extend(cursor.fetchall())
    return rows


def far_ids(ids: list[int], direction: str) -> list[int]:
    """Distinct ids one step away from ``ids`` over live edges."""
    if not ids:
        return []
    if connection.vendor == "postgresql":
        near, far = ("src_id", "dst_id") if direction == "downstream" else ("dst_id", "src_id")
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT DISTINCT {far} FROM {Edge._meta.db_table} "  # noqa: S608 - fixed names
                f"WHERE {near} = ANY(%s) AND active",
                [ids],
            )
            return [row[0] for row in cursor.fetchall()]
    return list({row[1] for row in neighbours(ids, direction)})


def levels(node_id: int, depth: int, direction: str) -> dict[int, int]:
    """Every node within ``depth`` steps of ``node_id`` (itself at 0) with its shortest distance."""
    found = {node_id: 0}
    frontier = [node_id]
    for level in range(1, depth + 1):
        frontier = [pk for pk in far_ids(frontier, direction) if pk not in found]
        if not frontier:
            break
        for pk in frontier:
            found[pk] = level
    return found


def reached_from_each(node_ids: list[int], depth: int, direction: str) -> dict[int, set[int]]:
    """For each of ``node_ids``, every node within ``depth`` steps over live edges (itself
    excluded), as ``levels`` finds them. All the walks step together, so a roll-up over many
    nodes (the cost shares of every costed object) reads one query per level, not per node."""
    found = {pk: {pk} for pk in node_ids}
    frontiers = {pk: {pk} for pk in node_ids}
    for _ in range(depth):
        union = sorted(set().union(*frontiers.values()))
        if not union:
            break
        step: dict[int, set[int]] = defaultdict(set)
        for near, far, _type, _active in neighbours(union, direction):
            step[near].add(far)
        for pk, frontier in frontiers.items():
            reached = {far for near in frontier for far in step.get(near, ())} - found[pk]
            found[pk] |= reached
            frontiers[pk] = reached
    return {pk: reached - {pk} for pk, reached in found.items()}
