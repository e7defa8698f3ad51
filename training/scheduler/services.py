"""Scheduler writes outside the tick: quotas, audit review, the recommendation opt-in."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from training.models import TrainingJob
from training.scheduler.models import JobScheduling, WorkspaceQuota
from workspaces.events import Ref, event_record
from workspaces.models import QuotaRequest


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
    """Create or change a workspace's quota (one per GPU type; blank = all types). Recorded (A2).

    Only platform admins (superusers) or the platform itself (``actor=None``) change quotas."""
    if actor is not None and getattr(actor, "is_authenticated", False) and not actor.is_superuser:
        raise PermissionDenied("Quotas are changed by platform admins only.")
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
def quota_request_decide(*, actor, quota_request: QuotaRequest, approve: bool) -> QuotaRequest:
    """A platform admin approves (the quota is set as asked) or rejects a pending quota
    request; both are recorded. A request that was already decided is left as it is."""
    if not (actor is not None and actor.is_superuser):
        raise PermissionDenied("Quota requests are decided by platform admins only.")
    locked = QuotaRequest.objects.unscoped().select_for_update().get(pk=quota_request.pk)
    if locked.status != QuotaRequest.Status.PENDING:
        return locked
    if approve:
        quota_set(
            actor=actor,
            workspace=locked.workspace,
            gpu_type=locked.gpu_type,
            cpu_milli=locked.cpu_milli,
            memory_mb=locked.memory_mb,
            gpu_milli=locked.gpu_milli,
        )
    locked.status = QuotaRequest.Status.APPROVED if approve else QuotaRequest.Status.REJECTED
    locked.decided_by, locked.decided_at = actor, timezone.now()
    locked.save(update_fields=["status", "decided_by", "decided_at"])
    event_record(
        actor=actor,
        workspace=locked.workspace,
        verb=f"quota_request.{locked.status}",
        refs=[Ref("quota_request", locked.pk, locked.gpu_type or "all GPU types")],
        payload={"requested_by": locked.requested_by.username if locked.requested_by else ""},
    )
    return locked


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
