"""The experiment page in a real browser (Debian's chromium via playwright): the charts draw,
the SRM and guardrail status show, and the stop button sends everyone back to control; and the
journey that creates an experiment through the New experiment form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect

from experiments import services
from experiments.models import Experiment
from experiments.tests.factories import log_predictions, make_deployment
from serving.routing import route, routing_table
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.browser
SCREENSHOT = Path("/tmp/experiment-page.png")


@pytest.mark.usefixtures("transactional_db")
def test_experiment_page_in_a_browser(page):
    workspace = make_workspace(slug="exp-ui")
    dev = make_member(workspace, Role.DEVELOPER, username="dora")
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key="thumbs",
        hypothesis="Bigger thumbnails.",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        ramp_plan=[20],
        layer=services.layer_create(actor=dev, workspace=workspace, name="ui", salt="ui-tests"),
        min_units=10,
    )
    exp = services.experiment_submit(actor=dev, experiment=exp)
    table = routing_table(workspace, dep.name)
    rng = np.random.default_rng(1)
    for wave in range(2):
        served = [
            s
            for s in log_predictions(
                workspace, dep, lambda u: route(table, u), [f"w{wave}-{i}" for i in range(300)]
            )
            if s[2]
        ]
        services.feedback_record(
            actor=None,
            workspace=workspace,
            events=[
                {
                    "request_id": rid,
                    "event_id": rid,
                    "impressions": 5,
                    "clicks": int(rng.binomial(5, 0.2)),
                }
                for rid, _, _ in served
            ],
        )
        services.snapshot_take(experiment=exp)
    log_in(page, "dora")
    page.goto(f"/w/{workspace.slug}/experiments/")
    page.get_by_role("link", name="thumbs").click()
    expect(page.get_by_test_id("state")).to_have_text("Running")
    effect = page.get_by_test_id("effect-chart")
    expect(effect).to_be_visible()
    expect(effect).to_have_attribute("data-drawn", "true")  # uPlot: a canvas with both axes
    expect(effect.locator("canvas")).to_have_count(1)
    expect(effect.locator(".u-axis")).to_have_count(2)
    expect(page.get_by_test_id("arm-chart")).to_have_attribute("data-drawn", "true")
    expect(page.get_by_test_id("chart-ramp")).to_have_attribute("data-drawn", "true")
    expect(page.get_by_test_id("srm")).to_contain_text("ok")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
    page.fill("input[name=reason]", "browser check")
    page.get_by_role("button", name="Stop (all traffic to control)").click()
    expect(page.get_by_test_id("state")).to_have_text("Stopped")
    expect(page.get_by_test_id("stop-reason")).to_contain_text("browser check")
    assert routing_table(workspace, dep.name)["layers"] == []


@pytest.mark.usefixtures("transactional_db")
def test_creating_an_experiment_through_the_form(page):
    """The journey of issue 15: New experiment, a ramp the layer cannot hold is flagged live and
    refused with its free buckets named, a smaller one creates the draft. No API call."""
    workspace = make_workspace(slug="exp-form")
    dev = make_member(workspace, Role.DEVELOPER, username="erin")
    dep, (first, second) = make_deployment(workspace, treatments=2)
    layer = services.layer_create(actor=dev, workspace=workspace, name="ui", salt="ui-form")
    holder = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key="holder",
        hypothesis="Holds 4000 of the layer's buckets.",
        deployment=dep.name,
        treatment_versions=[first.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        ramp_plan=[20],
        layer=layer,
    )
    services.experiment_submit(actor=dev, experiment=holder)
    log_in(page, "erin")
    page.goto(f"/w/{workspace.slug}/experiments/")
    page.get_by_role("button", name="New experiment").click()
    expect(page.get_by_role("heading", name="New experiment")).to_be_visible()
    page.fill("#id_key", "from-the-form")
    page.fill("#id_hypothesis", "The second version lifts CTR.")
    page.select_option("#id_deployment", str(dep.pk))
    page.select_option("#id_treatment_versions", str(second.pk))
    page.fill("#id_layer", "ui")
    page.fill("#id_ramp_plan", "10, 40")
    room = page.get_by_test_id("layer-room")
    expect(room).to_contain_text("6000 of 10000 buckets free")  # htmx, before submitting
    expect(room).to_contain_text("does not fit")
    page.fill("#id_guardrail_ctr", "5")
    page.get_by_label("Always-valid (read at any time)").check()
    page.get_by_role("button", name="Create draft").click()
    expect(page.get_by_test_id("error-ramp_plan")).to_contain_text("6000 free buckets")
    assert not Experiment.objects.for_workspace(workspace).filter(key="from-the-form").exists()
    page.fill("#id_ramp_plan", "5, 20")
    expect(room).to_contain_text("it fits")
    page.get_by_role("button", name="Create draft").click()
    expect(page.get_by_test_id("state")).to_have_text("Draft")
    expect(page.locator(".messages li")).to_have_count(1)
    expect(page.locator(".messages li")).to_contain_text("Draft from-the-form created")
    exp = Experiment.objects.for_workspace(workspace).get(key="from-the-form")
    assert exp.ramp_plan == [5.0, 20.0] and exp.layer_id == layer.pk
    assert exp.arms[1]["version_id"] == second.pk and exp.sequential_method == "always_valid"
    assert exp.guardrails == [{"metric": "ctr", "max_drop": 0.05}]
