"""Trace replay through the placement engine, the FGD paper's way.

Pods are sampled (with replacement, seeded) from the trace and submitted one after another until
the GPU demand that has arrived reaches the cluster's GPU capacity; a pod that does not fit is
dropped. Every policy sees the same sequence. Reported per policy: the share of GPU capacity left
unallocated at the end, the cluster's expected fragmentation (share of capacity) and placement
decisions per second.

Also reported: ``fractional_packing_waste_lb``, a lower bound on the GPU capacity (share) that
any placement, even an offline one that knows the whole sequence and ignores CPU and memory,
leaves idle when it places every arrived fractional pod: the LP relaxation of bin packing those
slices into whole GPUs. It says how close to the possible a policy gets.
"""

from __future__ import annotations

import csv
import random
import time
from collections import Counter
from pathlib import Path

from training.scheduler.placement import (
    POLICIES,
    WHOLE,
    Cluster,
    NodeInventory,
    Request,
    workload_classes,
)


def load_nodes(path: str | Path) -> list[NodeInventory]:
    """Nodes from an openb node list (sn, cpu_milli, memory_mib, gpu, model)."""
    nodes = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            gpus = int(float(row.get("gpu") or 0))
            model = (row.get("model") or "").strip()
            if model.lower() == "nan":
                model = ""
            nodes.append(
                NodeInventory(
                    name=row["sn"],
                    cpu_milli=int(float(row["cpu_milli"])),
                    memory_mb=int(float(row["memory_mib"])),
                    gpu_type=model,
                    gpus=(1000,) * gpus,
                )
            )
    return nodes


def load_pods(path: str | Path) -> list[Request]:
    """Requests from an openb pod list (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec)."""
    pods = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            num_gpu = int(float(row.get("num_gpu") or 0))
            gpu_milli = int(float(row.get("gpu_milli") or 0))
            spec = (row.get("gpu_spec") or "").strip()
            types = tuple(t for t in spec.split("|") if t and t.lower() != "nan")
            if num_gpu == 1 and 0 < gpu_milli < 1000:
                req = Request(
                    int(float(row["cpu_milli"])),
                    int(float(row["memory_mib"])),
                    0,
                    gpu_milli,
                    types,
                )
            else:
                req = Request(
                    int(float(row["cpu_milli"])), int(float(row["memory_mib"])), num_gpu, 0, types
                )
            pods.append(req)
    return pods


def arrival_sequence(pods: list[Request], capacity_milli: int, seed: int) -> list[Request]:
    """Pods sampled from the trace until their GPU demand reaches ``capacity_milli``."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not security
    out, arrived = [], 0
    while arrived < capacity_milli:
        pod = pods[rng.randrange(len(pods))]
        out.append(pod)
        arrived += pod.gpu_demand_milli
    return out


def fractional_packing_waste_lb(
    sequence: list[Request], capacity_milli: int, *, max_patterns: int = 50_000
) -> float | None:
    """LP lower bound (share of capacity) on the idle slivers of packing every fractional pod.

    Cutting-stock relaxation: every way (pattern) of filling one GPU with slices of the arrived
    sizes is a column; the least fractional number of GPUs covering every slice, minus their
    demand, is the least waste. None when the sizes allow more than ``max_patterns`` patterns.
    """
    import numpy as np
    from scipy.optimize import linprog

    counts = Counter(r.gpu_milli for r in sequence if not r.gpu_count and r.gpu_milli)
    if not counts or not capacity_milli:
        return 0.0
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
    if len(patterns) > max_patterns:
        return None
    matrix = np.array(patterns, dtype=np.float64).T
    need = np.array([counts[size] for size in sizes], dtype=np.float64)
    done = linprog(
        np.ones(matrix.shape[1]), A_ub=-matrix, b_ub=-need, bounds=(0, None), method="highs"
    )
    if not done.success:
        return None
    demand = sum(size * n for size, n in counts.items())
    return max(done.fun * WHOLE - demand, 0.0) / capacity_milli


def simulate(
    pods: list[Request],
    nodes: list[NodeInventory],
    *,
    seed: int = 42,
    policies: tuple[str, ...] = POLICIES,
    slice_pricing: bool = True,
) -> dict:
    """One run of every policy on the same arrival sequence; the measures as a dict.

    ``slice_pricing=False`` runs the default policy on FGD's measure alone (the ablation)."""
    classes = workload_classes(pods)
    probe = Cluster(nodes)
    capacity = probe.gpu_capacity_milli
    sequence = arrival_sequence(pods, capacity, seed)
    result: dict = {
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "pods_submitted": len(sequence),
        "seed": seed,
        "workload_classes": len(classes),
        "slice_pricing": slice_pricing,
    }
    bound = fractional_packing_waste_lb(sequence, capacity)
    if bound is not None:
        result["fractional_packing_waste_lb"] = round(bound, 4)
    timings = {}
    for policy in policies:
        cluster = Cluster(nodes, workload=classes, seed=seed, slice_pricing=slice_pricing)
        placed = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        for req in sequence:
            if cluster.place(req, policy) is not None:
                placed += 1
        elapsed = time.perf_counter() - started
        cpu_elapsed = time.process_time() - cpu_started
        result[f"cpu_time_placements_per_s_{policy}"] = (
            round(len(sequence) / cpu_elapsed, 1) if cpu_elapsed else 0.0
        )
        timings[policy] = len(sequence) / elapsed if elapsed else 0.0
        result[f"unallocated_gpu_share_{policy}"] = round(cluster.gpu_free_milli / capacity, 4)
        result[f"fragmentation_share_{policy}"] = round(cluster.fragmentation(), 4)
        result[f"placed_pods_{policy}"] = placed
        result[f"placements_per_s_{policy}"] = round(timings[policy], 1)
    others = [result[f"unallocated_gpu_share_{p}"] for p in policies if p != "default"]
    if "default" in policies and others:
        best = min(others)
        result["unallocated_vs_best_baseline"] = (
            round(result["unallocated_gpu_share_default"] / best, 4) if best else None
        )
        result["placements_per_s"] = result["placements_per_s_default"]
        result["cpu_time_placements_per_s"] = result["cpu_time_placements_per_s_default"]
    return result
