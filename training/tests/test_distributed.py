"""Data-parallel training (``training.distributed``): rank 0 runs in this process, the other
ranks are real ``python -m training.runner --rank r`` processes joined over gloo."""

from __future__ import annotations

import pytest
import torch

from training import distributed, runner, synthetic
from training.bundle import load_bundle
from training.tests.factories import demo_job_spec, run_spec

# Full batches only (steps < one epoch): with equal shards the ranks' mean gradient is the
# batch's, so two ranks must train the model one process trains.
# Training children and their ranks alone: no database is involved.
pytestmark = pytest.mark.one_backend

PARAMS = {"epochs": 1, "batch_size": 128, "max_steps": 12, "early_stopping_patience": 0}


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("ddp") / "d.parquet", scale=0.1)


def weights(job) -> dict[str, torch.Tensor]:
    return load_bundle(job.model_dir).model.state_dict()


def spec(path, work, workers: int, **params):
    job = demo_job_spec(path, work, **{**PARAMS, **params})
    job.workers = workers
    return job


def test_two_ranks_train_the_model_one_process_trains(demo_parquet, tmp_path):
    alone = spec(demo_parquet, tmp_path / "one", 1)
    pair = spec(demo_parquet, tmp_path / "two", 2)
    assert run_spec(alone)[0] == 0
    code, events = run_spec(pair)
    assert code == 0, [e for e in events if e["type"] in ("error", "log")]
    start = next(e for e in events if e["type"] == "start")
    assert start["workers"] == 2
    # The throughput is reported per wall-clock second and per CPU second of the loop.
    metrics = next(e for e in events if e["type"] == "done")["metrics"]
    assert metrics["train_samples_per_s"] > 0 and metrics["train_samples_per_cpu_s"] > 0
    a, b = weights(alone), weights(pair)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    # Not a run that learned nothing: the weights moved from their initial values.
    fresh = spec(demo_parquet, tmp_path / "zero", 1, max_steps=1, lr=0.0)
    assert run_spec(fresh)[0] == 0
    assert any(not torch.allclose(a[n], weights(fresh)[n]) for n in a)
    assert not distributed._current  # the group was left, its ranks waited for


def test_a_stopped_pair_resumes_from_rank_0s_checkpoint_to_the_same_model(demo_parquet, tmp_path):
    whole = spec(demo_parquet, tmp_path / "whole", 2)
    assert run_spec(whole)[0] == 0
    cut = spec(demo_parquet, tmp_path / "cut", 2)
    stop = runner.StopFlag()
    events: list[dict] = []

    def sink(event: dict) -> None:
        events.append(event)
        if event["type"] == "progress" and event["step"] >= 5:
            stop.set()

    assert runner.train(cut, emit=runner.Emitter(sink=sink), stop=stop) == runner.EXIT_STOPPED
    stopped = next(e for e in events if e["type"] == "stopped")
    assert 5 <= stopped["step"] < PARAMS["max_steps"]
    code, resumed = run_spec(cut)
    assert code == 0
    assert any(
        e["type"] == "log" and f"resumed from checkpoint at step {stopped['step']}" in e["message"]
        for e in resumed
    )
    a, b = weights(whole), weights(cut)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_lost_rank_fails_the_job_and_leaves_no_rank_behind(demo_parquet, tmp_path):
    job = spec(demo_parquet, tmp_path / "lost", 3, max_steps=400, step_sleep_s=0.01)
    killed = []

    def sink(event: dict) -> None:
        if event["type"] == "progress" and not killed:
            child = distributed._current[0].children[0]
            child.kill()
            killed.append(child)

    with pytest.raises(RuntimeError):
        runner.train(job, emit=runner.Emitter(sink=sink))
    survivors = list(distributed._current[0].children)
    distributed.abandon_current()  # what runner.main does on an error
    assert killed and all(child.poll() is not None for child in survivors)
    assert not distributed._current
    assert not torch.distributed.is_initialized()  # a retry in this process can start again


def test_on_cuda_every_visible_gpu_gets_a_rank():
    assert distributed.ranks_for(1, 4) == 4  # a job given 4 GPUs trains on all 4
    assert distributed.ranks_for(3, 0) == 3  # CPU ranks
    assert distributed.ranks_for(1, 0) == 1


def test_the_reported_loss_is_every_ranks_rows(demo_parquet, tmp_path):
    alone = spec(demo_parquet, tmp_path / "one", 1, log_every_steps=4)
    pair = spec(demo_parquet, tmp_path / "two", 2, log_every_steps=4)
    losses = []
    for job in (alone, pair):
        code, events = run_spec(job)
        assert code == 0
        losses.append([(e["step"], e["loss"]) for e in events if e["type"] == "progress"])
    # Same model, same batches: the mean loss over a window is the same however it is split.
    assert [s for s, _ in losses[0]] == [s for s, _ in losses[1]] == [4, 8, 12]
    for (_, one), (_, two) in zip(*losses, strict=True):
        assert two == pytest.approx(one, rel=1e-4)


def _remote_rank(event: dict, spec_path, rank: int):
    """What another node's agent does with a ``rendezvous`` event: start ``rank`` against the
    announced store (``agent.execute_ranks``, without the sandbox)."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        distributed.STORE_ENV: event["store"],
        distributed.WORLD_ENV: str(event["world"]),
        distributed.RANK_ENV: str(rank),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "training.runner", "--rank", str(rank), str(spec_path)],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def _other_node_spec(pair, tmp_path):
    """The spec file another node's agent stages for ``pair``: the same job in its own work
    folder (``other-node``), as ``agent.execute_ranks`` writes it."""
    from dataclasses import replace

    folder = tmp_path / "other-node"
    folder.mkdir()
    path = folder / "spec.json"
    path.write_text(replace(pair, work_dir=str(folder)).to_json())
    return path


def test_a_rank_on_another_node_joins_through_the_announced_rendezvous(demo_parquet, tmp_path):
    from dataclasses import replace

    alone = spec(demo_parquet, tmp_path / "one", 1)
    assert run_spec(alone)[0] == 0
    pair = replace(spec(demo_parquet, tmp_path / "spread", 2), local_ranks=1)
    other_path = _other_node_spec(pair, tmp_path)  # its own staged folder
    started = []

    def sink(event: dict) -> None:
        if event["type"] == "rendezvous":
            assert event["world"] == 2 and event["first_remote_rank"] == 1
            started.append(_remote_rank(event, other_path, 1))

    assert runner.train(pair, emit=runner.Emitter(sink=sink)) == 0
    assert len(started) == 1 and started[0].wait(timeout=60) == 0
    assert not distributed._current
    a, b = weights(alone), weights(pair)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_ranks_that_would_resume_from_different_checkpoints_fail_the_attempt(
    demo_parquet, tmp_path
):
    import shutil
    from dataclasses import replace

    first = spec(demo_parquet, tmp_path / "first", 1, max_steps=4)
    assert run_spec(first)[0] == 0  # leaves a checkpoint at step 4 (its last)
    pair = replace(spec(demo_parquet, tmp_path / "spread", 2), local_ranks=1)
    (tmp_path / "spread").mkdir()
    shutil.copyfile(first.checkpoint_file, pair.checkpoint_file)  # rank 0 resumes at step 4
    other_path = _other_node_spec(pair, tmp_path)  # rank 1 staged no checkpoint
    started = []

    def sink(event: dict) -> None:
        if event["type"] == "rendezvous":
            started.append(_remote_rank(event, other_path, 1))

    with pytest.raises(RuntimeError, match="resume from different steps"):
        runner.train(pair, emit=runner.Emitter(sink=sink))
    distributed.abandon_current()
    assert started and started[0].wait(timeout=60) != 0


def test_the_gradient_buffer_holds_every_gradient_and_backward_fills_it_in_place():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model[0].bias.requires_grad_(False)
    buffer = distributed.gradient_buffer(distributed.Group(rank=0, world=2), model)
    assert buffer is not None
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert buffer.size == sum(p.numel() for p in trainable) == 12 + 4 + 1
    assert buffer.flat.numel() == buffer.size + distributed.EXTRA
    model(torch.ones(2, 3)).sum().backward()
    # Backward accumulated into the views: the flat buffer is every gradient, in order.
    assert torch.equal(
        buffer.flat[: buffer.size], torch.cat([p.grad.reshape(-1) for p in trainable])
    )
    assert buffer.flat[: buffer.size].abs().sum() > 0
    assert model[0].bias.grad is None
    buffer.zero()
    assert all(float(p.grad.abs().sum()) == 0 for p in trainable)


def test_no_gradient_buffer_alone_or_over_mixed_dtypes():
    model = torch.nn.Linear(2, 1)
    assert distributed.gradient_buffer(distributed.Group(), model) is None
    model.bias.data = model.bias.data.double()
    assert distributed.gradient_buffer(distributed.Group(rank=0, world=2), model) is None
