"""Failover (T7, R4): detect lost nodes, isolate them, requeue their jobs, cordon bad nodes.

Three layers: a node whose heartbeat is older than ``NODE_LOST_AFTER`` is marked ``lost`` (no new
work); its placed/running jobs go back to ``pending`` and resume from their last checkpoint on
another node, until ``max_attempts`` is used up, after which they end ``failed`` with the reason.
A node with ``CORDON_AFTER`` node faults (since it was last cordoned) is cordoned; an admin makes
it ready again in the admin console. A job's own failures never cordon a node (see ``_failures``).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from training.models import JobState, Node, NodeState, TrainingJob
from training.scheduler.models import JobScheduling, LendingLease, NodeHealth
from training.services import job_transition
from workspaces.events import Ref, event_record
from workspaces.exceptions import ConflictError

NODE_LOST_AFTER = timedelta(seconds=getattr(settings, "SCHEDULER_NODE_LOST_AFTER_S", 30))
CORDON_AFTER = getattr(settings, "SCHEDULER_CORDON_AFTER_FAILURES", 3)


def _set_node_state(node: Node, state: str, reason: str) -> None:
    Node.objects.filter(pk=node.pk).update(state=state, state_reason=reason[:300])
    node.state, node.state_reason = state, reason[:300]
    event_record(
        actor=None,
        workspace=None,
        verb=f"scheduler.node.{state}",
        refs=[Ref.to(node)],
        payload={"reason": reason},
    )


def requeue_job(job: TrainingJob, reason: str) -> str:
    """placed/running -> pending (or failed once its attempts are used up)."""
    with transaction.atomic():
        locked = TrainingJob.objects.unscoped().select_for_update().get(pk=job.pk)
        if locked.state not in (JobState.PLACED, JobState.RUNNING):
            return locked.state
        LendingLease.objects.unscoped().filter(job=locked, ended_at__isnull=True).update(
            ended_at=timezone.now(), end_reason=reason[:200]
        )
        JobScheduling.objects.unscoped().filter(job=locked).update(
            gang_nodes=[], borrowed=False, reason=reason[:300]
        )
        if locked.attempts >= locked.max_attempts:
            job_transition(
                job=locked,
                to=JobState.FAILED,
                reason=f"{reason}; gave up after {locked.attempts} attempts",
            )
            return JobState.FAILED
        job_transition(
            job=locked,
            to=JobState.PENDING,
            reason=f"{reason}; resumes from step {locked.checkpoint_step}",
            node=None,
            assigned_gpus=[],
            stop_requested="",
        )
        return JobState.PENDING


def reconcile(now=None) -> dict:
    """One reconciler pass: lost nodes, cordons, lending windows, leases, preempted requeue."""
    from training.scheduler.lending import end_finished_leases, reclaim_closed_windows
    from training.scheduler.tick import requeue_preempted

    now = now or timezone.now()
    summary = {"lost": 0, "recovered": 0, "requeued": 0, "failed": 0, "cordoned": 0}
    stale = now - NODE_LOST_AFTER
    for node in Node.objects.exclude(state=NodeState.LOST).filter(last_heartbeat__lt=stale):
        with transaction.atomic():
            _set_node_state(node, NodeState.LOST, f"no heartbeat since {node.last_heartbeat}")
        summary["lost"] += 1
    for node in Node.objects.filter(state=NodeState.LOST, last_heartbeat__gte=stale):
        if _failures(node, now) < CORDON_AFTER:
            with transaction.atomic():
                _set_node_state(node, NodeState.READY, "heartbeat resumed")
            summary["recovered"] += 1
    lost = Node.objects.filter(state=NodeState.LOST)
    for job in TrainingJob.objects.unscoped().filter(
        state__in=(JobState.PLACED, JobState.RUNNING), node__in=lost
    ):
        try:
            outcome = requeue_job(job, f"node {job.node.name} lost")
        except ConflictError:
            continue
        summary["failed" if outcome == JobState.FAILED else "requeued"] += 1
    for node in Node.objects.filter(state=NodeState.READY):
        failures = _failures(node, now)
        if failures >= CORDON_AFTER:
            with transaction.atomic():
                _set_node_state(
                    node, NodeState.CORDONED, f"{failures} job failures since last cleared"
                )
                NodeHealth.objects.update_or_create(
                    node=node,
                    defaults={"acknowledged_failures": node.failure_count, "cordoned_at": now},
                )
            summary["cordoned"] += 1
    summary["reclaimed"] = reclaim_closed_windows(now)
    summary["leases_ended"] = end_finished_leases()
    summary["requeued"] += requeue_preempted()
    return summary


def _failures(node: Node, now) -> int:
    """Node faults since the node was last cordoned: the agent's counter beyond what was
    acknowledged. The counter grows only for faults of the node itself (the agent could not
    prepare, stage or start a child: disk, permissions, devices), never for a job that failed on
    its own (an exception, an exit code, the kernel's OOM killer): one tenant's failing job must
    not take a shared node away from every workspace."""
    health = NodeHealth.objects.filter(node=node).first()
    acknowledged = health.acknowledged_failures if health is not None else 0
    return max(int(node.failure_count or 0) - acknowledged, 0)
