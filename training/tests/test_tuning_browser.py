"""A person tunes a model in Chromium: from the job list to the Tune form (the search space
follows the picked template), submit, and watch the tuning job's page fill in as its trials run
(here by the node agent in the test's thread): the trials table sorts by value, the validation
curves are drawn, the parameter importances show."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import expect

from training import agent, tuning
from training.models import JobState, TuningJob, TuningState, TuningTrial
from training.tests.factories import make_demo_dataset, make_node, place
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIXED = '{"epochs": 2, "batch_size": 256, "threads": 1, "importance": false}'


def _run_trials(tj: TuningJob) -> None:
    """What the scheduler, the node agent and the controller's wake-ups do, in this thread."""
    node = make_node()
    while tuning.tuning_job_advance(tj.pk) == TuningState.RUNNING:
        for trial in TuningTrial.objects.for_workspace(tj.workspace).filter(tuning_job=tj):
            job = trial.job
            if job.state == JobState.PENDING:
                place(job, node)
            if not job.is_terminal:
                agent.execute_job(job.pk)


def test_tune_from_the_job_list_and_read_the_trials(page, workspace):
    user = make_member(workspace, Role.DEVELOPER, username="tuner-ui")
    dataset = make_demo_dataset(workspace, scale=0.02)
    log_in(page, user.username)

    page.goto(f"/w/{workspace.slug}/training/")
    page.get_by_test_id("new-job").wait_for()
    page.locator('.content [data-testid="new-tuning"]').click()
    page.wait_for_url("**/training/tuning/new/")
    page.wait_for_load_state("load")  # the form's script listens to the template select
    space = page.locator("textarea[name=space]")
    assert '"embedding_dim"' in space.input_value()  # fine_ranking's default
    page.select_option("select[name=template]", "logreg")
    # logreg's default space: its convex fit's penalty, vocabulary and numeric encoding
    assert '"embedding_dim"' not in space.input_value() and '"l2"' in space.input_value()
    page.fill("input[name=name]", "tune-in-browser")
    page.select_option("select[name=dataset]", str(dataset.pk))
    page.fill("textarea[name=params]", FIXED)
    page.fill("input[name=n_trials]", "3")
    page.get_by_role("button", name="Start tuning").click()

    expect(page.get_by_test_id("tuning-state")).to_have_text("queued")
    expect(page.get_by_test_id("trials")).to_contain_text("No trials yet")
    tj = TuningJob.objects.for_workspace(workspace).get(name="tune-in-browser")
    assert tj.n_trials == 3 and tj.template == "logreg" and tj.created_by == user
    _run_trials(tj)

    # The page refreshes itself while the tuning job runs; once done it shows everything.
    expect(page.get_by_test_id("tuning-state")).to_have_text("succeeded", timeout=30_000)
    expect(page.get_by_test_id("trials-done")).to_have_text("3")
    rows = page.locator("table[data-testid=trials] tbody tr")
    expect(rows).to_have_count(3)
    curves = page.get_by_test_id("trial-curves")
    expect(curves).to_have_attribute("data-drawn", "true")
    expect(curves.locator("canvas")).to_have_count(1)
    expect(curves).to_contain_text("Epoch")
    expect(page.get_by_test_id("importances").locator("tr[data-param]")).to_have_count(3)
    expect(page.get_by_test_id("best")).to_contain_text("registered as tune-in-browser v1")

    def values() -> list[float]:
        return [float(v) for v in rows.evaluate_all("rs => rs.map(r => r.dataset.value)")]

    heading = page.locator("th[data-sort=value] button")
    heading.click()
    assert values() == sorted(values())
    heading.click()
    assert values() == sorted(values(), reverse=True)
    expect(page.locator("th[data-sort=value]")).to_have_attribute("aria-sort", "descending")
    shot = os.environ.get("RANKOPS_SCREENSHOT_DIR")
    if shot:
        page.screenshot(path=f"{shot}/tuning-page.png", full_page=True)
