"""The training pages in a real browser: the job list's progress bar and the job page's loss
curve move while a job runs; when it ends the page shows the evaluation plots."""

from __future__ import annotations

import threading

import pytest
from playwright.sync_api import expect

from training import agent
from training.models import TrainingJob
from training.services import job_create
from training.tests.factories import FAST, make_demo_dataset, make_node, place
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_live_progress_and_curves(chromium, live_server, workspace):
    user = make_member(workspace, Role.VIEWER, username="viewer-ui")
    dataset = make_demo_dataset(workspace, scale=0.05)
    job = job_create(
        actor=None,
        workspace=workspace,
        name="live",
        dataset=dataset,
        template="fine_ranking",
        params={**FAST, "epochs": 4, "batch_size": 32, "step_sleep_s": 0.04},
    )
    place(job, make_node())
    context = chromium.new_context(base_url=live_server.url)
    context.set_default_timeout(30_000)
    page = context.new_page()
    log_in(page, user.username)

    def run() -> None:
        from django.db import connection

        try:
            agent.execute_job(job.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        page.goto(f"/w/{workspace.slug}/training/")
        row = page.locator(f'tr[data-job="{job.pk}"]')
        expect(row.locator('[data-field="state"]')).to_have_text("running")
        bar = f'tr[data-job="{job.pk}"] [data-field="progress"]'
        page.wait_for_function(
            f"() => {{ const b = document.querySelector('{bar}');"
            " return b && parseFloat(b.style.width) > 0; }"
        )
        page.get_by_role("link", name=f"live #{job.pk}").click()
        # The loss curve is drawn by uPlot (a canvas with its axes) as the job reports steps.
        loss = page.locator('[data-chart="loss"]')
        expect(loss).to_have_attribute("data-drawn", "true", timeout=60_000)
        expect(loss.locator("canvas")).to_have_count(1)
        expect(loss.locator(".u-axis")).to_have_count(2)
        # When the job ends the page reloads itself and shows the evaluation.
        roc = page.locator('[data-testid="roc"]')
        expect(roc.locator("canvas")).to_have_count(1, timeout=60_000)
        expect(page.locator("#job-state")).to_have_text("succeeded")
    finally:
        thread.join(120)
        context.close()
    assert TrainingJob.objects.for_workspace(workspace).get(pk=job.pk).state == "succeeded"
