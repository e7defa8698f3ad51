"""Acceptance with real Celery workers (Redis/PostgreSQL when configured): the node agent runs
what the scheduler places; preemption checkpoints and resumes; a lost node's job moves on."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from training import agent
from training.models import JobMetric, JobState, Node, NodeState, PriorityClass, TrainingJob
from training.scheduler.tests.factories import make_node
from training.scheduler.tick import schedule_tick
from training.services import job_create, job_transition, job_work_dir
from training.tests.factories import make_demo_dataset
from training.tests.workers import wait_for
from workspaces.testing.workers import embedded_worker

# The acceptance runs on Redis and PostgreSQL. On the embedded SQLite test database the
# scheduler's loop here and the worker thread write concurrently to one shared-cache in-memory
# database, which SQLite answers with "database table is locked" (table-level locks).
pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="concurrent writers need PostgreSQL (DATABASE_URL); SQLite locks whole tables",
    ),
]

# Long enough (100 steps, at least 5 s) that a loaded machine still preempts it mid-run.
# Every epoch runs (no early stopping): the test follows one continuous count of steps to the end.
SLOW = {
    "epochs": 4,
    "batch_size": 32,
    "threads": 1,
    "log_every_steps": 2,
    "step_sleep_s": 0.05,
    "early_stopping_patience": 0,
}
QUICK = {"epochs": 1, "batch_size": 128, "threads": 1, "log_every_steps": 2}


def _wait(predicate, *, timeout=90.0, what="condition", tick=True):
    return wait_for(predicate, timeout=timeout, what=what, tick=tick)


def _state(job) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=job.pk)


@contextmanager
def _node_worker():
    name = f"s{uuid.uuid4().hex[:10]}"
    try:
        with embedded_worker([f"node.{name}"]):
            node = _wait(
                lambda: Node.objects.filter(name=name).first(), timeout=30, what="node", tick=False
            )
            yield node
    finally:
        agent.HEARTBEATS.shutdown()  # the embedded test worker sends no worker_shutdown


def test_production_preempts_exploration_which_resumes_with_continuous_steps(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    with _node_worker() as node:
        whole = {"cpu_milli": node.cpu_milli, "memory_mb": 512}
        explore = job_create(
            actor=None, workspace=workspace, name="explore", dataset=dataset,
            template="fine_ranking", params=SLOW,
            priority_class=PriorityClass.EXPLORATION, **whole,
        )  # fmt: skip
        _wait(lambda: _state(explore).step >= 6, what="exploration progress")
        assert _state(explore).node == node
        prod = job_create(
            actor=None, workspace=workspace, name="prod", dataset=dataset,
            template="fine_ranking", params=QUICK,
            priority_class=PriorityClass.PRODUCTION, **whole,
        )  # fmt: skip
        _wait(lambda: _state(explore).state != JobState.RUNNING, what="the preemption", tick=True)
        stopped_at = _state(explore).checkpoint_step
        _wait(lambda: _state(prod).state != JobState.ADMITTED, what="production placed")
        assert _state(prod).node == node
        assert 6 <= stopped_at < _state(explore).total_steps
        _wait(lambda: _state(prod).is_terminal, what="the production job")
        assert _state(prod).state == JobState.SUCCEEDED, _state(prod).state_reason
        _wait(lambda: _state(explore).is_terminal, what="the resumed exploration job")
    explore = _state(explore)
    assert explore.state == JobState.SUCCEEDED, explore.state_reason
    assert explore.scheduling.preemptions == 1
    assert explore.step == explore.total_steps
    log = (job_work_dir(explore) / agent.LOG_FILE).read_text()
    assert f"resumed from checkpoint at step {stopped_at}" in log
    steps = list(
        JobMetric.objects.for_workspace(workspace)
        .filter(job=explore, name="loss")
        .order_by("id")
        .values_list("step", flat=True)
    )
    # One continuous count: no step trained twice, none after the stop restarted from zero.
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert any(s <= stopped_at for s in steps) and any(s > stopped_at for s in steps)


def test_a_lost_nodes_job_moves_to_another_node_and_finishes(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    ghost = make_node(name="ghost", cpu_milli=64000, memory_mb=65536)
    job = job_create(
        actor=None, workspace=workspace, name="survivor", dataset=dataset,
        template="fine_ranking", params=QUICK, cpu_milli=1000, memory_mb=512,
    )  # fmt: skip
    schedule_tick()
    job = _state(job)
    assert job.state == JobState.PLACED and job.node == ghost
    job_transition(job=job, to=JobState.RUNNING, attempts=1)  # its agent started it, then died
    with _node_worker() as node:
        Node.objects.filter(pk=ghost.pk).update(
            last_heartbeat=timezone.now() - timedelta(minutes=10)
        )
        _wait(lambda: _state(job).is_terminal, what="the job on the surviving node")
    job = _state(job)
    assert Node.objects.get(pk=ghost.pk).state == NodeState.LOST
    assert job.state == JobState.SUCCEEDED, job.state_reason
    assert job.node == node and job.attempts == 2
