"""Scheduler state beyond the job row (see training.models for Node and TrainingJob).

The job row stays the source of truth for a job's lifecycle; these tables hold what only the
scheduler needs: the per-job scheduling record (queue reason, over-quota audit flag, lending,
recommendation) and leases of borrowed inference capacity. The quota (per workspace and GPU type)
is ``workspaces.models.WorkspaceQuota``, the one quota the platform has; it is re-exported here
for the scheduler's readers.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.models import Node, TrainingJob
from workspaces.models import WorkspaceOwnedCascade, WorkspaceQuota

__all__ = [
    "JobScheduling",
    "LendingLease",
    "ManagedNode",
    "NodeHealth",
    "NodeLending",
    "OverQuotaJob",
    "WorkspaceQuota",
]


class JobScheduling(WorkspaceOwnedCascade):
    """The scheduler's record of one job: why it waits, where it runs, whether it is flagged."""

    job = models.OneToOneField(TrainingJob, on_delete=models.CASCADE, related_name="scheduling")
    reason = models.CharField(max_length=300, blank=True, help_text="Why the job waits or runs.")
    policy = models.CharField(max_length=20, blank=True, help_text="Placement policy used.")
    placements = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    gang_nodes = models.JSONField(
        default=list, blank=True, help_text="Gang jobs: [{node, gpus}] for every worker."
    )
    over_quota = models.BooleanField(default=False)
    flagged_at = models.DateTimeField(null=True, blank=True)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    borrowed = models.BooleanField(default=False, help_text="Runs on lent inference capacity.")
    auto_recommend = models.BooleanField(
        default=False, help_text="Exploration jobs: apply the recommended resources at admission."
    )
    recommendation = models.JSONField(default=dict, blank=True)
    victims = models.JSONField(
        default=list, blank=True, help_text="Jobs being preempted to make room for this one."
    )
    last_tick_at = models.DateTimeField(null=True, blank=True)
    trainjob = models.CharField(
        max_length=63,
        blank=True,
        help_text="TRAINING_BACKEND=kueue: the TrainJob the job runs as (training.trainjobs).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-job_id"]
        indexes = [models.Index(fields=["over_quota", "reviewed_at"])]

    def __str__(self) -> str:
        return f"scheduling of job {self.job_id}"


class OverQuotaJob(JobScheduling):
    """The admin console's audit list: jobs admitted over their workspace's quota."""

    class Meta:
        proxy = True
        verbose_name = "over-quota job (audit)"
        verbose_name_plural = "over-quota jobs (audit)"


class LendingLease(WorkspaceOwnedCascade):
    """An exploration job running on an inference node's idle capacity, from start to give-back."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="+")
    gpu_milli = models.PositiveIntegerField(default=0)
    cpu_milli = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"lease of {self.node_id} to job {self.job_id}"


class NodeLending(models.Model):
    """Per inference node: until when lending is off after serving reclaimed the capacity."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="lending")
    reclaimed_until = models.DateTimeField(null=True, blank=True)
    reclaim_reason = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"lending of {self.node_id}"


class NodeHealth(models.Model):
    """Per node: the failures already acted on, so that a node made ready again by an admin is
    cordoned again only after new failures (``Node.failure_count`` only grows)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="health")
    acknowledged_failures = models.PositiveIntegerField(default=0)
    cordoned_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"health of {self.node_id}"


class ManagedNode(Node):
    """Nodes as the scheduler's admin console manages them: kind, lending windows, cordons."""

    class Meta:
        proxy = True
        verbose_name = "node"
        verbose_name_plural = "nodes"
