"""From database rows to the placement engine's inventory, and back.

What is free on a node = its allocatable inventory minus the requests of the jobs that hold it:
jobs ``placed`` or ``running`` there (including those asked to stop, until they have stopped),
plus the other workers of gang jobs (``JobScheduling.gang_nodes``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.conf import settings

from training.models import (
    TRAINJOB_LABEL,
    JobState,
    Node,
    NodeKind,
    NodeState,
    PriorityClass,
    TrainingJob,
)
from training.scheduler.placement import (
    Cluster,
    NodeInventory,
    Request,
    TaskClass,
    workload_estimate,
)

HOLDING_STATES = (JobState.PLACED, JobState.RUNNING)


def job_request(job: TrainingJob) -> Request:
    """The placement request of a job (one worker; ``workers`` of them)."""
    types = tuple(t for t in (job.gpu_type or "").split("|") if t)
    if job.gpu_count:
        return Request(job.cpu_milli, job.memory_mb, job.gpu_count, 0, types, job.workers or 1)
    if job.gpu_milli:
        return Request(job.cpu_milli, job.memory_mb, 0, job.gpu_milli, types, job.workers or 1)
    return Request(job.cpu_milli, job.memory_mb, 0, 0, (), job.workers or 1)


def node_gpu_type(node: Node) -> str:
    types = {str(g.get("type", "")) for g in node.gpus or []}
    return types.pop() if len(types) == 1 else "|".join(sorted(types))


def holding_jobs() -> list[TrainingJob]:
    return list(
        TrainingJob.objects.unscoped()
        .filter(state__in=HOLDING_STATES, node__isnull=False)
        .select_related("scheduling")
    )


def worker_allocations(job: TrainingJob) -> list[tuple[int, list[tuple[int, int]]]]:
    """[(node id, [(gpu index, milli)])] for every worker of a holding job."""
    scheduling = getattr(job, "scheduling", None)
    gang = list(getattr(scheduling, "gang_nodes", None) or [])
    if gang:
        return [(int(w["node"]), [(int(g), int(m)) for g, m in w.get("gpus", [])]) for w in gang]
    gpus = [(int(g["index"]), int(g["milli"])) for g in job.assigned_gpus or []]
    return [(job.node_id, gpus)]


def build_cluster(
    nodes: Iterable[Node],
    jobs: Iterable[TrainingJob],
    *,
    workload_jobs: Iterable[TrainingJob] = (),
    workload: Sequence[TaskClass] | None = None,
    pinned: dict[tuple[str, ...], float] | None = None,
    seed: int | None = 0,
) -> tuple[Cluster, dict[int, list[TrainingJob]]]:
    """The free inventory of ``nodes`` after ``jobs``; also the jobs holding each node. The
    target workload is ``workload`` (classes, with the ``pinned`` shares) when given, else the
    one ``workload_jobs`` ask (in arrival order, oldest first)."""
    nodes = list(nodes)
    used_cpu: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    used_gpu: dict[tuple[int, int], int] = defaultdict(int)
    on_node: dict[int, list[TrainingJob]] = defaultdict(list)
    for job in jobs:
        for node_id, gpus in worker_allocations(job):
            used_cpu[node_id] += job.cpu_milli
            used_mem[node_id] += job.memory_mb
            for index, milli in gpus:
                used_gpu[(node_id, index)] += milli
            if job not in on_node[node_id]:
                on_node[node_id].append(job)
    inventory = []
    for node in nodes:
        gpus = sorted(node.gpus or [], key=lambda g: int(g.get("index", 0)))
        inventory.append(
            NodeInventory(
                name=str(node.pk),
                cpu_milli=max(node.cpu_milli - used_cpu[node.pk], 0),
                memory_mb=max(node.memory_mb - used_mem[node.pk], 0),
                gpu_type=node_gpu_type(node),
                gpus=tuple(max(1000 - used_gpu[(node.pk, int(g["index"]))], 0) for g in gpus),
                gpu_indexes=tuple(int(g["index"]) for g in gpus),
            )
        )
    if workload is not None:
        classes = list(workload)
    else:
        classes, pinned = workload_estimate(job_request(j) for j in workload_jobs)
    cluster = Cluster(
        inventory,
        workload=classes,
        pinned=pinned,
        seed=seed,
        slice_pricing=getattr(settings, "SCHEDULER_SLICE_PRICING", True),
    )
    # Capacity (not free) for shares: the node's whole inventory.
    for i, node in enumerate(nodes):
        cluster.cpu_cap[i] = max(node.cpu_milli, 1)
        cluster.mem_cap[i] = max(node.memory_mb, 1)
    return cluster, on_node


def schedulable_nodes(*, include_lending: bool, lock: bool = False) -> list[Node]:
    """Ready training nodes, plus inference nodes currently lending when asked (never the pods
    of a TrainJob). ``lock``: every ready node's row is locked (``SELECT ... FOR UPDATE``, in
    the caller's transaction) by the same query, which serialises capacity accounting between
    concurrent ticks."""
    from training.scheduler.lending import lending_open

    ready = Node.objects.filter(state=NodeState.READY).order_by("pk")
    nodes = []
    for node in ready.select_for_update() if lock else ready:
        if TRAINJOB_LABEL in (node.labels or {}):
            continue  # a TrainJob's pod: it runs that job only (training.trainjobs)
        if node.kind == NodeKind.INFERENCE:
            if include_lending and lending_open(node):
                nodes.append(node)
        else:
            nodes.append(node)
    return nodes


def policy_for(job: TrainingJob) -> str:
    """GPU work: fragmentation-aware; otherwise production spreads and the rest bin-packs."""
    if job.gpu_count or job.gpu_milli:
        return "default"
    if job.priority_class == PriorityClass.PRODUCTION:
        return "spread"
    return "binpack"
