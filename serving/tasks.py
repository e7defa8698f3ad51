"""Celery tasks of the serving app: prediction-log flush, the deployment controllers (one
reconcile per desired-state change, and the beat's resync), release gates."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from celery.signals import worker_shutdown
from django.utils import timezone


@worker_shutdown.connect
def stop_local_replicas(**_: object) -> None:
    """Local model-server replicas are children of the worker that started them: stop them with
    it rather than leave orphans (the next worker's resync starts them again)."""
    from serving.controllers import SUPERVISOR

    SUPERVISOR.stop_all()


@shared_task(name="serving.predlog_flush", ignore_result=True)
def predlog_flush() -> int:
    from serving.predlog import predlog_flush as flush

    return flush()


# A Progressing deployment (replicas starting, a rollout under way) is looked at again this
# often, this many times, before the beat's resync takes over.
FOLLOW_UP_SECONDS = 1.0
FOLLOW_UPS = 60


@shared_task(
    name="serving.deployment_reconcile",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def deployment_reconcile_task(deployment_id: int, follow_up: int = 0) -> str:
    """Run the deployment's controller (enqueued after each desired-state change commits).
    Idempotent: a redelivered or duplicate task finds the deployment converged and does
    nothing. While the backend is still Progressing, look again shortly."""
    from django.conf import settings

    from serving.controllers import deployment_reconcile
    from serving.models import DeploymentPhase

    outcome = deployment_reconcile(deployment_id=int(deployment_id))
    if outcome == DeploymentPhase.PROGRESSING and follow_up < FOLLOW_UPS:
        deployment_reconcile_task.apply_async(
            args=[deployment_id, follow_up + 1],
            countdown=FOLLOW_UP_SECONDS,
            queue=settings.SERVING_CONTROLLER_QUEUE,
        )
    return outcome


@shared_task(name="serving.deployments_reconcile", ignore_result=True)
def deployments_reconcile() -> dict[str, int]:
    """The resync: apply schedule/load scaling policies, then reconcile every deployment whose
    controller lags (a lost task), failed (retried here), or supervises something that can
    die (local processes, a cluster's objects). Returns how many ended in each outcome."""
    from serving.controllers import deployment_reconcile
    from serving.deployments import deployment_scale, desired_replicas
    from serving.models import Backend, Deployment, DeploymentPhase, DeploymentState, PredictionLog

    outcomes: dict[str, int] = {}
    since = timezone.now() - timedelta(minutes=1)
    for dep in Deployment.objects.unscoped().select_related("version", "workspace", "observed"):
        if dep.state == DeploymentState.ACTIVE and (dep.scaling or {}).get("mode") in (
            "schedule",
            "load",
        ):
            qps = (
                PredictionLog.objects.for_workspace(dep.workspace_id)
                .filter(deployment=dep, created_at__gte=since)
                .count()
                / 60
            )
            want = desired_replicas(dep, qps=qps)
            if want != dep.replicas:
                dep = deployment_scale(
                    actor=None, workspace=dep.workspace, deployment=dep, replicas=want
                )
        status = getattr(dep, "observed", None)
        settled = (
            status is not None
            and status.observed_generation == dep.generation
            and status.phase in (DeploymentPhase.READY, DeploymentPhase.STOPPED)
        )
        if settled and dep.backend == Backend.EMBEDDED:
            continue
        outcome = deployment_reconcile(deployment_id=dep.pk)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


@shared_task(name="serving.run_gates", acks_late=True, ignore_result=True)
def run_gates(version_id: int, actor_id: int | None = None) -> str:
    """Release gates asked for through the API or a page (``version_gates_request``)."""
    from serving.gates import version_gates_run_requested

    return version_gates_run_requested(version_id=int(version_id), actor_id=actor_id)


@shared_task(name="serving.score_benchmarks", acks_late=True, ignore_result=True)
def score_benchmarks(score_ids: list[int]) -> list[str]:
    """Benchmark scores asked for on registration or for a new set (``serving.benchmarks``):
    each computed once, in order."""
    from serving.benchmarks import benchmark_score_run

    return [benchmark_score_run(int(pk)) for pk in score_ids]


@shared_task(
    name="serving.review_generate",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def review_generate_task(review_id: int) -> str | None:
    """Generate a new human review's responses (``serving.review``); a redelivery of a review no
    longer generating does nothing."""
    from serving.review import review_generate

    review = review_generate(int(review_id))
    return review.status if review is not None else None
