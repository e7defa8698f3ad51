"""Reads for the queue view, the API and the cluster view.

``quota_summary`` is ``workspaces.quota.quota_summary`` (the one quota with live usage, from
``workspaces_usage_now`` below), re-exported for the scheduler's views.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Sum

from features.models import Batch
from training.models import PRIORITY_RANK, JobState, Node, NodeKind, NodeState, TrainingJob
from training.scheduler.admission import job_usage, workspaces_usage
from training.scheduler.floor import placement_floor
from training.scheduler.inventory import build_cluster, holding_jobs, job_request, node_gpu_type
from training.scheduler.models import JobScheduling
from training.scheduler.placement import Cluster, NodeInventory
from workspaces.models import Workspace
from workspaces.quota import Usage, quota_summary

QUEUE_STATES = (
    JobState.PENDING,
    JobState.ADMITTED,
    JobState.PLACED,
    JobState.RUNNING,
    JobState.PREEMPTED,
)
WAITING = (JobState.PENDING, JobState.ADMITTED, JobState.PREEMPTED)

__all__ = [
    "cluster_overview",
    "queue_of",
    "quota_summary",
    "quotas_of",
    "workspaces_usage_now",
]


def _reason(job: TrainingJob, sched: JobScheduling | None) -> str:
    if job.state == JobState.PENDING and not sched:
        return "waiting for the next scheduler tick"
    if job.state == JobState.RUNNING and job.stop_requested:
        return f"stopping ({job.stop_requested}): checkpointing"
    if job.state == JobState.RUNNING:
        text = f"running on {job.node.name}" if job.node else "running"
        if job.over_quota:
            text += "; over quota, running preemptible"
        if sched and sched.borrowed:
            text += " (borrowed inference capacity)"
        return text
    if job.state == JobState.PREEMPTED:
        return f"preempted at step {job.checkpoint_step}; requeued at the next tick"
    return (sched.reason if sched else "") or job.state_reason or job.state


def queue_of(*, workspace: Workspace) -> list[dict[str, Any]]:
    """The workspace's active jobs in scheduling order, with positions for the waiting ones."""
    jobs = list(
        TrainingJob.objects.for_workspace(workspace)
        .filter(state__in=QUEUE_STATES)
        .select_related("node")
        .order_by("created_at", "id")
    )
    scheds = {
        s.job_id: s
        for s in JobScheduling.objects.for_workspace(workspace).filter(
            job_id__in=[j.pk for j in jobs]
        )
    }
    waiting = sorted(
        (j for j in jobs if j.state in WAITING),
        key=lambda j: (-PRIORITY_RANK[j.priority_class], j.created_at, j.pk),
    )
    position = {j.pk: i + 1 for i, j in enumerate(waiting)}
    rows = []
    for job in sorted(jobs, key=lambda j: (j.state not in WAITING, position.get(j.pk, 0), j.pk)):
        sched = scheds.get(job.pk)
        rows.append(
            {
                "id": job.pk,
                "name": job.name,
                "state": job.state,
                "priority_class": job.priority_class,
                "position": position.get(job.pk),
                "request": job_request(job).describe(),
                "cpu_milli": job.cpu_milli,
                "memory_mb": job.memory_mb,
                "gpu_count": job.gpu_count,
                "gpu_milli": job.gpu_milli,
                "gpu_type": job.gpu_type,
                "workers": job.workers,
                "node": job.node.name if job.node else None,
                "over_quota": job.over_quota,
                "preemptible": job.preemptible,
                "borrowed": bool(sched and sched.borrowed),
                "preemptions": sched.preemptions if sched else 0,
                "reason": _reason(job, sched),
                "created_at": job.created_at,
            }
        )
    return rows


def workspaces_usage_now(
    workspaces: Iterable[Workspace], gpu_types: dict[int, set[str]]
) -> dict[int, Usage]:
    """The quota's usage provider (registered in ``SchedulerConfig.ready``): CPU, memory and GPU
    held by each workspace's in-quota jobs, counted exactly as admission counts them
    (``admission.workspace_usage``), and the bytes of its feature batches (``Batch.bytes``, the
    stored size of every accepted push). Dataset files are not counted: their size is not kept
    on the row. Two queries for any number of workspaces (the API lists many)."""
    ids = [workspace.pk for workspace in workspaces]
    stored = dict(
        Batch.objects.for_workspaces(ids)
        .values("workspace_id")
        .annotate(total=Sum("bytes"))
        .values_list("workspace_id", "total")
        .order_by()
    )
    by_type = workspaces_usage({pk: gpu_types.get(pk, set()) for pk in ids})
    return {
        pk: Usage(by_gpu_type=by_type[pk], storage_bytes=int(stored.get(pk) or 0)) for pk in ids
    }


def quotas_of(*, workspace: Workspace) -> list[dict[str, Any]]:
    """One row per quota of the workspace (per GPU type) with what it uses of it."""
    return quota_summary(workspace=workspace)["rows"]


def cluster_overview() -> dict[str, Any]:
    """Every node with its inventory, per-GPU allocation and fragmentation (staff view)."""
    nodes = list(Node.objects.order_by("kind", "name"))
    holding = holding_jobs()
    recent = list(TrainingJob.objects.unscoped().order_by("-created_at")[:500])
    cluster, on_node = build_cluster(nodes, holding, workload_jobs=reversed(recent))
    frag = (
        cluster.fragmentation_of(cluster.free, cluster.cpu, cluster.mem, cluster.typ)
        if len(nodes)
        else []
    )
    rows = []
    for i, node in enumerate(nodes):
        gpus = []
        for slot, g in enumerate(sorted(node.gpus or [], key=lambda g: int(g.get("index", 0)))):
            free = int(cluster.free[i, slot])
            gpus.append(
                {
                    "index": int(g.get("index", slot)),
                    "type": g.get("type", ""),
                    "allocated_milli": 1000 - free,
                    "hue": int(120 - 120 * (1000 - free) / 1000),
                }
            )
        jobs = on_node.get(node.pk, [])
        rows.append(
            {
                "node": node,
                "gpus": gpus,
                "cpu_used": node.cpu_milli - int(cluster.cpu[i]),
                "memory_used": node.memory_mb - int(cluster.mem[i]),
                "jobs": [
                    {"id": j.pk, "name": j.name, "workspace": j.workspace_id, **job_usage(j)}
                    for j in jobs
                ],
                "fragmentation_milli": round(float(frag[i]), 1) if len(nodes) else 0.0,
            }
        )
    capacity = cluster.gpu_capacity_milli if len(nodes) else 0
    return {
        "nodes": rows,
        "gpu_capacity": capacity // 1000,
        "gpu_allocated": (capacity - cluster.gpu_free_milli) / 1000 if len(nodes) else 0,
        "fragmentation_share": round(cluster.fragmentation(), 4) if capacity else 0.0,
        "inference_nodes": sum(1 for n in nodes if n.kind == NodeKind.INFERENCE),
        "slice_costs": slice_costs(cluster) if len(nodes) else [],
        "floor": floor_now(nodes, holding),
    }


def floor_now(nodes: list[Node], holding: list[TrainingJob]) -> dict[str, Any]:
    """What the cluster leaves idle now beside the least any placement could: the placement
    floor (``floor.placement_floor``) of the jobs running or waiting on the ready nodes' full
    capacity. ``gap`` is idle now minus the floor, in GPUs."""
    ready = [n for n in nodes if n.state == NodeState.READY and n.gpus]
    waiting = list(
        TrainingJob.objects.unscoped().filter(
            state__in=[JobState.PENDING, JobState.ADMITTED, JobState.PREEMPTED]
        )
    )
    full = [
        NodeInventory(str(n.pk), n.cpu_milli, n.memory_mb, node_gpu_type(n), (1000,) * len(n.gpus))
        for n in ready
    ]
    ready_ids = {n.pk for n in ready}
    running = [j for j in holding if j.node_id in ready_ids]
    result = placement_floor([job_request(j) for j in running + waiting], full)
    capacity = result["capacity_milli"]
    used = sum(job_usage(j)["gpu_milli"] for j in running)
    idle = max(capacity - used, 0) / capacity if capacity else 0.0
    return {
        "gpus": capacity // 1000,
        "jobs_running": len(running),
        "jobs_waiting": len(waiting),
        "demand_gpu": result["demand_milli"] / 1000,
        "idle_share": round(idle, 4),
        "floor_share": round(result["floor"], 4) if capacity else 0.0,
        "idle_pct": round(idle * 100, 2),
        "floor_pct": round(result["floor"] * 100, 2) if capacity else 0.0,
        "gap_gpu": round((idle - result["floor"]) * capacity / 1000, 2) if capacity else 0.0,
    }


def slice_costs(cluster: Cluster) -> list[dict[str, Any]]:
    """What each GPU slice size of the recent workload costs under an optimal packing.

    ``cost_gpu`` is the size's price (the share of a GPU it takes, leftovers nothing fits
    included) and ``idle_gpu`` what of that stays idle: a 0.81 slice that nothing common fits
    beside costs a whole GPU, 0.19 of it idle. Empty when slice pricing is off.
    """
    if not cluster.slice_pricing:
        return []
    prices = cluster.prices
    return [
        {
            "size_gpu": size / 1000,
            "cost_gpu": round(prices.price[size], 3),
            "idle_gpu": round(max(prices.price[size] - size / 1000, 0.0), 3),
        }
        for size in prices.sizes
    ]
