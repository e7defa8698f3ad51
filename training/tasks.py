"""Celery tasks of the training app.

``run_job`` is what the scheduler dispatches to a node's queue
(``run_job.apply_async(args=[job.pk], queue=node.queue)``); the worker consuming that queue is
the node's agent. A worker that consumes any ``node.<name>`` queue also starts that node's
heartbeat on ``worker_ready``.
"""

from __future__ import annotations

from celery import shared_task
from celery.contrib.testing.worker import test_worker_started
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from django.db import connection

from training import agent


@shared_task(name="training.tasks.run_job", acks_late=True, bind=True)
def run_job(self, job_id: int) -> str:
    try:
        return agent.execute_job(int(job_id))
    finally:
        # A job runs for minutes to hours: hand the connection back rather than hold it idle
        # (only on a worker; a direct or eager call shares its caller's connection).
        if not (self.request.called_directly or self.request.is_eager):
            connection.close()


@shared_task(name="training.tasks.run_ranks", bind=True)
def run_ranks(
    self, job_id: int, attempt: int, node_id: int, store: str, world: int, ranks, gpus=()
) -> str:
    """The ranks of a data-parallel job that the gang placed on this node while its rank 0 runs
    on another (``agent.execute_ranks``). Not acknowledged late: a redelivery would find its
    attempt over (a rank lost with its agent fails the attempt, and the next one hands out its
    ranks afresh)."""
    try:
        return agent.execute_ranks(
            int(job_id), int(attempt), int(node_id), str(store), int(world),
            [int(r) for r in ranks], [int(g) for g in gpus],
        )  # fmt: skip
    finally:
        if not (self.request.called_directly or self.request.is_eager):
            connection.close()


@shared_task(name="training.tasks.resume_pipelines")
def resume_pipelines() -> int:
    """Beat: re-queue running pipeline runs that nobody advances (a wake-up lost with a worker)."""
    from training import pipelines

    return pipelines.pipeline_runs_resume()


@shared_task(name="training.tasks.run_pipeline")
def run_pipeline(run_id: int, lease: str | None = None) -> str:
    """Advance a pipeline run while holding one of its workspace's task slots; a workspace at
    its limit waits in the queue (re-enqueued), not in a worker slot other tenants need."""
    from training import pipelines
    from training.models import PipelineRun
    from workspaces.task_slots import SLOT_RETRY_SECONDS, workspace_task_slot

    workspace_id = (
        PipelineRun.objects.unscoped().filter(pk=run_id).values_list("workspace_id", flat=True)
    ).first()
    if workspace_id is None:
        return "missing"
    with workspace_task_slot(workspace_id=workspace_id, kind="training.pipeline") as held:
        if held:
            return pipelines.pipeline_run_advance(run_id, lease=lease)
    run_pipeline.apply_async(args=[run_id, lease], countdown=SLOT_RETRY_SECONDS)
    return "deferred"


@shared_task(name="training.tasks.run_candidate_evaluation")
def run_candidate_evaluation(evaluation_id: int) -> str:
    from training import candidates

    return candidates.candidate_evaluate(evaluation_id)


@shared_task(name="training.tasks.advance_tuning_job", acks_late=True)
def advance_tuning_job(tuning_job_id: int) -> str:
    """Advance one tuning job (idempotent: its row lock and state decide what is left to do)."""
    from training.tuning import tuning_job_advance

    return tuning_job_advance(int(tuning_job_id))


@shared_task(name="training.tasks.advance_tuning_jobs")
def advance_tuning_jobs() -> int:
    """Beat: advance every unfinished tuning job (a wake-up lost with a worker)."""
    from training.tuning import tuning_jobs_advance_all

    return tuning_jobs_advance_all()


@worker_ready.connect
def _start_node_heartbeats(sender=None, **_kwargs) -> None:
    if sender is not None:
        agent.start_heartbeats(sender)


# Celery's embedded test worker (celery.contrib.testing) announces itself with its own signal
# instead of worker_ready; a node queue consumed there beats the same way.
@test_worker_started.connect
def _start_node_heartbeats_in_test_worker(consumer=None, **_kwargs) -> None:
    if consumer is not None:
        agent.start_heartbeats(consumer)


@worker_shutdown.connect
def _stop_node_heartbeats(**_kwargs) -> None:
    agent.HEARTBEATS.shutdown()


@worker_shutting_down.connect
def _checkpoint_running_jobs(**_kwargs) -> None:
    """SIGTERM to the worker: running children checkpoint and stop; their jobs are preempted.
    In a TrainJob's pod the node is cordoned first: the pod is going away."""
    try:
        agent.pod_stopping()
    finally:
        agent.SHUTTING_DOWN.set()
