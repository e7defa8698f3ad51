"""The lineage graph page in a real browser: found by typing a name, drawn left to right by
kind, a click on a node leads to its page."""

from __future__ import annotations

import itertools

import pytest
from playwright.sync_api import expect

from lineage.projection import project
from lineage.tests.helpers import build_scene
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.browser


@pytest.fixture
def page(chromium, live_server):
    """Taller and more patient than the shared page: the graph needs the room."""
    context = chromium.new_context(
        base_url=live_server.url, viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(8_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def scene(allow_orm_beside_playwright, transactional_db, settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    workspace = make_workspace(slug="feed")
    user = make_member(workspace, Role.VIEWER, username="vic")
    developer = make_member(workspace, Role.DEVELOPER)
    return {"workspace": workspace, "user": user, **build_scene(workspace, developer)}


COLUMNS = [
    "feature_group",
    "dataset",
    "training_job",
    "model_version",
    "deployment",
    "experiment",
]


POSITIONS = """root => root.cy.nodes().map(n => ({
    key: n.id(), kind: n.data("kind"), x: n.position("x"), screen: n.renderedPosition()
}))"""


def test_graph_found_by_name_runs_left_to_right_by_kind(page, scene, live_server):
    project()  # what the worker does after each commit (the dashboard reads, never projects)
    log_in(page, "vic")
    page.get_by_role("link", name="Lineage", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}/w/feed/lineage/")

    search = page.get_by_label("Find by name")
    search.fill("ctr-p")
    expect(page.locator('#lineage-names option[value="ctr-prod"]')).to_have_count(1)
    search.fill("ctr-prod")
    search.press("Enter")
    expect(page).to_have_url(f"{live_server.url}/w/feed/lineage/?q=ctr-prod")
    graph = page.get_by_test_id("lineage-graph")
    expect(graph).to_have_attribute("data-ready", "1")
    expect(page.get_by_test_id("node-detail")).to_contain_text("deployment ctr-prod")

    nodes = graph.evaluate(POSITIONS)
    xs = {kind: [n["x"] for n in nodes if n["kind"] == kind] for kind in COLUMNS}
    assert all(xs.values()), xs  # every kind from features to the experiment is drawn
    for left, right in itertools.pairwise(COLUMNS):
        assert max(xs[left]) < min(xs[right]), (left, right, xs)

    # A click on the dataset shows its details with a link to its page.
    dataset = next(n for n in nodes if n["key"] == f"dataset:{scene['dataset'].pk}")
    box = graph.locator("[data-role=canvas]").bounding_box()
    page.mouse.click(box["x"] + dataset["screen"]["x"], box["y"] + dataset["screen"]["y"])
    expect(page.get_by_test_id("node-detail")).to_contain_text("dataset clicks v1")
    page.get_by_test_id("open-object").click()
    expect(page).to_have_url(f"{live_server.url}/w/feed/features/datasets/clicks/v1/")
