"""Celery tasks of the serving app: prediction-log flush, local replica supervision/scaling."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone


@shared_task(name="serving.predlog_flush", ignore_result=True)
def predlog_flush() -> int:
    from serving.predlog import predlog_flush as flush

    return flush()


@shared_task(name="serving.deployments_reconcile", ignore_result=True)
def deployments_reconcile() -> int:
    """Restart dead local model servers and apply schedule/load scaling policies."""
    from serving.deployments import SUPERVISOR, deployment_scale, desired_replicas
    from serving.models import Backend, Deployment, DeploymentState, PredictionLog

    changed = 0
    since = timezone.now() - timedelta(minutes=1)
    for dep in (
        Deployment.objects.unscoped()
        .filter(state=DeploymentState.ACTIVE)
        .select_related("version", "workspace")
    ):
        qps = (
            PredictionLog.objects.for_workspace(dep.workspace_id)
            .filter(deployment=dep, created_at__gte=since)
            .count()
            / 60
        )
        want = desired_replicas(dep, qps=qps)
        if want != dep.replicas and (dep.scaling or {}).get("mode") in ("schedule", "load"):
            deployment_scale(actor=None, workspace=dep.workspace, deployment=dep, replicas=want)
            changed += 1
        elif dep.backend == Backend.LOCAL:
            SUPERVISOR.reconcile(dep)
    return changed


@shared_task(name="serving.run_gates", acks_late=True, ignore_result=True)
def run_gates(version_id: int, actor_id: int | None = None) -> str:
    """Release gates asked for through the API or a page (``version_gates_request``)."""
    from serving.gates import version_gates_run_requested

    return version_gates_run_requested(version_id=int(version_id), actor_id=actor_id)
