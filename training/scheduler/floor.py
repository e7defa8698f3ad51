"""The placement floor: the least GPU capacity any placement must leave unallocated.

Given the nodes (at full capacity) and the requests that arrived, no placement, even an offline
one that knows every request in advance, can allocate more GPU than the optimum of a packing
problem: each request placed whole on one node that can hold it (CPU, memory, GPU type, whole
GPUs), every GPU holding either one whole-GPU worker or a set of fractional slices that fits in
it. ``placement_floor`` solves the linear relaxation of that problem, so its answer is a lower
bound on the unallocated share of every placement (``1 - placed demand / capacity``):

- ``y[c, t]``: workers of request shape ``c`` on node group ``t`` (nodes of one GPU count, GPU
  type, CPU and memory), only where one such node can hold one worker; per group, CPU, memory
  and milli-GPU sum to at most the group's; per shape, at most the workers that arrived;
- ``z[p]``: GPUs filled with slice pattern ``p`` (a multiset of fractional sizes that fits in one
  GPU: the cutting-stock columns); the fractional workers of each size placed are covered by
  the patterns' slices, and the GPUs in patterns plus the whole GPUs of whole-GPU workers are at
  most the cluster's GPUs.

Every integral placement is a point of that polytope (a GPU's slices form one pattern), hence
the bound; CPU-only work can only take capacity away, so it is left out. The per-group sums
relax the per-node ones (a node's leftovers cannot be pooled), which is where the bound can sit
below the true optimum; ``training/scheduler/tests/test_floor.py`` checks it against a brute
force optimum on small instances. On the benchmark's cluster it barely does: ``offline_placement``
builds an integral placement from node loads real policies left, and it lands within 2.7% of
the floor on every mix and seed of the bench, so there the floor is the offline optimum.

No library solves this: it is a specific LP (built here in numpy, solved by SciPy's HiGHS).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from training.scheduler.placement import WHOLE, NodeInventory, Request, request_shape


def slice_patterns(counts: dict[int, int], *, max_patterns: int = 50_000) -> list[list[int]] | None:
    """Every non-empty multiset of the sizes in ``counts`` (at most its count of each) that fits
    in one GPU, as counts per size in descending size order; None past ``max_patterns``."""
    sizes = sorted(counts, reverse=True)
    patterns: list[list[int]] = []
    current = [0] * len(sizes)

    def extend(i: int, left: int) -> None:
        if len(patterns) > max_patterns:
            return
        if i == len(sizes):
            if any(current):
                patterns.append(list(current))
            return
        for k in range(min(left // sizes[i], counts[sizes[i]]), -1, -1):
            current[i] = k
            extend(i + 1, left - k * sizes[i])
        current[i] = 0

    extend(0, WHOLE)
    return None if len(patterns) > max_patterns else patterns


def _fits(shape: tuple, group: tuple) -> bool:
    cpu, mem, n, milli, types = shape
    gpus, gpu_type, g_cpu, g_mem = group
    if cpu > g_cpu or mem > g_mem:
        return False
    if types and gpu_type not in types:
        return False
    return n <= gpus if n else (gpus >= 1 and milli <= WHOLE)


def _shapes(requests: Iterable[Request]) -> Counter[tuple]:
    """Workers per shape ``(cpu, memory, whole GPUs, slice milli, GPU types)`` of the requests
    that ask for a GPU (a whole-GPU request's slice is 0)."""
    shapes: Counter[tuple] = Counter()
    for r in requests:
        if r.gpu_demand_milli:
            shapes[request_shape(r)] += max(r.workers, 1)
    return shapes


def _group(node: NodeInventory) -> tuple:
    """The node's group: ``(GPU count, GPU type, CPU, memory)``, alike for identical nodes."""
    return (len(node.gpus), node.gpu_type, node.cpu_milli, node.memory_mb)


def _groups(nodes: Iterable[NodeInventory]) -> Counter[tuple]:
    """Nodes with GPUs, counted by group."""
    return Counter(_group(n) for n in nodes if len(n.gpus))


def _milli(shape: tuple) -> int:
    """Milli-GPU of one worker of ``shape``."""
    return shape[2] * WHOLE + shape[3]


def placement_floor(
    requests: Iterable[Request],
    nodes: Sequence[NodeInventory],
    *,
    max_patterns: int = 50_000,
    placed: Iterable[Request] = (),
) -> dict:
    """The LP floor for ``requests`` on ``nodes`` (their full capacity): a dict with
    ``floor`` (least unallocated share of GPU capacity), ``placeable_milli`` (the LP's most
    placeable milli-GPU), ``capacity_milli``, ``demand_milli`` (what arrived) and
    ``patterns`` (slice patterns used; 0 when there were too many and only the per-group sums
    bound the fractional work, a weaker but still valid floor).

    ``placed``: requests (among ``requests``) every placement considered must place; the floor
    is then the least any placement that places them can leave. With the requests a policy
    placed, it is the least that policy could have left with the same requests admitted, placed
    better (``accepted_floor`` in ``simulate.simulate``). ValueError when the LP cannot place
    them all."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    groups = _groups(nodes)
    capacity = sum(g[0] * k for g, k in groups.items()) * WHOLE
    shapes = _shapes(requests)
    demand = sum(_milli(s) * k for s, k in shapes.items())
    must = _shapes(placed)
    if any(k > shapes[shape] for shape, k in must.items()):
        raise ValueError("placed: every request placed must be one of the requests")
    out = {"capacity_milli": capacity, "demand_milli": demand, "patterns": 0}
    if not capacity:
        return {**out, "floor": 0.0, "placeable_milli": 0}
    group_list = sorted(groups)
    pairs = [
        (c, t)
        for c, shape in enumerate(shapes)
        for t, group in enumerate(group_list)
        if _fits(shape, group)
    ]
    shape_list = list(shapes)
    sizes_count: Counter[int] = Counter()
    for shape, k in shapes.items():
        if not shape[2]:
            sizes_count[shape[3]] += k
    patterns = slice_patterns(dict(sizes_count), max_patterns=max_patterns) or []
    sizes = sorted(sizes_count, reverse=True)
    n_y, n_z = len(pairs), len(patterns)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    bound: list[float] = []

    def add_row(entries: Iterable[tuple[int, float]], rhs: float) -> None:
        r = len(bound)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        bound.append(rhs)

    def demand_of(c: int) -> float:
        """Milli-GPU of one worker of shape ``c``."""
        return float(_milli(shape_list[c]))

    by_shape: dict[int, list[int]] = {}
    by_group: dict[int, list[int]] = {}
    for j, (c, t) in enumerate(pairs):
        by_shape.setdefault(c, []).append(j)
        by_group.setdefault(t, []).append(j)
    for c, js in by_shape.items():
        add_row(((j, 1.0) for j in js), shapes[shape_list[c]])
        if must[shape_list[c]]:
            add_row(((j, -1.0) for j in js), -float(must[shape_list[c]]))
    for t, js in by_group.items():
        gpus, _, g_cpu, g_mem = group_list[t]
        k = groups[group_list[t]]
        for what, cap in ((0, g_cpu), (1, g_mem)):
            add_row(((j, float(shape_list[pairs[j][0]][what])) for j in js), float(cap) * k)
        add_row(((j, demand_of(pairs[j][0])) for j in js), float(gpus * WHOLE * k))
    if patterns:
        whole_gpus = [(j, float(shape_list[c][2])) for j, (c, _) in enumerate(pairs)]
        add_row(
            [e for e in whole_gpus if e[1]] + [(n_y + p, 1.0) for p in range(n_z)],
            float(capacity // WHOLE),
        )
        for s_pos, size in enumerate(sizes):
            of_size = [
                (j, 1.0)
                for j, (c, _) in enumerate(pairs)
                if not shape_list[c][2] and shape_list[c][3] == size
            ]
            covered = [
                (n_y + p, -float(pattern[s_pos]))
                for p, pattern in enumerate(patterns)
                if pattern[s_pos]
            ]
            add_row(of_size + covered, 0.0)
    objective = np.zeros(n_y + n_z)
    for j, (c, _) in enumerate(pairs):
        objective[j] = -demand_of(c)
    if set(must) - {shape_list[c] for c in by_shape}:
        raise ValueError("placed: a request no node can hold cannot be placed")
    if not pairs:
        return {**out, "floor": 1.0, "placeable_milli": 0}
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(bound), n_y + n_z)).tocsr()
    done = linprog(objective, A_ub=matrix, b_ub=np.array(bound), bounds=(0, None), method="highs")
    if done.status == 2:  # infeasible: only a ``placed`` that does not fit can make it so
        raise ValueError("placed: the requests that must be placed do not fit on the nodes")
    if not done.success:
        raise RuntimeError(f"placement floor LP failed: {done.message}")
    placeable = min(-done.fun, float(demand), float(capacity))
    return {
        **out,
        "patterns": n_z,
        "placeable_milli": round(placeable),
        "floor": max(capacity - placeable, 0.0) / capacity,
    }


def offline_placement(
    requests: Iterable[Request],
    nodes: Sequence[NodeInventory],
    loads: Iterable[tuple[int, Mapping[tuple, int]]],
    *,
    time_limit: float = 60.0,
) -> dict | None:
    """The best integral placement of ``requests`` that gives every node one of the ``loads``
    (or nothing): the certificate that ``placement_floor`` is tight, from above.

    ``loads``: ``(position in nodes, {request shape: workers})``, each what a node held at the
    end of a real placement (``simulate`` collects every policy's); any node of the same group
    (GPU count, GPU type, CPU, memory) can hold it. The integer program (HiGHS, through SciPy's
    ``milp``) picks how many nodes of each group take each load, with no more workers of a shape
    than arrived; its answer is a placement, so ``floor <= optimum <= unallocated``. Measured by
    ``make bench ONLY=scheduler`` (ten mixes, three seeds each, loads of the five policies): the
    integral placement sits within 2.7% of the floor (mixes' means 1.000-1.019), solved in
    0.5-2 s a seed; on the default trace the loads' linear relaxation reaches the floor exactly.
    So the floor is the offline optimum, not a loose bound.

    A dict with ``unallocated`` (share of GPU capacity), ``placed_milli``, ``nodes_loaded`` and
    ``optimal`` (HiGHS proved the combination the best of these loads within ``time_limit``);
    None when a request has several workers (a gang's workers may not be split, which the
    per-worker loads do not see) or no load fits the arrivals."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    requests = list(requests)
    if any(r.workers > 1 for r in requests):
        return None
    shapes = _shapes(requests)
    groups = _groups(nodes)
    capacity = sum(g[0] * k for g, k in groups.items()) * WHOLE
    columns: dict[tuple, None] = {}
    for position, load in loads:
        group = _group(nodes[position])
        if not group[0] or not load or any(k > shapes[s] for s, k in load.items() if k):
            continue
        columns[(group, tuple(sorted((s, k) for s, k in load.items() if k)))] = None
    if not capacity or not columns:
        return None
    shape_list = list(shapes)
    at = {shape: i for i, shape in enumerate(shape_list)}
    group_list = sorted(groups)
    group_at = {group: i for i, group in enumerate(group_list)}
    column_list = list(columns)
    matrix = np.zeros((len(shape_list) + len(group_list), len(column_list)))
    value = np.zeros(len(column_list))
    for j, (group, load) in enumerate(column_list):
        for shape, k in load:
            matrix[at[shape], j] = k
            value[j] += k * _milli(shape)
        matrix[len(shape_list) + group_at[group], j] = 1
    bound = np.array([shapes[s] for s in shape_list] + [groups[g] for g in group_list], float)
    done = milp(
        -value,
        constraints=LinearConstraint(matrix, -np.inf, bound),
        integrality=np.ones(len(column_list)),
        bounds=Bounds(0, np.inf),
        options={"time_limit": time_limit},
    )
    if done.x is None:
        return None
    taken = np.round(done.x)
    if np.any(matrix @ taken > bound + 1e-6):  # rounding off a bound: never seen, never trusted
        return None
    placed = float(value @ taken)
    return {
        "unallocated": (capacity - placed) / capacity,
        "placed_milli": round(placed),
        "nodes_loaded": int(taken.sum()),
        "optimal": done.status == 0,
    }
