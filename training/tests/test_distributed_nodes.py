"""Data-parallel ranks on two node agents (issue 21): the scheduler spreads a two-worker gang over
two nodes, rank 0's agent hands rank 1 to the other node's agent, and the two ranks train one
model over gloo. Killing the remote rank mid-run fails the attempt; the job is requeued, both
ranks start again from rank 0's checkpoint, and the job succeeds once."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest
from django.db import connection

from training import agent, runner
from training.agent import remote_ranks
from training.models import JobState, Node, TrainingJob
from training.scheduler.models import JobScheduling
from training.services import job_create, job_work_dir
from training.tests.factories import make_demo_dataset
from training.tests.workers import start_worker_process, wait_for
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

# Every epoch runs (no early stopping) with no dropout, so the two ranks' mean gradient is the
# one-process gradient of the same batch and the models agree; slowed so the kill lands mid-run.
PARAMS = {
    "epochs": 3,
    "batch_size": 64,
    "threads": 1,
    "seed": 0,
    "dropout": 0.0,
    "log_every_steps": 2,
    "step_sleep_s": 0.05,
    "checkpoint_every_steps": 5,
    "early_stopping_patience": 0,
}


def _job(pk) -> TrainingJob:
    return TrainingJob.objects.unscoped().select_related("scheduling").get(pk=pk)


def test_ranks_are_numbered_rank_0s_node_first_then_the_other_workers_in_gang_order():
    job = TrainingJob(node_id=1)
    gang = [
        {"node": 2, "gpus": [[0, 1000]]},
        {"node": 1, "gpus": []},
        {"node": 3, "gpus": [[1, 1000]]},
        {"node": 2, "gpus": [[1, 1000]]},
    ]
    job.scheduling = JobScheduling(gang_nodes=gang)
    assert agent.local_workers(job) == 1
    assert remote_ranks(job, 1) == [(2, [1, 3], [0, 1]), (3, [2], [1])]
    assert agent._ranks_fields(job)["workers"] == 4
    assert agent._ranks_fields(job)["local_ranks"] == 1


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="two worker processes share the test database only on a server (DATABASE_URL)",
)
def test_two_agents_train_two_ranks_and_a_killed_rank_restarts_both_from_the_checkpoint(
    workspace, tmp_path, client
):
    dataset = make_demo_dataset(workspace, scale=0.05)
    names = [f"d{uuid.uuid4().hex[:10]}" for _ in range(2)]
    log = tmp_path / "workers.log"
    workers = [start_worker_process(f"node.{name}", log) for name in names]
    try:
        nodes = [
            wait_for(lambda n=n: Node.objects.filter(name=n).first(), timeout=90, what=n)
            for n in names
        ]
        # Each worker asks for a whole node, so the gang can only be placed across the two.
        job = job_create(
            actor=None, workspace=workspace, name="two-nodes", dataset=dataset,
            template="fine_ranking", params=PARAMS, workers=2,
            cpu_milli=min(n.cpu_milli for n in nodes), memory_mb=256,
        )  # fmt: skip
        work = job_work_dir(job)
        pid_file = work / agent.RANK_PID_FILE.format(rank=1)
        wait_for(
            lambda: _job(job.pk).checkpoint_step >= 10 and pid_file.exists(),
            timeout=180,
            what="a checkpoint of the two ranks",
            tick=True,
        )
        first = _job(job.pk)
        assert sorted(w["node"] for w in first.scheduling.gang_nodes) == sorted(n.pk for n in nodes)
        checkpointed = first.checkpoint_step
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # rank 1, on the other node
        wait_for(lambda: _job(job.pk).is_terminal, timeout=240, what="the job", tick=True)
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        for process in workers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    job = _job(job.pk)
    text = (work / agent.LOG_FILE).read_text()
    assert job.state == JobState.SUCCEEDED, (job.state_reason, text[-3000:])
    assert job.attempts == 2 and job.step == job.total_steps
    # Both attempts ran rank 1 on the other node; the second resumed from the checkpoint.
    assert text.count("ranks [1] of 2 started on") == 2, text[-3000:]
    assert "data-parallel: 2 ranks (gloo)" in text
    resumed_at = int(text.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_at >= checkpointed > 0
    ends = Event.objects.for_workspace(workspace).filter(
        verb__in=["training.job.succeeded", "training.job.failed", "training.job.pending"],
        refs__kind="training_job",
        refs__object_id=str(job.pk),
    )
    assert sorted(ends.values_list("verb", flat=True)) == [
        "training.job.pending",  # the lost rank failed the attempt: requeued once
        "training.job.succeeded",
    ]
    assert not list(work.glob("rank*.pid"))  # no rank left running
    # The job page names the node of each rank.
    client.force_login(make_member(workspace, Role.VIEWER))
    page = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/").content.decode()
    table = page.split('data-testid="ranks"')[1].split("</table>")[0]
    rows = [row.split("<td>")[1:3] for row in table.split("<tr>")[2:]]
    assert sorted((r[0][0], r[1].split("<")[0]) for r in rows) == sorted(
        [("0", job.node.name), ("1", next(n.name for n in nodes if n.pk != job.node_id))]
    )

    # The same job with one rank (same global batch, same seed): the same held-out AUC.
    spec = agent.build_job_spec(job)
    alone = type(spec)(
        **{**spec.__dict__, "workers": 1, "local_ranks": 0, "work_dir": str(tmp_path / "one")}
    )
    events: list[dict] = []
    assert runner.train(alone, emit=runner.Emitter(sink=events.append)) == 0
    done = next(e for e in events if e["type"] == "done")
    one_rank_auc = done["metrics"]["holdout"]["auc"]
    assert abs(job.metrics["holdout"]["auc"] - one_rank_auc) <= 0.005
