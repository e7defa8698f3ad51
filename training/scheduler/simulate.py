"""Trace replay through the placement engine, the FGD paper's way.

Pods are sampled (with replacement, seeded) from the trace and submitted one after another until
the GPU demand that has arrived reaches the cluster's GPU capacity; a pod that does not fit is
dropped. Every policy sees the same sequence. Reported per policy: the share of GPU capacity left
unallocated at the end, the cluster's expected fragmentation (share of capacity) and placement
decisions per second.

Workload mixes (``trace_variant``): the FGD paper evaluates on variants of the default pod list
that emphasise one kind of GPU pod, sampled from it: ``gpushare<P>`` (P% of the GPU pods share a
GPU), ``multigpu<P>`` (P% ask for several whole GPUs) and ``gpuspec<P>`` (P% are pinned to GPU
models). ``MIXES`` names the ones the benchmark runs.

Also reported: ``fractional_packing_waste_lb``, a lower bound on the GPU capacity (share) that
any placement, even an offline one that knows the whole sequence and ignores CPU and memory,
leaves idle when it places every arrived fractional pod: the LP relaxation of bin packing those
slices into whole GPUs. It says how close to the possible a policy gets.
"""

from __future__ import annotations

import csv
import random
import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from training.scheduler.floor import offline_placement, placement_floor, slice_patterns
from training.scheduler.placement import (
    POLICIES,
    WHOLE,
    Cluster,
    NodeInventory,
    PriceCache,
    Request,
    WorkloadEstimator,
    request_shape,
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


FAMILIES = ("gpushare", "multigpu", "gpuspec")
MIXES = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "multigpu20",
    "multigpu30",
    "multigpu50",
    "gpuspec10",
    "gpuspec20",
    "gpuspec33",
)
_MIX = re.compile(r"^(?P<family>[a-z]+?)(?P<percent>\d{1,3})$")


def parse_mix(mix: str) -> tuple[str, int] | None:
    """``("gpushare", 40)`` for ``gpushare40``; None for ``default``; ValueError otherwise."""
    if mix == "default":
        return None
    match = _MIX.match(mix)
    if match is None or match.group("family") not in FAMILIES:
        raise ValueError(f"unknown mix {mix!r}: default or one of {', '.join(FAMILIES)} + percent")
    percent = int(match.group("percent"))
    if not 0 <= percent <= 100:
        raise ValueError(f"mix {mix!r}: the percent after {', '.join(FAMILIES)} must be 0-100")
    return match.group("family"), percent


def trace_variant(
    pods: list[Request], mix: str, nodes: list[NodeInventory], *, seed: int = 0
) -> list[Request]:
    """The pod list resampled (seeded, with replacement, as long as the original) so that
    ``percent`` of its GPU pods are of the mix's kind, the rest of the distribution kept:

    - ``gpushare``: sharing pods (a fraction of one GPU) among GPU pods, the others drawn from
      the whole-GPU pods;
    - ``multigpu``: pods of two or more whole GPUs among GPU pods, the others drawn from the
      single-GPU pods (sharing and whole, in their original proportion);
    - ``gpuspec``: GPU pods pinned to GPU models; each pinned pod gets one model, or the V100
      pair where the cluster has both, drawn in proportion to the cluster's GPUs of it, so every
      constraint can be met. CPU-only pods are kept as they are in every mix."""
    parsed = parse_mix(mix)
    if parsed is None:
        return list(pods)
    family, percent = parsed
    rng = random.Random(f"{mix}:{seed}")  # noqa: S311 - a reproducible sample, not security
    cpu_only = [p for p in pods if not p.gpu_demand_milli]
    gpu = [p for p in pods if p.gpu_demand_milli]
    if family == "gpushare":
        chosen = [p for p in gpu if not p.gpu_count]
        rest = [p for p in gpu if p.gpu_count]
    elif family == "multigpu":
        chosen = [p for p in gpu if p.gpu_count >= 2]
        rest = [p for p in gpu if p.gpu_count < 2]
    else:
        chosen, rest = gpu, gpu
    if not chosen or not rest:
        raise ValueError(f"mix {mix!r}: the pod list has no pods to draw it from")
    total = len(pods)
    n_gpu = total - len(cpu_only)
    n_chosen = round(n_gpu * percent / 100)
    out = [rng.choice(cpu_only) for _ in range(total - n_gpu)] if cpu_only else []
    picked = [rng.choice(chosen) for _ in range(n_chosen)]
    others = [rng.choice(rest) for _ in range(n_gpu - n_chosen)]
    if family == "gpuspec":
        picked = [replace(p, gpu_types=_pinned_types(rng, nodes)) for p in picked]
        others = [replace(p, gpu_types=()) for p in others]
    out.extend(picked + others)
    rng.shuffle(out)
    return out


def _pinned_types(rng: random.Random, nodes: list[NodeInventory]) -> tuple[str, ...]:
    """GPU models for one pinned pod, drawn by the cluster's GPUs of each (the V100s together,
    as the trace's own specs pair them)."""
    capacity: Counter[tuple[str, ...]] = Counter()
    for node in nodes:
        if node.gpus and node.gpu_type:
            key = ("V100M16", "V100M32") if node.gpu_type.startswith("V100") else (node.gpu_type,)
            capacity[key] += len(node.gpus)
    options = sorted(capacity)
    return rng.choices(options, weights=[capacity[o] for o in options])[0]


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
    Only a floor when every slice is placed: once the arrivals exceed what fits, leaving a
    wasteful slice waiting can idle less (``placement_floor`` is the floor in general).
    """
    import numpy as np
    from scipy.optimize import linprog

    counts = Counter(r.gpu_milli for r in sequence if not r.gpu_count and r.gpu_milli)
    if not counts or not capacity_milli:
        return 0.0
    sizes = sorted(counts, reverse=True)
    patterns = slice_patterns(dict(counts), max_patterns=max_patterns)
    if patterns is None:
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


def _node_loads(placed: list[tuple[Request, list]]) -> list[tuple[int, Counter]]:
    """What each node holds at the end of a run: ``(node position, {request shape: workers})``
    of the GPU requests placed."""
    loads: dict[int, Counter] = {}
    for req, where in placed:
        if req.gpu_demand_milli:
            shape = request_shape(req)
            for p in where:
                loads.setdefault(p.node, Counter())[shape] += 1
    return list(loads.items())


def _accepted_floor(
    sequence: list[Request], nodes: list[NodeInventory], accepted: list[Request], result: dict
) -> dict:
    """The floor with the default policy's admitted pods placed, and the two ratios."""
    accepted_floor = round(placement_floor(sequence, nodes, placed=accepted)["floor"], 4)
    floor, default = result["placement_floor"], result["unallocated_gpu_share_default"]
    return {
        "accepted_floor": accepted_floor,
        "default_vs_accepted_floor": round(default / accepted_floor, 4) if accepted_floor else None,
        "accepted_floor_vs_floor": round(accepted_floor / floor, 4) if floor else None,
    }


def simulate(
    pods: list[Request],
    nodes: list[NodeInventory],
    *,
    seed: int = 42,
    policies: tuple[str, ...] = POLICIES,
    slice_pricing: bool = True,
    workload: str = "online",
    warmup: int = 1000,
) -> dict:
    """One run of every policy on the same arrival sequence; the measures as a dict.

    ``slice_pricing=False`` runs the default policy on FGD's measure alone (the ablation).
    ``workload``: ``online`` (the default policy's target workload is estimated from the pods
    as they arrive, ``WorkloadEstimator``, as the live tick does) or ``trace`` (taken from the
    whole pod list in advance: an oracle, for comparison). ``warmup``: arrivals of a previous
    period (an independent draw from the same pods) the online estimate has seen before the
    run, as a live cluster's has its history; 0 is a cold start.

    ``placement_floor``: the least unallocated share any placement of the arrived pods can
    reach (``floor.placement_floor``); ``default_vs_floor``: the default policy's over it.
    ``accepted_floor``: the least unallocated share of any placement that places every pod the
    default policy placed (and any of those it refused). It splits the gap in two:
    ``default_vs_accepted_floor`` is where the pods went (no placement of the same pods leaves
    less than the accepted floor, so this is the most a better one could save),
    ``accepted_floor_vs_floor`` which pods got in (the floor turns away the wasteful ones,
    knowing the whole sequence).

    ``offline_placement``: the unallocated share of the best integral placement assembled from
    the node loads of every policy's run (``floor.offline_placement``), an offline placement
    that exists; ``offline_vs_floor`` its ratio to the floor. Near 1, the floor is the offline
    optimum, and ``default_vs_floor`` what online placement costs against it."""
    if workload not in ("online", "trace"):
        raise ValueError(f"workload: online or trace, not {workload!r}")
    classes: list = []
    pinned = None
    if workload == "trace":  # the whole pod list, every pod counted alike
        oracle = WorkloadEstimator(half_life=float("inf")).observe_all(pods)
        classes, pinned = oracle.classes(), oracle.pinned()
    probe = Cluster(nodes)
    capacity = probe.gpu_capacity_milli
    sequence = arrival_sequence(pods, capacity, seed)
    result: dict = {
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "pods_submitted": len(sequence),
        "seed": seed,
        "slice_pricing": slice_pricing,
        "workload": workload,
    }
    result["placement_floor"] = round(placement_floor(sequence, nodes)["floor"], 4)
    bound = fractional_packing_waste_lb(sequence, capacity)
    if bound is not None:
        result["fractional_packing_waste_lb"] = round(bound, 4)
    timings = {}
    loads: list[tuple[int, Counter]] = []  # every policy's node loads (``offline_placement``)
    for policy in policies:
        # Prices of its own: a run's result does not depend on what ran before it in the process.
        cluster = Cluster(
            nodes,
            workload=classes,
            pinned=pinned,
            seed=seed,
            slice_pricing=slice_pricing,
            prices=PriceCache(),
        )
        estimator = WorkloadEstimator() if workload == "online" else None
        if estimator is not None and warmup:
            estimator.observe_all(arrival_sequence(pods, capacity, seed + 7919)[:warmup])
            cluster.set_workload(estimator.classes(), estimator.pinned())
            if policy == "default" and slice_pricing:
                cluster.prices  # noqa: B018 - solved in the warm-up period, as a live tick has
        updates = 0
        placed: list[tuple[Request, list]] = []
        started, cpu_started = time.perf_counter(), time.process_time()
        for req in sequence:
            if estimator is not None and policy == "default" and estimator.observe(req):
                cluster.set_workload(estimator.classes(), estimator.pinned())
                updates += 1
            where = cluster.place(req, policy)
            if where is not None:
                placed.append((req, where))
        if policy == "default":
            result["workload_updates"] = updates
        elapsed = time.perf_counter() - started
        cpu_elapsed = time.process_time() - cpu_started
        result[f"cpu_time_placements_per_s_{policy}"] = (
            round(len(sequence) / cpu_elapsed, 1) if cpu_elapsed else 0.0
        )
        timings[policy] = len(sequence) / elapsed if elapsed else 0.0
        result[f"unallocated_gpu_share_{policy}"] = round(cluster.gpu_free_milli / capacity, 4)
        result[f"fragmentation_share_{policy}"] = round(cluster.fragmentation(), 4)
        result[f"placed_pods_{policy}"] = len(placed)
        result[f"placements_per_s_{policy}"] = round(timings[policy], 1)
        if policy == "default":
            result.update(_accepted_floor(sequence, nodes, [r for r, _ in placed], result))
        loads.extend(_node_loads(placed))
    offline = offline_placement(sequence, nodes, loads)
    if offline is not None:
        result["offline_placement"] = round(offline["unallocated"], 4)
        if result["placement_floor"]:
            result["offline_vs_floor"] = round(
                offline["unallocated"] / result["placement_floor"], 4
            )
    others = [result[f"unallocated_gpu_share_{p}"] for p in policies if p != "default"]
    if "default" in policies and others:
        best = min(others)
        result["unallocated_vs_best_baseline"] = (
            round(result["unallocated_gpu_share_default"] / best, 4) if best else None
        )
        result["placements_per_s"] = result["placements_per_s_default"]
        floor = result["placement_floor"]
        result["default_vs_floor"] = (
            round(result["unallocated_gpu_share_default"] / floor, 4) if floor else None
        )
        result["cpu_time_placements_per_s"] = result["cpu_time_placements_per_s_default"]
    return result
