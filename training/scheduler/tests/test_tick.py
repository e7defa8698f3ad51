"""The live tick against the database: admission, quotas, placement, preemption, requeue."""

from __future__ import annotations

import pytest

from training.agent import local_workers
from training.models import JobState, NodeKind, PriorityClass, TrainingJob
from training.scheduler.models import JobScheduling, WorkspaceQuota
from training.scheduler.tests.factories import make_job, make_node, run_on
from training.scheduler.tick import schedule_tick
from training.services import job_transition
from workspaces.models import Event

pytestmark = pytest.mark.django_db


def reload(job: TrainingJob) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=job.pk)


def test_tick_admits_places_and_records_the_gpus(workspace):
    node = make_node(gpus=2)
    job = make_job(workspace, gpu_milli=400, cpu_milli=2000, memory_mb=2048)
    summary = schedule_tick()
    job = reload(job)
    assert summary["admitted"] == 1
    assert summary["placed"] == 1
    assert job.state == JobState.PLACED
    assert job.node == node
    assert len(job.assigned_gpus) == 1
    assert job.assigned_gpus[0]["milli"] == 400
    assert job.scheduling.policy == "default"
    assert job.scheduling.reason.startswith("placed on")
    assert not job.over_quota


def test_a_job_that_does_not_fit_waits_with_a_reason(workspace):
    make_node(gpus=1, gpu_type="V100")
    job = make_job(workspace, gpu_count=2, gpu_type="V100")
    schedule_tick()
    job = reload(job)
    assert job.state == JobState.ADMITTED
    assert job.scheduling.reason == "waiting for 2 x V100"
    # A second tick leaves it waiting without new events.
    before = Event.objects.unscoped().filter(verb__startswith="training.job.").count()
    schedule_tick()
    assert Event.objects.unscoped().filter(verb__startswith="training.job.").count() == before


def test_over_quota_runs_preemptible_and_is_flagged(workspace):
    make_node(gpus=4)
    WorkspaceQuota.objects.create(workspace=workspace, gpu_milli=1000)
    first = make_job(workspace, gpu_count=1)
    second = make_job(workspace, gpu_count=1)
    schedule_tick()
    first, second = reload(first), reload(second)
    assert first.state == second.state == JobState.PLACED
    assert not first.over_quota
    assert second.over_quota and second.preemptible
    assert "over quota, running preemptible" in second.scheduling.reason
    flagged = Event.objects.unscoped().filter(verb="scheduler.job.over_quota")
    assert flagged.count() == 1
    assert flagged.get().refs.get().object_id == str(second.pk)
    assert JobScheduling.objects.for_workspace(workspace).get(job=second).over_quota


def test_gang_job_gets_all_workers_or_none(workspace):
    make_node(gpus=2, name="a")
    make_node(gpus=2, name="b")
    gang = make_job(workspace, gpu_count=2, workers=2)
    too_big = make_job(workspace, gpu_count=2, workers=3)
    schedule_tick()
    gang, too_big = reload(gang), reload(too_big)
    assert gang.state == JobState.PLACED
    assert sorted(w["node"] for w in gang.scheduling.gang_nodes) == sorted(
        [n.pk for n in __import__("training.models").models.Node.objects.all()]
    )
    assert too_big.state == JobState.ADMITTED
    # Spread over two nodes: the primary node runs its own rank only (no cross-node ranks yet).
    assert local_workers(gang) == 1


def test_a_gang_that_fits_one_node_runs_there_with_every_workers_gpus(workspace):
    make_node(gpus=2, name="small")
    big = make_node(gpus=4, name="big", cpu_milli=64000)
    gang = make_job(workspace, gpu_count=1, cpu_milli=2000, workers=3)
    schedule_tick()
    gang = reload(gang)
    assert gang.state == JobState.PLACED and gang.node_id == big.pk
    assert {w["node"] for w in gang.scheduling.gang_nodes} == {big.pk}
    # Its ranks run on that node (training.distributed): they see all three GPUs.
    assert sorted(g["index"] for g in gang.assigned_gpus) == [0, 1, 2]
    assert local_workers(gang) == 3


def test_production_preempts_the_cheapest_exploration_job_which_requeues(workspace):
    node = make_node(gpus=2, name="busy")
    cheap = run_on(
        make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPLORATION),
        node,
        [(0, 1000)],
    )
    dearer = run_on(
        make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPERIMENT), node, [(1, 1000)]
    )
    prod = make_job(workspace, gpu_count=1, priority_class=PriorityClass.PRODUCTION)
    summary = schedule_tick()
    assert summary["preempting"] == 1
    assert reload(cheap).stop_requested == "preempt"
    assert reload(dearer).stop_requested == ""
    assert "preempting 1 lower-priority job(s) on busy" in reload(prod).scheduling.reason
    # While the victim checkpoints nothing else is evicted.
    schedule_tick()
    assert reload(dearer).stop_requested == ""
    # The agent reports the checkpointed stop; the next tick requeues it and places production.
    job_transition(job=cheap, to=JobState.PREEMPTED, checkpoint_step=40, reason="checkpointed")
    summary = schedule_tick()
    assert summary["requeued"] == 1
    prod, cheap = reload(prod), reload(cheap)
    assert prod.state == JobState.PLACED and prod.node == node
    assert prod.assigned_gpus == [{"index": 0, "milli": 1000}]
    assert cheap.state == JobState.ADMITTED  # back in the queue, resumes from step 40 later
    assert cheap.checkpoint_step == 40
    assert cheap.scheduling.preemptions == 1


def test_production_is_never_preempted_by_lower_classes(workspace):
    node = make_node(gpus=1)
    run_on(
        make_job(workspace, gpu_count=1, priority_class=PriorityClass.PRODUCTION), node, [(0, 1000)]
    )
    waiting = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPERIMENT)
    summary = schedule_tick()
    assert summary.get("preempting", 0) == 0
    assert not TrainingJob.objects.unscoped().filter(stop_requested="preempt").exists()
    assert reload(waiting).state == JobState.ADMITTED


def test_higher_priority_is_placed_first(workspace):
    make_node(gpus=1)
    low = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPLORATION)
    high = make_job(workspace, gpu_count=1, priority_class=PriorityClass.PRODUCTION)
    schedule_tick()
    assert reload(high).state == JobState.PLACED
    assert reload(low).state == JobState.ADMITTED


def test_only_exploration_borrows_inference_nodes(workspace):
    make_node(
        gpus=1,
        kind=NodeKind.INFERENCE,
        lending_windows=[{"days": list(range(7)), "start": "00:00", "end": "24:00"}],
    )
    experiment = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPERIMENT)
    explore = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPLORATION)
    schedule_tick()
    assert reload(experiment).state == JobState.ADMITTED
    explore = reload(explore)
    assert explore.state == JobState.PLACED
    assert explore.scheduling.borrowed


def test_the_beat_schedule_runs_tick_and_reconciler(settings):
    from config.celery import app
    from training.scheduler import tasks

    for key in ("scheduler-tick", "scheduler-reconcile"):
        entry = settings.CELERY_BEAT_SCHEDULE[key]
        assert entry["task"] in app.tasks
    assert tasks.tick.name == "training.scheduler.tasks.tick"


def test_tasks_run_a_tick_and_a_reconcile(workspace):
    from training.scheduler import tasks

    make_node(gpus=1)
    job = make_job(workspace, gpu_count=1)
    assert tasks.tick.apply().get()["placed"] == 1
    assert reload(job).state == JobState.PLACED
    assert tasks.reconcile.apply().get()["lost"] == 0


def test_slice_pricing_follows_the_setting(workspace, settings):
    from training.scheduler.inventory import build_cluster

    nodes = [make_node(gpus=1)]
    job = make_job(workspace, gpu_milli=470)
    cluster, _ = build_cluster(nodes, [], workload_jobs=[job])
    assert cluster.slice_pricing and cluster.prices.price == {470: pytest.approx(0.5)}
    settings.SCHEDULER_SLICE_PRICING = False
    cluster, _ = build_cluster(nodes, [], workload_jobs=[job])
    assert not cluster.slice_pricing


@pytest.mark.django_db(transaction=True)
def test_the_tick_solves_its_slice_prices_before_it_takes_any_lock(workspace, monkeypatch):
    from django.db import connection

    from training.scheduler import placement

    placement.SHARED_PRICES.clear()
    solved_in_transaction: list[bool] = []
    master = placement.SlicePrices._master

    def recording(matrix, demand):
        solved_in_transaction.append(connection.in_atomic_block)
        return master(matrix, demand)

    monkeypatch.setattr(placement.SlicePrices, "_master", staticmethod(recording))
    make_node(gpus=1)
    jobs = [make_job(workspace, gpu_milli=m) for m in (470, 300)]
    summary = schedule_tick()
    assert summary["placed"] == 2
    assert all(reload(j).state == JobState.PLACED for j in jobs)
    # The LP ran (a fractional workload), and never under the tick's row locks.
    assert solved_in_transaction and not any(solved_in_transaction)
