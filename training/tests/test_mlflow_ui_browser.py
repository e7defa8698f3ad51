"""MLflow's own UI, served by the platform at /mlflow/w/<slug>/, in a real browser: a signed-in
member opens a run the way the job page links it and sees its name and metric; the UI's calls
that the mount refuses are listed when the page does not render."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from training import mlflow_server
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_member_opens_a_run_in_the_platforms_mlflow_ui(chromium, live_server):
    from mlflow.entities import Metric

    workspace = make_workspace(slug=f"ui-{uuid.uuid4().hex[:8]}")
    user = make_member(workspace, Role.VIEWER)
    namespace = mlflow_server.Namespace(workspace=workspace)
    experiment_id = namespace.default_experiment_id()
    store = mlflow_server.tracking_store()
    run = store.create_run(experiment_id, "agent", 0, [], "browsed-run-7")
    store.log_metric(run.info.run_id, Metric("holdout_auc", 0.81, 0, 0))

    context = chromium.new_context(base_url=live_server.url)
    context.set_default_timeout(30_000)
    page = context.new_page()
    refused: list[str] = []
    page.on(
        "response",
        lambda response: (
            refused.append(f"{response.status} {response.url}")
            if "/mlflow/" in response.url and response.status >= 400
            else None
        ),
    )
    log_in(page, user.username)
    page.goto(mlflow_server.run_ui_url(workspace.slug, run.info.run_id))
    try:
        expect(page.get_by_text("browsed-run-7").first).to_be_visible(timeout=30_000)
        expect(page.get_by_text("holdout_auc").first).to_be_visible(timeout=30_000)
    except AssertionError as exc:
        raise AssertionError(f"refused: {refused}; page: {page.inner_text('body')[:1500]}") from exc
    context.close()
