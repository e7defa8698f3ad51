"""``members``: a model that averages networks trained as runs of their own (seed, seed + 1,
...). The average is what the bundle holds and serving loads, each member is the run it would be
alone, progress counts every member's steps, and a stopped run resumes without retraining the
members it finished."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training import data, evaluation, runner, synthetic
from training.bundle import load_bundle
from training.params import job_params_check
from training.templates.inputs import Averaged
from training.tests.factories import demo_job_spec, run_spec

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("demo") / "d.parquet", scale=0.05)


def _job(path, work_dir, **params):
    return demo_job_spec(path, work_dir, **{"epochs": 2, "batch_size": 128, **params})


_run = run_spec


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_bundle_averages_members_that_are_each_the_run_alone(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path / "avg", members=2)
    code, events = _run(job)
    assert code == 0
    bundle = load_bundle(job.model_dir)
    assert isinstance(bundle.model, Averaged) and len(bundle.model.members) == 2
    # Member 1 is the run with seed 1 trained alone (same rows, same steps, its own stopping).
    alone = _job(demo_parquet, tmp_path / "alone", seed=1, calibration="none")
    assert _run(alone)[0] == 0
    expected = _state(load_bundle(alone.model_dir).model)
    got = _state(bundle.model.members[1])
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not all(  # and member 0 (seed 0) is another network
        torch.equal(got[k], v) for k, v in _state(bundle.model.members[0]).items()
    )
    # The model's logit is the members' mean; serving's path (raw columns) scores the same.
    holdout = data.load(job).holdout
    logits = evaluation.predict_logits(bundle.model, holdout.dense, holdout.cat)
    each = [evaluation.predict_logits(m, holdout.dense, holdout.cat) for m in bundle.model.members]
    assert np.allclose(logits, np.mean(each, axis=0), atol=1e-6)
    table = data.read_table(demo_parquet, [f["column"] for f in job.features]).slice(0, 40)
    raw = bundle.predict({c: table.column(c) for c in table.column_names}, 40)
    split = data.encode_split(bundle.spec, table, "click")
    assert np.allclose(raw, evaluation.predict_bundle(bundle, split), atol=1e-6)
    # The calibration is fitted on the average, and the job reports one start and one done.
    assert bundle.spec.extra["calibration"]["method"] == "temperature"
    starts = [e for e in events if e["type"] == "start"]
    done = [e for e in events if e["type"] == "done"]
    assert len(starts) == 1 and len(done) == 1 and done[0]["metrics"]["members"] == 2
    steps = [e["step"] for e in events if e["type"] == "progress"]
    assert steps == sorted(steps) and steps[-1] == starts[0]["total_steps"]


def test_a_stopped_run_resumes_without_retraining_finished_members(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path / "job", members=2, log_every_steps=1)
    stop = runner.StopFlag()
    seen: list[dict] = []

    def sink(event: dict) -> None:
        seen.append(event)
        total = next((e["total_steps"] for e in seen if e["type"] == "start"), 0)
        if event["type"] == "progress" and event["step"] > total // 2 + 1:
            stop.set()  # a few steps into the second member

    code = runner.train(job, emit=runner.Emitter(sink=sink), stop=stop)
    assert code == runner.EXIT_STOPPED
    first = tmp_path / "job" / "member-0" / "model"
    assert (tmp_path / "job" / "member-0" / "member-done").exists()
    before = _state(load_bundle(first).model)
    first_mtime = (first / "weights.pt").stat().st_mtime_ns
    code, events = _run(job)
    assert code == 0
    assert (first / "weights.pt").stat().st_mtime_ns == first_mtime  # not trained again
    assert any("resumed from checkpoint" in e.get("message", "") for e in events)
    after = load_bundle(job.model_dir).model.members[0]
    assert all(torch.equal(v, after.state_dict()[k]) for k, v in before.items())


def test_members_is_a_checked_param_of_the_network_templates():
    cleaned, errors = job_params_check(template="deepfm", params={"members": 3})
    assert cleaned == {"members": 3} and not errors
    _, errors = job_params_check(template="fine_ranking", params={"members": 0})
    assert "params.members" in errors
    _, errors = job_params_check(template="logreg", params={"members": 3})
    assert "Unknown param" in errors["params.members"]


def test_members_cannot_start_from_a_base_model(demo_parquet, tmp_path):
    base = _job(demo_parquet, tmp_path / "base", epochs=1)
    assert _run(base)[0] == 0
    job = _job(demo_parquet, tmp_path / "job", members=2)
    job.base_model_path = str(base.model_dir)
    code, events = _run(job)
    assert code == 2
    assert "base model" in next(e for e in events if e["type"] == "error")["message"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_a_members_job_runs_on_a_node_agent_and_its_model_is_the_average(workspace):
    from training import agent
    from training.models import JobState
    from training.services import job_create
    from training.tests.factories import FAST, make_demo_dataset, make_node, place

    dataset = make_demo_dataset(workspace, scale=0.05)
    job = job_create(
        actor=None, workspace=workspace, name="avg", dataset=dataset, template="deepfm",
        params={**FAST, "members": 2},
    )  # fmt: skip
    place(job, make_node())
    assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    job.refresh_from_db()
    assert job.metrics["members"] == 2 and job.step == job.total_steps > 0
    model = load_bundle(agent.artifact_path(job.model_path)).model
    assert isinstance(model, Averaged) and len(model.members) == 2
