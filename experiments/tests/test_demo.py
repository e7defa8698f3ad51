"""The demo step: on serving's demo deployment it starts an experiment whose page has results."""

from __future__ import annotations

import io

import pytest

from experiments.demo import DEMO_DEPLOYMENT, DEMO_KEY, DEMO_WORKSPACE, run_demo
from experiments.models import Experiment
from experiments.services import layer_create
from serving.deployments import deployment_create
from serving.tests.factories import make_scene
from serving.tests.helpers import passing_version
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


@pytest.mark.django_db
def test_demo_runs_an_experiment_with_results(django_capture_on_commit_callbacks):
    workspace = make_workspace(slug=DEMO_WORKSPACE)
    scene = make_scene(workspace, None)
    production = passing_version(scene, None, name="feed-ranker")
    deployment_create(actor=None, workspace=workspace, name=DEMO_DEPLOYMENT, version=production)
    # A fixed salt for the layer the demo takes, so that the same units land in the same arms on
    # every run: with the demo's seeded feedback, the run is the same every time. (With a fresh
    # salt, a chance guardrail breach or SRM stopped it now and then, as it may in real life.)
    layer_create(actor=None, workspace=workspace, name="default", salt="demo-test-layer")
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        run_demo(base_url="http://127.0.0.1:8000", stdout=out, users_per_wave=700)
    exp = Experiment.objects.for_workspace(workspace).get(key=DEMO_KEY)
    assert "registered challenger" in out.getvalue()
    assert exp.state == "running" and exp.traffic_percent == 20, (exp.state, exp.stop_reason)
    assert [step["percent"] for step in exp.ramp_history] == [5, 10, 20]
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
    run_demo(base_url="http://127.0.0.1:8000", stdout=again)
    assert "nothing to do" in again.getvalue()
