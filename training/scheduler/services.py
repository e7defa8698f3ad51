"""Scheduler writes outside the tick: quotas, audit review, the recommendation opt-in."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from training.models import TrainingJob
from training.scheduler.models import JobScheduling, WorkspaceQuota
from workspaces.events import Ref, event_record


@transaction.atomic
def quota_set(
    *,
    actor,
    workspace,
    gpu_type: str = "",
    cpu_milli: int | None = None,
    memory_mb: int | None = None,
    gpu_milli: int | None = None,
) -> WorkspaceQuota:
    """Create or change a workspace's quota (one per GPU type; blank = all types). Recorded (A2)."""
    quota, created = WorkspaceQuota.objects.for_workspace(workspace).get_or_create(
        workspace=workspace, gpu_type=gpu_type
    )
    before = {
        "cpu_milli": quota.cpu_milli,
        "memory_mb": quota.memory_mb,
        "gpu_milli": quota.gpu_milli,
    }
    quota.cpu_milli, quota.memory_mb, quota.gpu_milli = cpu_milli, memory_mb, gpu_milli
    quota.full_clean()
    quota.save()
    event_record(
        actor=actor,
        workspace=workspace,
        verb="scheduler.quota.set",
        refs=[Ref("workspace_quota", quota.pk, gpu_type or "all GPU types")],
        payload={
            "gpu_type": gpu_type,
            "before": None if created else before,
            "after": {"cpu_milli": cpu_milli, "memory_mb": memory_mb, "gpu_milli": gpu_milli},
        },
    )
    return quota


@transaction.atomic
def over_quota_review(*, actor, scheduling: JobScheduling) -> JobScheduling:
    """An admin has looked at an over-quota job (the audit item is closed)."""
    scheduling.reviewed_at = timezone.now()
    scheduling.reviewed_by = actor
    scheduling.save(update_fields=["reviewed_at", "reviewed_by", "updated_at"])
    event_record(
        actor=actor,
        workspace=scheduling.workspace,
        verb="scheduler.job.over_quota_reviewed",
        refs=[Ref.to(scheduling.job)],
    )
    return scheduling


@transaction.atomic
def auto_recommend_set(*, job: TrainingJob, enabled: bool) -> JobScheduling:
    """Opt a job in (or out) of right-sizing at admission (applies to exploration jobs)."""
    sched, _ = JobScheduling.objects.unscoped().get_or_create(
        job=job, defaults={"workspace_id": job.workspace_id}
    )
    sched.auto_recommend = enabled
    sched.save(update_fields=["auto_recommend", "updated_at"])
    return sched
