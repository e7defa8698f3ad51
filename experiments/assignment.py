"""Assignment: which arm of which experiment a unit belongs to.

A unit's bucket is ``serving.routing.bucket(unit_id, layer.salt)`` (blake2b, the same in every
process and after restarts): the gateway computes exactly the same bucket when it routes. Within a
layer each experiment reserves a block of buckets, ``arms x max ramp percent`` wide, placed where
no other live experiment of the layer has one (so no unit is ever in two experiments of a layer).
Inside the block arm ``i`` owns ``[start_i, start_i + percent x 100)`` with ``start_i`` fixed: a
ramp from 5% to 20% only extends the ranges, so every unit in treatment at 5% is still in
treatment at 20%.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from serving.selectors import BUCKETS, bucket

BUCKETS_PER_PERCENT = BUCKETS // 100


def arm_span(max_percent: float) -> int:
    """Buckets reserved per arm for a ramp that tops out at ``max_percent``."""
    return round(max_percent * BUCKETS_PER_PERCENT)


def block_size(n_arms: int, max_percent: float) -> int:
    return n_arms * arm_span(max_percent)


def find_block(taken: Iterable[tuple[int, int]], size: int) -> int | None:
    """First bucket where ``size`` buckets are free, given taken ``(start, size)`` blocks."""
    cursor = 0
    for start, length in sorted(taken):
        if start - cursor >= size:
            return cursor
        cursor = max(cursor, start + length)
    return cursor if BUCKETS - cursor >= size else None


def largest_free_run(taken: Iterable[tuple[int, int]]) -> int:
    """The widest run of free buckets between taken ``(start, size)`` blocks: the biggest block
    ``find_block`` can still place."""
    cursor, widest = 0, 0
    for start, length in sorted(taken):
        widest = max(widest, start - cursor)
        cursor = max(cursor, start + length)
    return max(widest, BUCKETS - cursor)


def allocations(
    *, block_start: int, arms: Sequence[dict[str, Any]], max_percent: float, percent: float
) -> list[dict[str, Any]]:
    """Bucket ranges ``{arm, version_id, start, end}`` of every arm at ``percent`` per arm."""
    span = arm_span(max_percent)
    width = min(span, round(percent * BUCKETS_PER_PERCENT))
    out = []
    for i, arm in enumerate(arms):
        start = block_start + i * span
        if width > 0:
            out.append(
                {
                    "arm": arm["name"],
                    "version_id": int(arm["version_id"]),
                    "start": start,
                    "end": start + width,
                }
            )
    return out


def assign(unit_id: str, salt: str, allocs: Sequence[dict[str, Any]]) -> str | None:
    """The arm a unit gets (None: not in the experiment)."""
    b = bucket(str(unit_id), salt)
    for alloc in allocs:
        if alloc["start"] <= b < alloc["end"]:
            return alloc["arm"]
    return None


def buckets_of(unit_ids: Iterable[str], salt: str) -> np.ndarray:
    """Buckets of many units (for the split checks)."""
    return np.fromiter((bucket(str(u), salt) for u in unit_ids), dtype=np.int64)


def arms_of_buckets(buckets: np.ndarray, allocs: Sequence[dict[str, Any]]) -> np.ndarray:
    """Index of each bucket's allocation, -1 outside every one."""
    out = np.full(buckets.shape, -1, dtype=np.int64)
    for i, alloc in enumerate(allocs):
        out[(buckets >= alloc["start"]) & (buckets < alloc["end"])] = i
    return out
