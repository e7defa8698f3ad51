"""Nodes and jobs for scheduler tests, created directly (the scheduler only reads requests)."""

from __future__ import annotations

import itertools

from django.utils import timezone

from training.models import JobState, Node, NodeKind, TrainingJob
from training.services import job_transition

_seq = itertools.count(1)


def make_node(
    *,
    gpus: int = 0,
    gpu_type: str = "V100",
    cpu_milli: int = 16000,
    memory_mb: int = 65536,
    kind: str = NodeKind.TRAINING,
    name: str | None = None,
    **extra,
) -> Node:
    n = next(_seq)
    name = name or f"node-{n}"
    return Node.objects.create(
        name=name,
        queue=f"agent-{name}-{n}",
        kind=kind,
        cpu_milli=cpu_milli,
        memory_mb=memory_mb,
        gpus=[{"index": i, "type": gpu_type, "memory_mb": 16384} for i in range(gpus)],
        last_heartbeat=timezone.now(),
        **extra,
    )


def make_job(workspace, **fields) -> TrainingJob:
    fields.setdefault("name", f"job-{next(_seq)}")
    fields.setdefault("template", "logreg")
    return TrainingJob.objects.create(workspace=workspace, **fields)


def run_on(job: TrainingJob, node: Node, gpus=()) -> TrainingJob:
    """Put a job straight into running on ``node`` (as if the scheduler and agent had)."""
    job_transition(job=job, to=JobState.ADMITTED)
    job_transition(
        job=job,
        to=JobState.PLACED,
        node=node,
        assigned_gpus=[{"index": i, "milli": m} for i, m in gpus],
    )
    return job_transition(job=job, to=JobState.RUNNING)
