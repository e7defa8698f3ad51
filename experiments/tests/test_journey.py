"""The engineer's journey in a real browser, UI only: log in, register a feature group, upload a
CSV into it, press "Try in an A/B experiment", wait on the loop's live page, and see the
experiment running with the challenger at the first ramp step. Behind the pages everything is
real: the loop's pipeline runs on a real Celery worker that also trains the model with PyTorch
as the node agent. The test makes no API call; it checks the pages made none either, and counts
the clicks and form submits the engineer needed."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from experiments.models import Experiment
from serving.deployments import deployment_create
from serving.tests.factories import T0, make_scene
from serving.tests.helpers import passing_version
from training.tests.workers import node_worker
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LOOP_TIMEOUT_MS = 240_000


def test_engineer_goes_from_a_new_feature_to_a_running_experiment_in_the_browser(page, workspace):
    engineer = make_member(workspace, Role.DEVELOPER, username="eng")
    scene = make_scene(workspace, None, labels=120)
    production = passing_version(scene, None, name="ranker")
    deployment_create(actor=None, workspace=workspace, name="main", version=production)
    csv = "user_id,event_time,clicks_7d\n" + "".join(
        f"{u},{T0.isoformat()},{i % 4}\n" for i, u in enumerate(scene.user_ids)
    )
    api_calls: list[str] = []
    page.on("request", lambda r: api_calls.append(r.url) if "/api/" in r.url else None)
    actions = 0

    def act(locator) -> None:
        nonlocal actions
        actions += 1
        locator.click()

    log_in(page, engineer.username)

    # Register the group.
    page.goto(f"/w/{workspace.slug}/features/")
    act(page.get_by_role("link", name="New feature group").first)
    page.fill("#id_name", "user_recency")
    page.select_option("#id_entity", "user")
    page.fill("#id_entity_keys", "user_id")
    row = page.locator("tr.schema-row").nth(0)
    row.locator("input[name=feature_name]").fill("clicks_7d")
    row.locator("select[name=feature_dtype]").select_option("int")
    act(page.get_by_role("button", name="Register feature group"))
    expect(page.get_by_role("heading", name="user_recency v1")).to_be_visible()

    # Upload its values.
    upload = page.get_by_test_id("upload")
    upload.get_by_label("File").set_input_files(
        {"name": "recency.csv", "mimeType": "text/csv", "buffer": csv.encode()}
    )
    act(upload.get_by_role("button", name="Upload"))
    expect(upload.get_by_test_id("rows-stored")).to_have_text(str(len(scene.user_ids)))

    # The one action.
    with node_worker(platform=True):
        page.reload()
        act(page.get_by_role("button", name="Try in an A/B experiment"))
        expect(page).to_have_url(re.compile(rf"/w/{workspace.slug}/loops/\d+/$"))
        expect(page.get_by_test_id("loop-stages")).to_have_attribute(
            "data-state", "succeeded", timeout=LOOP_TIMEOUT_MS
        )
    for stage in ("add_feature", "build_samples", "train", "quality_gate", "experiment"):
        expect(page.locator(f'[data-stage="{stage}"]')).to_have_attribute("data-state", "succeeded")
    expect(page.get_by_test_id("stage-link-train")).to_be_visible()
    act(page.get_by_test_id("stage-link-experiment"))
    expect(page).to_have_url(re.compile(rf"/w/{workspace.slug}/experiments/loop-\d+-[a-z0-9-]+/$"))
    expect(page.locator("body")).to_contain_text("Running")

    exp = Experiment.objects.for_workspace(workspace).get()
    assert exp.state == "running" and exp.traffic_percent == 5
    challenger = exp.arms[1]["version_id"]
    assert challenger != production.pk and exp.control_version_id == production.pk
    assert not api_calls, api_calls
    # register (2: open the form, submit), upload (1), the one action (1), open the experiment
    assert actions == 5
