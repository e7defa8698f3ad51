"""Admission: quotas per workspace and GPU type, use first and audit later (A1).

A job that fits its workspace's quotas is admitted as is. A job that would exceed them is admitted
anyway, as preemptible and ``over_quota``, and an event ``scheduler.job.over_quota`` flags it for
the admin console; nobody has to approve it first. Exploration jobs are always preemptible. When a
job's owner opted in, an exploration job's CPU and memory are right-sized from history (T6).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import transaction
from django.utils import timezone

from training.models import JobState, PriorityClass, TrainingJob
from training.scheduler.models import JobScheduling, WorkspaceQuota
from training.services import job_transition
from workspaces.events import Ref, event_record

# Jobs that count against a quota: admitted and holding capacity, and within quota themselves.
COUNTED_STATES = (JobState.ADMITTED, JobState.PLACED, JobState.RUNNING)


def job_usage(job: TrainingJob) -> dict[str, int]:
    workers = max(job.workers or 1, 1)
    return {
        "cpu_milli": job.cpu_milli * workers,
        "memory_mb": job.memory_mb * workers,
        "gpu_milli": (job.gpu_count * 1000 + (0 if job.gpu_count else job.gpu_milli)) * workers,
    }


def _applies(quota_type: str, job: TrainingJob) -> bool:
    if not quota_type:
        return True
    return quota_type in (job.gpu_type or "").split("|")


def workspace_usage(
    workspace_id: int, *, exclude: int | None = None, gpu_types: set[str] | None = None
) -> dict[str, dict]:
    """In-quota usage of a workspace: {gpu type or '': {cpu_milli, memory_mb, gpu_milli}}.

    ``gpu_types``: the quota GPU types to count for (default: those of the workspace's quotas).
    The quota summary (``workspaces.quota``) shows exactly this, so the pages and admission
    agree."""
    usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    jobs = TrainingJob.objects.for_workspace(workspace_id).filter(
        state__in=COUNTED_STATES, over_quota=False
    )
    if exclude:
        jobs = jobs.exclude(pk=exclude)
    if gpu_types is None:
        gpu_types = set(
            WorkspaceQuota.objects.for_workspace(workspace_id).values_list("gpu_type", flat=True)
        )
    types = set(gpu_types)
    for job in jobs:
        _count(usage, job, types)
    return {k: dict(v) for k, v in usage.items()}


def workspaces_usage(gpu_types: dict[int, set[str]]) -> dict[int, dict[str, dict]]:
    """``workspace_usage`` of each workspace id in ``gpu_types`` (the quota GPU types to count
    for it), from one query over all their counted jobs: a list of workspaces costs one read."""
    usage: dict[int, dict[str, dict[str, int]]] = {
        pk: defaultdict(lambda: defaultdict(int)) for pk in gpu_types
    }
    jobs = TrainingJob.objects.for_workspaces(list(gpu_types)).filter(
        state__in=COUNTED_STATES, over_quota=False
    )
    for job in jobs:
        _count(usage[job.workspace_id], job, set(gpu_types[job.workspace_id]))
    return {pk: {k: dict(v) for k, v in by_type.items()} for pk, by_type in usage.items()}


def _count(usage: dict[str, dict[str, int]], job: TrainingJob, types: set[str]) -> None:
    used = job_usage(job)
    for quota_type in types | {""}:
        if _applies(quota_type, job):
            for key, value in used.items():
                usage[quota_type][key] += value


def quota_excess(job: TrainingJob) -> list[str]:
    """What the job would exceed, as readable strings (empty: within quota)."""
    quotas = list(WorkspaceQuota.objects.for_workspace(job.workspace_id))
    if not quotas:
        return []
    usage = workspace_usage(
        job.workspace_id, exclude=job.pk, gpu_types={quota.gpu_type for quota in quotas}
    )
    need = job_usage(job)
    excess = []
    for quota in quotas:
        if not _applies(quota.gpu_type, job):
            continue
        used = usage.get(quota.gpu_type, {})
        label = quota.gpu_type or "all GPU types"
        for key, limit in (
            ("cpu_milli", quota.cpu_milli),
            ("memory_mb", quota.memory_mb),
            ("gpu_milli", quota.gpu_milli),
        ):
            if limit is None or not need[key]:
                continue
            if used.get(key, 0) + need[key] > limit:
                excess.append(f"{key} {used.get(key, 0) + need[key]} > {limit} ({label})")
    return excess


def _auto_recommend_wanted(job: TrainingJob, sched: JobScheduling) -> bool:
    if job.priority_class != PriorityClass.EXPLORATION:
        return False
    options = (job.params or {}).get("scheduler") or {}
    return bool(sched.auto_recommend or options.get("auto_recommend"))


@transaction.atomic
def admit(*, job: TrainingJob, sched: JobScheduling) -> TrainingJob:
    """pending -> admitted, flagging (not blocking) work over quota."""
    fields: dict[str, Any] = {}
    if _auto_recommend_wanted(job, sched):
        from training.scheduler.recommend import recommend

        rec = recommend(workspace=job.workspace, template=job.template, dataset=job.dataset)
        if rec.get("based_on_jobs"):
            fields["cpu_milli"] = rec["cpu_milli"]
            fields["memory_mb"] = rec["memory_mb"]
            sched.recommendation = {**rec, "applied": True}
            job.cpu_milli, job.memory_mb = rec["cpu_milli"], rec["memory_mb"]
    excess = quota_excess(job)
    over = bool(excess)
    preemptible = over or job.priority_class == PriorityClass.EXPLORATION or job.preemptible
    reason = "admitted" if not over else "over quota, admitted as preemptible: " + "; ".join(excess)
    job_transition(
        job=job,
        to=JobState.ADMITTED,
        expect=JobState.PENDING,
        reason=reason,
        over_quota=over,
        preemptible=preemptible,
        **fields,
    )
    if over:
        sched.over_quota = True
        sched.flagged_at = timezone.now()
        sched.reviewed_at = None
        event_record(
            actor=None,
            workspace=job.workspace,
            verb="scheduler.job.over_quota",
            refs=[Ref.to(job)],
            payload={"exceeded": excess, "priority_class": job.priority_class},
        )
    sched.reason = reason
    sched.save()
    return job
