"""A developer's journey in a real browser: log in, open the training jobs page, submit a job
through the new-job form (its resources filled in from the scheduler's recommendation for the
picked template, its param fields generated from that template's schema) and land on the job's
page, which shows it waiting for the scheduler. The test makes no API call of its own, and the
pages make none either."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from training.models import JobState, TrainingJob
from training.scheduler.recommend import recommend
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_developer_submits_a_job_through_the_form(page, workspace):
    user = make_member(workspace, Role.DEVELOPER, username="dev-journey")
    dataset = make_demo_dataset(workspace, scale=0.01)
    # A finished logreg job with recorded usage: the scheduler recommends from it.
    TrainingJob.objects.create(
        workspace=workspace,
        name="past",
        template="logreg",
        dataset=dataset,
        state=JobState.SUCCEEDED,
        usage={"cpu_peak_milli": 1500, "memory_peak_mb": 700},
    )
    rec = recommend(workspace=workspace, template="logreg", dataset=dataset)
    api_calls: list[str] = []
    page.on("request", lambda r: api_calls.append(r.url) if "/api/" in r.url else None)

    log_in(page, user.username)
    page.goto(f"/w/{workspace.slug}/training/")
    page.get_by_test_id("new-job").click()

    form = page.get_by_test_id("job-form")
    form.get_by_label("Name").fill("journey-1")
    form.get_by_label("Dataset").select_option(str(dataset.pk))
    form.get_by_label("Template or entry point").select_option("template:logreg")
    # the scheduler's recommendation fragment follows the picked template
    expect(page.get_by_test_id("resource-recommendation")).to_contain_text("logreg")
    expect(form.get_by_label("CPU (milli-cores)")).to_have_value(str(rec["cpu_milli"]))
    expect(form.get_by_label("Memory (MiB)")).to_have_value(str(rec["memory_mb"]))
    # the param fields follow the picked template (generated from its schema, defaults filled)
    params = page.get_by_test_id("job-params")
    expect(params).to_have_attribute("data-template", "logreg")
    expect(form.get_by_label("Epochs")).to_have_value("2")
    expect(form.get_by_label("Learning rate")).to_have_value("0.01")
    form.get_by_label("Epochs").fill("1")
    form.get_by_label("Priority class").select_option("exploration")
    form.get_by_role("button", name="Submit job").click()

    expect(page).to_have_url(re.compile(rf"/w/{workspace.slug}/training/jobs/\d+/$"))
    expect(page.locator("h1")).to_contain_text("journey-1")
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^(pending|admitted|placed)$"))
    job = TrainingJob.objects.for_workspace(workspace).exclude(name="past").get()
    assert page.url.endswith(f"/training/jobs/{job.pk}/")
    assert (job.name, job.template, job.dataset_id) == ("journey-1", "logreg", dataset.pk)
    assert job.state in {JobState.PENDING, JobState.ADMITTED, JobState.PLACED}
    assert job.params == {"epochs": 1} and job.priority_class == "exploration"
    assert (job.cpu_milli, job.memory_mb) == (rec["cpu_milli"], rec["memory_mb"]) != (1000, 1024)
    assert job.created_by_id == user.pk
    assert api_calls == []
