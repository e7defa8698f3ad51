"""The live scheduler tick: admit, place, preempt, dispatch.

The workload's slice prices (a linear program) are solved before the tick takes any lock.

Concurrency: pending/admitted jobs are taken with ``SELECT ... FOR UPDATE SKIP LOCKED`` so two
ticks never work on the same job, and the ready node rows are then locked (plain ``FOR UPDATE``)
so the capacity accounting of two ticks is serialised: the second one reads the first one's
placements after it commits. On SQLite (no row locks) an in-process lock serialises ticks.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, IntegerField, Value, When
from django.utils import timezone

from training import trainjobs
from training.models import (
    PRIORITY_RANK,
    JobState,
    Node,
    NodeKind,
    PriorityClass,
    TrainingJob,
)
from training.scheduler.admission import admit
from training.scheduler.inventory import (
    HOLDING_STATES,
    build_cluster,
    holding_jobs,
    job_request,
    policy_for,
    schedulable_nodes,
    worker_allocations,
)
from training.scheduler.models import JobScheduling, LendingLease
from training.scheduler.placement import (
    Cluster,
    Placement,
    TaskClass,
    slice_prices,
    slice_shares,
    workload_estimate,
)
from training.services import job_request_stop, job_transition
from workspaces.exceptions import ConflictError

log = logging.getLogger(__name__)
_sqlite_lock = threading.Lock()

RANK_ORDER = Case(
    *[When(priority_class=cls, then=Value(rank)) for cls, rank in PRIORITY_RANK.items()],
    default=Value(0),
    output_field=IntegerField(),
)


def scheduling_of(job: TrainingJob) -> JobScheduling:
    sched, _ = JobScheduling.objects.unscoped().get_or_create(
        job=job, defaults={"workspace_id": job.workspace_id}
    )
    return sched


def schedule_tick(*, limit: int = 100) -> dict[str, Any]:
    """One pass over waiting jobs, highest priority first, oldest first. Returns counts."""
    summary: Counter = Counter()
    summary["requeued"] = requeue_preempted()
    handover: list[int] = []  # TRAINING_BACKEND=kueue: admitted jobs with no TrainJob yet
    if connection.vendor == "sqlite":
        with _sqlite_lock:
            dispatch = _tick(limit, summary, handover)
    else:
        dispatch = _tick(limit, summary, handover)
    for job_id, queue in dispatch:
        if _dispatch(job_id, queue):
            summary["dispatched"] += 1
    if trainjobs.enabled():
        # The cluster is called after the tick's transaction: no row lock waits on it.
        summary.update(trainjobs.sync(handover))
    return dict(summary)


def _dispatch(job_id: int, queue: str) -> bool:
    try:
        from training.tasks import run_job
    except ImportError:  # the node agent is not installed (yet): the job stays placed
        log.warning("training.tasks.run_job is missing; job %s stays placed", job_id)
        return False
    run_job.apply_async(args=[job_id], queue=queue)
    return True


def _workload() -> tuple[list[TaskClass], dict[tuple[str, ...], float]]:
    """The target workload (estimated from the 500 newest requests) and its slice prices,
    before any lock: the prices are a linear program over the workload alone
    (``placement.SlicePrices``), and solving it here leaves the locked part of the tick with a
    cache hit."""
    recent = list(
        TrainingJob.objects.unscoped()
        .order_by("-created_at")
        .only("cpu_milli", "memory_mb", "gpu_count", "gpu_milli", "gpu_type", "workers")[:500]
    )
    # Oldest first: the estimate weighs the newest arrivals most (WorkloadEstimator).
    classes, pinned = workload_estimate(job_request(j) for j in reversed(recent))
    if getattr(settings, "SCHEDULER_SLICE_PRICING", True):
        slice_prices(slice_shares(classes))
    return classes, pinned


def _tick(limit: int, summary: Counter, handover: list[int]) -> list[tuple[int, str]]:
    dispatch: list[tuple[int, str]] = []
    workload, pinned = _workload()
    with transaction.atomic():
        jobs = list(
            TrainingJob.objects.unscoped()
            .select_for_update(skip_locked=True)
            .filter(state__in=[JobState.PENDING, JobState.ADMITTED])
            .alias(rank=RANK_ORDER)
            .order_by("-rank", "created_at", "id")[:limit]
        )
        if not jobs:
            return dispatch
        # Locks every ready node: capacity accounting is serialised between concurrent ticks.
        nodes = schedulable_nodes(include_lending=True, lock=True)
        holding = holding_jobs()
        cluster, on_node = build_cluster(nodes, holding, workload=workload, pinned=pinned)
        inference = np.array([n.kind == NodeKind.INFERENCE for n in nodes], dtype=bool)
        now = timezone.now()
        for job in jobs:
            sched = scheduling_of(job)
            sched.last_tick_at = now
            seen = (sched.reason, list(sched.victims))
            if job.state == JobState.PENDING:
                try:
                    admit(job=job, sched=sched)
                except ConflictError:
                    continue
                summary["admitted"] += 1
            if trainjobs.enabled():
                # Kueue places it: the job runs on its TrainJob's pods once they are all up.
                placed = _place_on_trainjob(job, sched)
                if placed is not None:
                    summary["placed"] += 1
                    dispatch.append(placed)
                    continue
                summary["waiting"] += 1
                if not sched.trainjob:
                    handover.append(job.pk)
                sched.save()
                continue
            placed = _try_place(job, sched, cluster, nodes, inference)
            if placed is not None:
                summary["placed"] += 1
                dispatch.append(placed)
                continue
            summary["waiting"] += 1
            if _try_preempt(job, sched, cluster, nodes, on_node, inference):
                summary["preempting"] += 1
            if (sched.reason, list(sched.victims)) != seen:
                sched.save()  # waiting jobs are written only when their story changes
    return dispatch


def _allowed_mask(job: TrainingJob, inference: np.ndarray) -> np.ndarray | None:
    """Only exploration jobs may borrow inference nodes (tidal lending)."""
    if job.priority_class == PriorityClass.EXPLORATION:
        return None
    return ~inference


def _try_place(job, sched, cluster: Cluster, nodes: list[Node], inference) -> tuple | None:
    req = job_request(job)
    policy = policy_for(job)
    placements = cluster.place(req, policy, _allowed_mask(job, inference))
    if placements is None:
        return None
    first = nodes[placements[0].node]
    gang = [{"node": nodes[p.node].pk, "gpus": [[g, m] for g, m in p.gpus]} for p in placements]
    borrowed = any(inference[p.node] for p in placements)
    reason = f"placed on {first.name}" + (" (borrowed inference capacity)" if borrowed else "")
    if job.over_quota:
        reason += "; over quota, running preemptible"
    try:
        job_transition(
            job=job,
            to=JobState.PLACED,
            expect=JobState.ADMITTED,
            reason=reason,
            node=first,
            # The primary node's GPUs, every worker's there (its ranks run on that node).
            assigned_gpus=[
                {"index": g, "milli": m}
                for p in placements
                if p.node == placements[0].node
                for g, m in p.gpus
            ],
            stop_requested="",
            payload={"policy": policy, "workers": len(placements), "borrowed": borrowed},
        )
    except ConflictError:
        for p in placements:
            cluster.release(p, req)
        return None
    sched.reason = reason
    sched.policy = policy
    sched.placements += 1
    sched.gang_nodes = gang if len(placements) > 1 else []
    sched.borrowed = borrowed
    sched.victims = []
    sched.save()
    for p in placements:
        if inference[p.node]:
            LendingLease.objects.create(
                workspace_id=job.workspace_id,
                node=nodes[p.node],
                job=job,
                gpu_milli=sum(m for _, m in p.gpus),
                cpu_milli=job.cpu_milli,
            )
    return (job.pk, first.queue)


def _place_on_trainjob(job: TrainingJob, sched: JobScheduling) -> tuple[int, str] | None:
    """Place ``job`` on the nodes its TrainJob's pods registered, one worker per pod, once there
    are as many as it has workers; None while Kueue has not started them all."""
    workers = max(int(job.workers or 1), 1)
    nodes = trainjobs.nodes_for(job)[:workers]
    if len(nodes) < workers:
        if sched.trainjob:
            sched.reason = (
                f"waiting for Kueue to start {trainjobs.describe(job)}: "
                f"{len(nodes)} of {workers} pods ready"
            )[:300]
        return None
    wants_gpus = bool(job.gpu_count or job.gpu_milli)
    # Each pod sees the GPUs Kubernetes gave it, and only those: the worker takes them all.
    gpus: list[list[list[int]]] = [
        [[int(g.get("index", i)), 1000] for i, g in enumerate(node.gpus or [])]
        if wants_gpus
        else []
        for node in nodes
    ]
    gang = [{"node": node.pk, "gpus": held} for node, held in zip(nodes, gpus, strict=True)]
    reason = f"started by Kueue: {trainjobs.describe(job)}, on {', '.join(n.name for n in nodes)}"
    try:
        job_transition(
            job=job,
            to=JobState.PLACED,
            expect=JobState.ADMITTED,
            reason=reason[:300],
            node=nodes[0],
            assigned_gpus=[{"index": g, "milli": m} for g, m in gpus[0]],
            stop_requested="",
            payload={"policy": "kueue", "workers": workers, "trainjob": trainjobs.name(job)},
        )
    except ConflictError:
        return None
    sched.reason = reason[:300]
    sched.policy = "kueue"
    sched.placements += 1
    sched.gang_nodes = gang if workers > 1 else []
    sched.borrowed = False
    sched.victims = []
    sched.save()
    return (job.pk, nodes[0].queue)


def _victim_ok(job: TrainingJob, victim: TrainingJob) -> bool:
    """Whether ``victim`` may be evicted for ``job``: strictly lower class, or the same class
    admitted over quota (preemptible) when ``job`` is within quota. Production is never evicted
    by a lower class."""
    if victim.stop_requested or victim.pk == job.pk:
        return False
    if victim.priority_rank < job.priority_rank:
        return True
    return (
        victim.priority_rank == job.priority_rank
        and victim.over_quota
        and victim.preemptible
        and not job.over_quota
    )


def _victim_cost(victim: TrainingJob) -> float:
    """Cheapest first: lower class, less progress lost since the last checkpoint, smaller."""
    lost = max(int(victim.step or 0) - int(victim.checkpoint_step or 0), 0)
    size = (victim.gpu_count * 1000 + victim.gpu_milli) * max(victim.workers, 1)
    return victim.priority_rank * 1e9 + lost * 1e3 + size + victim.cpu_milli / 1000


def _try_preempt(job, sched, cluster: Cluster, nodes, on_node, inference) -> bool:
    req = job_request(job)
    sched.reason = cluster.why_not(req)
    if job.over_quota:
        sched.reason += "; over quota, will run preemptible"
    # Victims already asked to stop for this job: wait for them, do not evict more.
    if sched.victims:
        still = TrainingJob.objects.unscoped().filter(
            pk__in=sched.victims, state__in=HOLDING_STATES
        )
        if still.exists():
            sched.reason = f"waiting for {still.count()} preempted job(s) to checkpoint and exit"
            return False
        sched.victims = []
    if req.workers > 1:
        return False  # gangs wait for capacity rather than evict across nodes
    allowed = _allowed_mask(job, inference)
    best: tuple[float, int, list[TrainingJob]] | None = None
    for i, node in enumerate(nodes):
        if allowed is not None and not allowed[i]:
            continue
        victims = sorted(
            (
                v
                for v in on_node.get(node.pk, [])
                if _victim_ok(job, v) and len(worker_allocations(v)) == 1
            ),
            key=_victim_cost,
        )
        if not victims:
            continue
        released: list[tuple[Placement, Any]] = []
        chosen: list[TrainingJob] = []
        fits = False
        for v in victims:
            p = Placement(i, str(node.pk), worker_allocations(v)[0][1])
            vreq = job_request(v)
            cluster.release(p, vreq)
            released.append((p, vreq))
            chosen.append(v)
            if cluster.feasible(req)[i]:
                fits = True
                break
        for p, vreq in reversed(released):
            cluster.allocate(p, vreq)
        if fits:
            cost = sum(_victim_cost(v) for v in chosen)
            if best is None or cost < best[0]:
                best = (cost, i, chosen)
    if best is None:
        return False
    _, i, chosen = best
    for victim in chosen:
        job_request_stop(
            job=victim,
            mode="preempt",
            reason=f"preempted for {job.priority_class} job {job.name} #{job.pk}",
        )
        victim_sched = scheduling_of(victim)
        victim_sched.preemptions += 1
        victim_sched.reason = f"preempted for job #{job.pk}; checkpointing"
        victim_sched.save()
    sched.victims = [v.pk for v in chosen]
    sched.reason = f"preempting {len(chosen)} lower-priority job(s) on {nodes[i].name}"
    return True


def requeue_preempted(*, limit: int = 200) -> int:
    """Preempted jobs go back to pending; they resume from their checkpoint when placed."""
    count = 0
    ids = list(
        TrainingJob.objects.unscoped()
        .filter(state=JobState.PREEMPTED)
        .values_list("pk", flat=True)[:limit]
    )
    for pk in ids:
        with transaction.atomic():
            job = (
                TrainingJob.objects.unscoped()
                .select_for_update(skip_locked=True)
                .filter(pk=pk, state=JobState.PREEMPTED)
                .first()
            )
            if job is None:
                continue
            _end_leases(job, "preempted")
            job_transition(
                job=job,
                to=JobState.PENDING,
                expect=JobState.PREEMPTED,
                reason=f"requeued after preemption; resumes from step {job.checkpoint_step}",
                node=None,
                assigned_gpus=[],
                stop_requested="",
            )
            sched = scheduling_of(job)
            sched.reason = f"requeued after preemption (checkpoint at step {job.checkpoint_step})"
            sched.gang_nodes = []
            sched.borrowed = False
            sched.save()
            count += 1
    return count


def _end_leases(job: TrainingJob, why: str) -> None:
    LendingLease.objects.unscoped().filter(job=job, ended_at__isnull=True).update(
        ended_at=timezone.now(), end_reason=why
    )
