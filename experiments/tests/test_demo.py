"""The demo step: on serving's demo deployment it starts an experiment whose page has results."""

from __future__ import annotations

import io

import pytest

from experiments.demo import DEMO_DEPLOYMENT, DEMO_WORKSPACE, run_demo
from experiments.loop import loops_of
from experiments.models import Experiment
from experiments.services import layer_create
from features import registry as feature_registry
from features.models import EntityKind
from serving.deployments import deployment_create
from serving.tests.factories import T0, ingest_rows, make_scene
from serving.tests.helpers import passing_version
from training.models import TrainingJob
from training.tests.workers import node_worker
from workspaces.demo import demo_steps
from workspaces.testing.factories import make_workspace


def test_the_step_is_registered_after_serving():
    orders = {step.name: step.order for step in demo_steps()}
    assert orders["experiments"] == 40 and orders["experiments"] > orders.get("serving", 0)


@pytest.mark.django_db
def test_demo_without_a_deployment_is_skipped():
    out = io.StringIO()
    run_demo(base_url="http://x", stdout=out)
    assert "skipped" in out.getvalue()


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_demo_runs_its_experiment_through_the_one_action_loop():
    """The real loop on a real worker: samples, training on a node, gates, challenger, the
    experiment; then simulated traffic gives it results."""
    workspace = make_workspace(slug=DEMO_WORKSPACE)
    scene = make_scene(workspace, None, labels=120)
    production = passing_version(scene, None, name="feed-ranker")
    deployment_create(actor=None, workspace=workspace, name=DEMO_DEPLOYMENT, version=production)
    # A fixed salt for the layer the experiment takes, so the same units land in the same arms
    # on every run: with the demo's seeded feedback, the read-out is the same every time.
    layer_create(actor=None, workspace=workspace, name="default", salt="demo-test-layer")
    group = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="context_try",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "recent", "dtype": "float"}],
    )
    ingest_rows(
        None,
        group,
        [
            {"user_id": u, "event_time": T0.isoformat(), "recent": i / 10}
            for i, u in enumerate(scene.user_ids)
        ],
    )
    out = io.StringIO()
    with node_worker() as node:
        run_demo(
            base_url="http://127.0.0.1:8000",
            stdout=out,
            users_per_wave=700,
            group=group.name,
            place_on=node.name,
            place_after_s=0,
        )
    text = out.getvalue()
    assert "pressed 'Try in an A/B experiment' on context_try" in text, text
    run = loops_of(workspace).get()
    assert run.state == "succeeded", (run.error, text)
    exp = Experiment.objects.for_workspace(workspace).get(pk=run.context["experiment_id"])
    assert exp.state == "running" and exp.traffic_percent == 20, (exp.state, exp.stop_reason)
    assert [step["percent"] for step in exp.ramp_history] == [5, 10, 20]
    job = TrainingJob.objects.for_workspace(workspace).get(pk=run.context["job_id"])
    assert job.state == "succeeded" and "context_try:recent" in job.dataset.feature_refs
    assert job.template == "fine_ranking"
    snaps = list(exp.snapshots.order_by("created_at"))
    assert len(snaps) == 6
    latest = snaps[-1].result
    assert latest["arms"]["treatment"]["units"] > 150
    ctr = latest["effects"]["treatment"]["ctr"]
    # the planted +8% is small against this many simulated users: its sign is not guaranteed,
    # but the read-out must be complete and the arms' CTR near the simulated 5%
    assert not ctr["relative"]["error"] and not ctr["sequential"]["error"]
    assert ctr["sequential"]["ci_low"] < ctr["relative"]["estimate"] < ctr["sequential"]["ci_high"]
    for arm in ("control", "treatment"):
        assert 0.03 < latest["arms"][arm]["ctr"] < 0.08
    again = io.StringIO()
    run_demo(base_url="http://127.0.0.1:8000", stdout=again, group=group.name)
    assert "nothing to do" in again.getvalue()
    assert loops_of(workspace).count() == 1
