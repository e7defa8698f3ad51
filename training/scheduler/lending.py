"""Tidal lending (T8): inference nodes lend idle capacity to exploration jobs in their windows.

A node lends while it is ready, inside one of its ``lending_windows`` (UTC) and not reclaimed
recently. When a window ends (the reconciler notices) or serving calls ``reclaim_node`` because
its load rises, the borrowed jobs are preempted with a checkpoint and requeued; they resume later
on training nodes or on the next window.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from training.models import JobState, Node, NodeKind
from training.scheduler.models import LendingLease, NodeLending
from training.services import job_request_stop
from workspaces.events import Ref, event_record
from workspaces.exceptions import ConflictError

RECLAIM_HOLD = timedelta(seconds=getattr(settings, "SCHEDULER_RECLAIM_HOLD_S", 1800))


def _hhmm(text: str) -> time:
    hours, minutes = (int(p) for p in str(text).split(":")[:2])
    if hours == 24:
        return time(23, 59, 59, 999999)
    return time(hours, minutes)


def in_window(windows: list[dict], now: datetime) -> bool:
    """Whether ``now`` (UTC) falls in one of the windows; an end before the start wraps midnight
    (the window then belongs to the day it starts on)."""
    now = now.astimezone(UTC) if timezone.is_aware(now) else now
    for window in windows or []:
        days = set(window.get("days", range(7)))
        start, end = _hhmm(window.get("start", "00:00")), _hhmm(window.get("end", "24:00"))
        t, today, yesterday = now.time(), now.weekday(), (now.weekday() - 1) % 7
        if start <= end:
            if today in days and start <= t < end:
                return True
        else:
            if today in days and t >= start:
                return True
            if yesterday in days and t < end:
                return True
    return False


def lending_open(node: Node, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    if node.kind != NodeKind.INFERENCE or not in_window(node.lending_windows, now):
        return False
    hold = NodeLending.objects.filter(node=node).values_list("reclaimed_until", flat=True).first()
    return hold is None or hold <= now


@transaction.atomic
def reclaim_node(*, node: Node, reason: str, hold: timedelta | None = None) -> int:
    """Give an inference node back to serving: preempt (with checkpoint) every borrowed job on it
    and stop lending it for ``hold`` (default 30 minutes). Returns the number of jobs preempted."""
    now = timezone.now()
    NodeLending.objects.update_or_create(
        node=node,
        defaults={"reclaimed_until": now + (hold or RECLAIM_HOLD), "reclaim_reason": reason[:200]},
    )
    count = 0
    leases = LendingLease.objects.unscoped().filter(node=node, ended_at__isnull=True)
    for lease in leases.select_related("job"):
        job = lease.job
        if job.state in (JobState.PLACED, JobState.RUNNING) and job.node_id == node.pk:
            try:
                job_request_stop(job=job, mode="preempt", reason=f"lending reclaimed: {reason}")
                count += 1
            except ConflictError:
                pass
        lease.ended_at = now
        lease.end_reason = f"reclaimed: {reason}"[:200]
        lease.save(update_fields=["ended_at", "end_reason"])
    event_record(
        actor=None,
        workspace=None,
        verb="scheduler.node.reclaimed",
        refs=[Ref.to(node)],
        payload={"reason": reason, "preempted": count},
    )
    return count


def reclaim_closed_windows(now: datetime | None = None) -> int:
    """Reconciler: reclaim inference nodes whose lending window has ended."""
    now = now or timezone.now()
    count = 0
    node_ids = set(
        LendingLease.objects.unscoped()
        .filter(ended_at__isnull=True)
        .values_list("node_id", flat=True)
    )
    for node in Node.objects.filter(pk__in=node_ids):
        if not in_window(node.lending_windows, now):
            count += reclaim_node(node=node, reason="lending window ended", hold=timedelta(0))
    return count


def end_finished_leases() -> int:
    """Leases of jobs that no longer hold the node (finished, failed, preempted, moved)."""
    now = timezone.now()
    ended = 0
    for lease in (
        LendingLease.objects.unscoped().filter(ended_at__isnull=True).select_related("job")
    ):
        job = lease.job
        if job.state not in (JobState.PLACED, JobState.RUNNING) or job.node_id != lease.node_id:
            lease.ended_at = now
            lease.end_reason = f"job {job.state}"
            lease.save(update_fields=["ended_at", "end_reason"])
            ended += 1
    return ended


def utilisation(*, days: int = 7, now: datetime | None = None) -> dict:
    """Inference GPU (and CPU) utilisation over the last ``days``, without and with lending.

    Without lending the scheduler puts nothing on inference nodes, so their training use is what
    serving itself reports in ``node.labels["serving_gpu_share"]`` (0 when unknown); with lending
    the borrowed GPU-hours from the leases are added.
    """
    now = now or timezone.now()
    since = now - timedelta(days=days)
    nodes = list(Node.objects.filter(kind=NodeKind.INFERENCE))
    hours = days * 24.0
    gpu_capacity_h = sum(n.gpu_count for n in nodes) * hours
    cpu_capacity_h = sum(n.cpu_milli / 1000 for n in nodes) * hours
    serving_gpu_h = sum(
        float((n.labels or {}).get("serving_gpu_share", 0) or 0) * n.gpu_count * hours
        for n in nodes
    )
    borrowed_gpu_h = borrowed_cpu_h = 0.0
    leases = LendingLease.objects.unscoped().filter(node__in=nodes).exclude(ended_at__lt=since)
    per_node: dict[int, float] = {}
    for lease in leases:
        start = max(lease.started_at, since)
        end = lease.ended_at or now
        h = max((end - start).total_seconds() / 3600, 0)
        borrowed_gpu_h += lease.gpu_milli / 1000 * h
        borrowed_cpu_h += lease.cpu_milli / 1000 * h
        per_node[lease.node_id] = per_node.get(lease.node_id, 0) + lease.gpu_milli / 1000 * h
    without = serving_gpu_h / gpu_capacity_h if gpu_capacity_h else 0.0
    return {
        "days": days,
        "inference_nodes": len(nodes),
        "gpu_capacity_hours": round(gpu_capacity_h, 2),
        "borrowed_gpu_hours": round(borrowed_gpu_h, 3),
        "borrowed_cpu_hours": round(borrowed_cpu_h, 3),
        "gpu_utilisation_without_lending": round(without, 4),
        "gpu_utilisation_with_lending": round(
            min((serving_gpu_h + borrowed_gpu_h) / gpu_capacity_h, 1.0) if gpu_capacity_h else 0,
            4,
        ),
        "cpu_utilisation_borrowed": round(
            borrowed_cpu_h / cpu_capacity_h if cpu_capacity_h else 0.0, 4
        ),
        "per_node_borrowed_gpu_hours": {n.name: round(per_node.get(n.pk, 0.0), 3) for n in nodes},
    }
