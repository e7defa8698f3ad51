"""Scheduler writes outside the tick: quota requests, audit review, the recommendation opt-in.

Quotas themselves are set by ``workspaces.services.quota_set`` (re-exported here).
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from training.models import TrainingJob
from training.scheduler.models import JobScheduling
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.models import QuotaRequest, WorkspaceQuota
from workspaces.services import quota_set  # the one quota's writer, re-exported

__all__ = ["auto_recommend_set", "over_quota_review", "quota_request_decide", "quota_set"]


def _current_storage(quota_request: QuotaRequest) -> int | None:
    """A quota request names CPU, memory and GPUs only: approving it keeps the storage limit."""
    current = (
        WorkspaceQuota.objects.for_workspace(quota_request.workspace_id)
        .filter(gpu_type="")
        .values_list("storage_gb", flat=True)
        .first()
    )
    return current


@transaction.atomic
def quota_request_decide(
    *, actor: Actor, quota_request: QuotaRequest, approve: bool
) -> QuotaRequest:
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
            storage_gb=None if locked.gpu_type else _current_storage(locked),
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
def over_quota_review(*, actor: Actor, scheduling: JobScheduling) -> JobScheduling:
    """An admin has looked at an over-quota job (the audit item is closed)."""
    scheduling.reviewed_at = timezone.now()
    scheduling.reviewed_by = actor_user(actor)
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
