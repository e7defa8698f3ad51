"""The lineage graph page in a real browser: draws the graph, selects, expands, pans and zooms."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from lineage.projection import project
from lineage.tests.helpers import build_scene
from workspaces.models import Role
from workspaces.testing.factories import TEST_PASSWORD, make_member, make_workspace

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


def log_in(page, username):
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", TEST_PASSWORD)
    page.get_by_role("button", name="Log in").click()


def test_graph_page_draws_selects_expands_and_zooms(page, scene, live_server):
    project()  # what the worker does after each commit (the dashboard reads, never projects)
    log_in(page, "vic")
    # The dashboard card and the sidebar link lead here.
    expect(page.locator('[data-section="lineage"] [data-testid="lineage-counts"]')).to_contain_text(
        "1 datasets"
    )
    page.get_by_role("link", name="Lineage", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}/w/feed/lineage/")
    expect(page.locator(".sidenav a.active")).to_have_text("Lineage")

    model = f"model_version:{scene['model']}"
    page.goto(f"/w/feed/lineage/?node={model}")
    graph = page.get_by_test_id("lineage-graph")
    expect(graph).to_have_attribute("data-ready", "1")
    nodes = graph.locator(".lineage-node")
    keys = set(nodes.evaluate_all("els => els.map(e => e.dataset.key)"))
    # Two steps both ways: job and dataset upstream, deployment and experiment downstream.
    assert {model, f"training_job:{scene['job']}", f"dataset:{scene['dataset'].pk}"} <= keys
    assert {f"deployment:{scene['deployment']}", f"experiment:{scene['experiment']}"} <= keys
    assert f"feature_group:{scene['labels'].pk}" not in keys  # three steps up
    expect(graph.locator(".lineage-node.root")).to_have_count(1)

    # Select the dataset and expand upstream: its feature groups appear.
    graph.locator(f'[data-key="dataset:{scene["dataset"].pk}"]').click()
    expect(page.get_by_test_id("node-detail")).to_contain_text("dataset clicks")
    expect(page.get_by_test_id("open-object")).to_have_attribute(
        "href", "/w/feed/features/datasets/clicks/v1/"
    )
    before = nodes.count()
    page.get_by_test_id("expand-upstream").click()
    expect(graph.locator(f'[data-key="feature_group:{scene["labels"].pk}"]')).to_have_count(1)
    assert nodes.count() > before

    # Zoom and pan change the view transform.
    view = graph.locator("svg > g").first
    start = view.get_attribute("transform")
    graph.get_by_role("button", name="Zoom in").click()
    zoomed = view.get_attribute("transform")
    assert zoomed != start
    box = graph.locator("svg").bounding_box()
    page.mouse.move(box["x"] + 8, box["y"] + box["height"] - 8)
    page.mouse.down()
    page.mouse.move(box["x"] + 108, box["y"] + box["height"] - 68, steps=5)
    page.mouse.up()
    assert view.get_attribute("transform") != zoomed

    # Opening a node centres the page on it; the cost panel follows.
    page.get_by_test_id("open-node").click()
    expect(page).to_have_url(
        re.compile(rf"/w/feed/lineage/\?node=dataset(:|%3A){scene['dataset'].pk}$")
    )
    expect(page.get_by_test_id("node-cost")).to_contain_text("dataset")
    page.goto(f"/w/feed/lineage/?node=training_job:{scene['job']}")
    expect(page.get_by_test_id("node-cost")).to_contain_text("Rolled up")
    expect(page.get_by_test_id("workspace-cost")).to_contain_text("CPU-h")
