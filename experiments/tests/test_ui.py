"""The experiments UI through Django's test client: list, experiment page with charts, SRM,
guardrails and decision buttons by role, the layer map, and another workspace's 404."""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.test import Client

from experiments import services
from experiments.tests.factories import log_predictions, make_deployment
from serving.routing import route, routing_table
from workspaces.models import Role
from workspaces.testing.markup import markup_problems

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def running(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key="ui-ab",
        hypothesis="Bigger thumbnails lift CTR.",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        ramp_plan=[10, 20],
        layer=services.layer_create(actor=dev, workspace=workspace, name="ui", salt="ui-tests"),
        min_units=10,
    )
    exp = services.experiment_submit(actor=dev, experiment=exp)
    table = routing_table(workspace, dep.name)
    rng = np.random.default_rng(5)
    for chunk in range(3):  # three snapshots over time
        units = [f"u{chunk}-{i}" for i in range(400)]
        served = [
            s for s in log_predictions(workspace, dep, lambda u: route(table, u), units) if s[2]
        ]
        services.feedback_record(
            actor=None,
            workspace=workspace,
            events=[
                {
                    "request_id": rid,
                    "event_id": rid,
                    "impressions": 8,
                    "clicks": int(rng.binomial(8, 0.12)),
                }
                for rid, _, _ in served
            ],
        )
        services.snapshot_take(experiment=exp)
    return exp


def test_list_and_experiment_page(workspace, members, running):
    viewer = browser(members[Role.VIEWER])
    listing = viewer.get(f"/w/{workspace.slug}/experiments/").content.decode()
    assert 'data-experiment="ui-ab"' in listing and "10.0%" in listing
    page = viewer.get(f"/w/{workspace.slug}/experiments/ui-ab/").content.decode()
    assert 'data-testid="effect-chart"' in page and 'data-testid="arm-chart"' in page
    arms = json.loads(
        page.split('<script id="chart-data-arms" type="application/json">')[1].split("</script>")[0]
    )
    assert len(arms["x"]) == 3 and len(arms["bands"]) == 2  # three snapshots, two arms
    assert [s["label"] for s in arms["series"]][::3] == ["control", "treatment"]
    assert 'data-testid="srm"' in page and ">ok<" in page
    assert "All guardrails hold." in page
    assert "Stop (all traffic to control)" not in page  # a viewer gets no buttons
    maintainer_page = (
        browser(members[Role.MAINTAINER])
        .get(f"/w/{workspace.slug}/experiments/ui-ab/")
        .content.decode()
    )
    for button in (
        "Ramp up now",
        "Stop (all traffic to control)",
        "Promote to production",
        "Discard",
    ):
        assert button in maintainer_page
    # Each decision's input is labelled (the stop reason was a bare placeholder).
    assert markup_problems(maintainer_page) == []


def test_buttons_act_with_the_right_role(workspace, members, running):
    url = f"/w/{workspace.slug}/experiments/ui-ab/"
    assert browser(members[Role.VIEWER]).post(url + "stop/").status_code == 403
    assert browser(members[Role.DEVELOPER]).post(url + "ramp/").status_code == 403
    response = browser(members[Role.MAINTAINER]).post(url + "ramp/")
    assert response.status_code == 302
    running.refresh_from_db()
    assert running.traffic_percent == 20
    browser(members[Role.DEVELOPER]).post(url + "stop/", {"reason": "ui"})
    running.refresh_from_db()
    assert running.state == "stopped" and "ui" in running.stop_reason
    page = browser(members[Role.VIEWER]).get(url).content.decode()
    assert 'data-testid="stop-reason"' in page


def test_layer_map_and_other_workspaces(workspace, other_workspace, members, running):
    page = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/experiments/layers/")
    assert 'data-layer="ui"' in page.content.decode()
    assert "ui-ab" in page.content.decode()
    outsider = browser(members["outsider"])
    assert outsider.get(f"/w/{workspace.slug}/experiments/ui-ab/").status_code == 404
    make_deployment(other_workspace)
    assert (
        browser(members[Role.ADMIN])
        .get(f"/w/{other_workspace.slug}/experiments/ui-ab/")
        .status_code
        == 404
    )
    assert (
        browser(members[Role.ADMIN]).get(f"/w/{workspace.slug}/experiments/nope/").status_code
        == 404
    )


def test_dashboard_card_counts_experiments(workspace, members, running):
    page = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/").content.decode()
    assert 'data-testid="experiment-counts"' in page and "ui-ab" in page
