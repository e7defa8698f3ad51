"""The deployment page in a real browser (Debian's chromium via playwright): its traffic charts
draw from the gateway's own records, and the rollback button moves production back to the
previous version, recording who and why."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import expect

from serving.deployments import deployment_release
from serving.models import Deployment
from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace, token_for

pytestmark = pytest.mark.browser
SCREENSHOT = Path("/tmp/deployment-page.png")


@pytest.mark.usefixtures("transactional_db")
def test_deployment_page_charts_and_rollback_in_a_browser(page):
    workspace = make_workspace(slug="serve-ui")
    maintainer = make_member(workspace, Role.MAINTAINER, username="mara")
    scene, (first, second), dep = deployed(workspace, maintainer)
    deployment_release(actor=maintainer, workspace=workspace, deployment=dep, version=second)
    api = Client(HTTP_AUTHORIZATION=f"Token {token_for(maintainer)}")
    for i in range(5):
        response = api.post(
            f"/api/v1/workspaces/{workspace.slug}/predict/",
            predict_body(scene, request_id=f"ui-{i}"),
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        assert response.json()["version"] == second.version

    log_in(page, "mara")
    page.goto(f"/w/{workspace.slug}/deployments/")
    page.get_by_role("link", name=dep.name, exact=True).first.click()
    production = page.get_by_test_id("production")
    expect(production).to_contain_text(f"v{second.version}")
    # The charts are drawn client-side by uPlot from the page's JSON: a canvas with its two
    # axes, the axis labels, and a legend that shows the hovered values with their units.
    qps = page.locator('[data-chart="qps"]')
    expect(qps).to_have_attribute("data-drawn", "true")
    expect(qps.locator("canvas")).to_have_count(1)
    expect(qps.locator(".u-axis")).to_have_count(2)
    expect(qps.locator(".u-label").first).to_be_attached()
    expect(qps).to_contain_text("Requests / s")
    expect(qps.get_by_text("No data yet")).to_have_count(0)
    expect(page.locator('[data-chart="mix"]')).to_have_attribute("data-drawn", "true")
    qps.locator(".u-over").hover()
    expect(qps.locator(".u-legend")).to_contain_text("req/s")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
    page.fill("input[name=reason]", "browser rollback check")
    page.get_by_role("button", name=f"Roll back to v{first.version}").click()
    expect(production).to_contain_text(f"v{first.version}")
    expect(page.get_by_test_id("history")).to_contain_text("browser rollback check")
    dep = Deployment.objects.for_workspace(workspace).get(pk=dep.pk)
    assert dep.version_id == first.pk
    response = api.post(
        f"/api/v1/workspaces/{workspace.slug}/predict/",
        predict_body(scene, request_id="after"),
        content_type="application/json",
    )
    assert response.json()["version"] == first.version
