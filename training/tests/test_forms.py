"""The training pages' forms (Django test client): a new job, a new pipeline run, a retry.
Each form's valid post creates through the service and redirects; an invalid one shows the
error next to its field and creates nothing; a viewer is refused and nothing is written."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from training import services
from training.forms import JobCreateForm
from training.models import JobState, Pipeline, PipelineRun, RunState, StageRun, TrainingJob
from training.pipelines import pipeline_create, pipeline_run_start
from training.scheduler.recommend import recommend
from training.tests.factories import make_demo_dataset
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.01)


@pytest.fixture
def developer(client, workspace):
    user = make_member(workspace, Role.DEVELOPER)
    client.force_login(user)
    return user


@pytest.fixture
def viewer(client, workspace):
    user = make_member(workspace, Role.VIEWER)
    client.force_login(user)
    return user


def _defaults(workspace, template):
    """What the page posts for a template's param fields left at their defaults."""
    form = JobCreateForm(workspace=workspace, initial={"code": f"template:{template}"})
    return {
        bound.html_name: bound.field.prepare_value(bound.initial)
        for bound in form.param_fields
        if bound.initial not in (False, "")  # an unchecked box and blank text send nothing
    }


def _job_post(ready, **overrides):
    body = {
        "name": "ctr-1",
        "dataset": str(ready.pk),
        "code": "template:logreg",
        # the generated fields of the template's schema at their defaults, but Epochs
        **_defaults(ready.workspace, "logreg"),
        "param_epochs": "1",
        "cpu_milli": "500",
        "memory_mb": "512",
        "gpu_count": "0",
        "gpu_milli": "0",
        "gpu_type": "",
        "priority_class": "exploration",
    }
    body.update(overrides)
    return body


def _new_job_url(workspace):
    return reverse("training-job-new", kwargs={"ws": workspace.slug})


def test_job_form_creates_a_pending_job_and_redirects_to_its_page(
    client, workspace, dataset, developer
):
    response = client.post(_new_job_url(workspace), _job_post(dataset))
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "training-job", kwargs={"ws": workspace.slug, "pk": job.pk}
    )
    assert (job.name, job.template, job.entry_point) == ("ctr-1", "logreg", "")
    assert (job.state, job.params, job.priority_class) == (
        JobState.PENDING,
        {"epochs": 1},
        "exploration",
    )
    assert (job.cpu_milli, job.memory_mb, job.created_by) == (500, 512, developer)
    assert Event.objects.for_workspace(workspace).filter(verb="training.job.created").count() == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # a choice outside the list: the error names the allowed values
        (
            "code",
            "template:nope",
            "use one of: template:deepfm, template:fine_ranking, template:lightgbm, "
            "template:logreg",
        ),
        ("priority_class", "urgent", "use one of: production, experiment, exploration"),
        # a template's generated param fields: the allowed values next to the field
        ("param_epochs", "0", "Give a whole number from 1 to 1000 (the workspace's limit)."),
        ("param_epochs", "two", "Give a whole number from 1 to 1000"),
        ("param_lr", "-1", "Give a number from 0 to 10."),
        ("param_batch_size", "2.5", "Give a whole number from 1 to 1000000."),
        # the service's own rules, shown next to the field they name
        ("cpu_milli", "0", "must be a positive integer"),
        ("gpu_milli", "1500", "a fraction of one GPU: 1-999"),
        ("workers", "0", "data-parallel ranks: an integer 1-16"),
        ("workers", "2", "the lbfgs solver (give solver adam for data-parallel ranks)"),
        ("name", "Bad Name!", ""),
    ],
)
def test_job_form_shows_field_errors_and_creates_nothing(
    client, workspace, dataset, developer, field, value, message
):
    response = client.post(_new_job_url(workspace), _job_post(dataset, **{field: value}))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert message in " ".join(errors[field])
    html = response.content.decode()
    assert f'data-error-for="{field}"' in html
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_job_form_offers_only_ready_datasets_of_the_workspace(
    client, workspace, other_workspace, dataset, developer
):
    foreign = make_demo_dataset(other_workspace, scale=0.01)
    response = client.post(_new_job_url(workspace), _job_post(dataset, dataset=str(foreign.pk)))
    assert response.status_code == 400
    assert f"use one of: {dataset.pk}" in " ".join(response.context["form"].errors["dataset"])
    assert not TrainingJob.objects.unscoped().exists()


def test_job_form_prefills_resources_from_the_recommendation(client, workspace, dataset, developer):
    # A finished fine_ranking (the first template offered) job with recorded usage.
    TrainingJob.objects.create(
        workspace=workspace,
        name="past",
        template="fine_ranking",
        dataset=dataset,
        state=JobState.SUCCEEDED,
        usage={"cpu_peak_milli": 1500, "memory_peak_mb": 700},
    )
    rec = recommend(workspace=workspace, template="fine_ranking", dataset=dataset)
    assert rec["based_on_jobs"] == 1 and rec["cpu_milli"] != 1000
    response = client.get(_new_job_url(workspace))
    assert response.status_code == 200
    html = response.content.decode()
    assert f'name="cpu_milli" value="{rec["cpu_milli"]}"' in html
    assert f'name="memory_mb" value="{rec["memory_mb"]}"' in html
    # the first template's param fields, generated from its schema with their defaults
    assert 'data-template="fine_ranking"' in html
    assert 'name="param_embedding_dim" value="8"' in html
    # the scheduler's fragment the page fetches when the template changes
    fragment = client.get(
        reverse("scheduler-recommendation", kwargs={"ws": workspace.slug}),
        {"template": "fine_ranking", "dataset": dataset.pk},
    )
    assert f'data-value="{rec["cpu_milli"]}"' in fragment.content.decode()


# --- the param fields generated from the template's schema --------------------------------------


def _params_fragment(client, workspace, code):
    url = reverse("training-job-new-params", kwargs={"ws": workspace.slug})
    return client.get(url, {"code": code})


def test_the_form_generates_one_field_per_param_of_the_picked_template(
    client, workspace, dataset, developer
):
    response = client.get(_new_job_url(workspace), {"code": "template:fine_ranking"})
    assert response.status_code == 200
    form = response.context["form"]
    assert form.template == "fine_ranking"
    names = [bound.name for bound in form.param_fields]
    assert {"param_epochs", "param_lr", "param_hidden", "param_cross_layers"} <= set(names)
    assert "params" not in {bound.name for bound in form.param_fields}
    html = response.content.decode()
    # a number input with its bounds, prefilled with the default
    assert '<input type="number" name="param_epochs" value="2" min="1" max="1000" step="1"' in html
    assert 'name="param_lr" value="0.01" min="0" max="10" step="any"' in html
    # a checkbox, checked by default; a list as text; the help says what is allowed
    assert re.search(r'<input type="checkbox" name="param_epoch_eval"[^>]* checked>', html)
    assert 'name="param_hidden" value="64, 32"' in html
    assert "Whole numbers separated by commas, each from 1 to 4096. Default: 64, 32." in html
    # the template's own params come first; tuning few jobs need is folded away
    assert names[:4] == [
        "param_embedding_dim",
        "param_cross_layers",
        "param_hidden",
        "param_dropout",
    ]
    folded = html.split('data-testid="advanced-params">')[1].split("</details>")[0]
    assert 'name="param_device"' in folded and 'name="param_epochs"' not in folded
    # the free JSON params are for entry points only
    assert 'name="params"' not in html
    # the template select swaps the fields with htmx
    assert f'hx-get="/w/{workspace.slug}/training/jobs/new/params/"' in html


def test_the_params_fragment_follows_the_template_and_entry_points_get_free_params(
    client, workspace, dataset, developer
):
    logreg = _params_fragment(client, workspace, "template:logreg").content.decode()
    assert 'data-template="logreg"' in logreg and 'name="param_epochs" value="2"' in logreg
    assert "param_embedding_dim" not in logreg  # fine_ranking's own param
    tower = _params_fragment(client, workspace, "template:two_tower").content.decode()
    assert 'name="param_tower_dim" value="32"' in tower
    services.entry_point_register(
        actor=None, workspace=workspace, name="my-model", module="training.templates.logreg"
    )
    entry = _params_fragment(client, workspace, "entry_point:my-model").content.decode()
    assert 'name="params"' in entry and "param_epochs" not in entry


def test_template_params_changed_from_their_defaults_are_sent(
    client, workspace, dataset, developer
):
    body = {
        **_job_post(dataset, code="template:fine_ranking"),
        **_defaults(workspace, "fine_ranking"),
        "param_epochs": "1",
        "param_hidden": "128, 64",
        "param_dropout": "0.1",
        "param_scheduler__auto_recommend": "on",
        "param_device": "",  # blank: the default ("auto"), not sent
        "param_batch_size": "",
    }
    body.pop("param_epoch_eval")  # unchecked
    response = client.post(_new_job_url(workspace), body)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert job.params == {
        "epochs": 1,
        "hidden": [128, 64],
        "dropout": 0.1,
        "epoch_eval": False,
        "scheduler": {"auto_recommend": True},
    }


LAYERS = "whole numbers separated by commas, each from 1 to 4096"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("param_hidden", "64, wide", f"Give {LAYERS}."),
        ("param_hidden", "64, 0", f"Give {LAYERS}."),
        ("param_dropout", "0.95", "Give a number from 0 to 0.9."),
        ("param_cross_layers", "9", "Give a whole number from 0 to 8."),
        ("param_threads", "999", "Give a whole number from 0 to 256."),
    ],
)
def test_a_template_param_out_of_its_schema_is_shown_next_to_its_field(
    client, workspace, dataset, developer, field, value, message
):
    body = _job_post(dataset, code="template:fine_ranking", **_defaults(workspace, "fine_ranking"))
    response = client.post(_new_job_url(workspace), {**body, field: value})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert errors[field] == [message]
    html = response.content.decode()
    assert f'data-error-for="{field}"' in html
    # the folded params open when one of them is wrong
    assert ('data-testid="advanced-params" open>' in html) == (field == "param_threads")
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_a_template_job_takes_no_free_json_params(client, workspace, dataset, developer):
    response = client.post(_new_job_url(workspace), _job_post(dataset, params='{"depth": 3}'))
    assert response.status_code == 400
    assert "free JSON params are for entry points" in " ".join(
        response.context["form"].non_field_errors()
    )
    assert not TrainingJob.objects.for_workspace(workspace).exists()


@pytest.fixture
def entry_point(workspace):
    return services.entry_point_register(
        actor=None, workspace=workspace, name="my-model", module="training.templates.logreg"
    )


def test_an_entry_point_job_takes_free_json_params(
    client, workspace, dataset, developer, entry_point
):
    body = _job_post(dataset, code="entry_point:my-model", params='{"depth": 3, "epochs": 1}')
    response = client.post(_new_job_url(workspace), body)
    assert response.status_code == 302
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert (job.entry_point, job.params) == ("my-model", {"depth": 3, "epochs": 1})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1, 2]", "params must be a JSON object"),
        ("{epochs", "not valid JSON"),
        # the shared params keep their rules for entry points too
        ('{"epochs": 0}', "params.epochs: Give a whole number from 1 to 1000"),
    ],
)
def test_an_entry_point_jobs_bad_params_are_shown_next_to_the_field(
    client, workspace, dataset, developer, entry_point, value, message
):
    body = _job_post(dataset, code="entry_point:my-model", params=value)
    response = client.post(_new_job_url(workspace), body)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["params"]
    assert message in " ".join(errors["params"])
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_viewer_sees_no_create_button_and_is_refused(client, workspace, dataset, viewer):
    page = client.get(reverse("training-jobs", kwargs={"ws": workspace.slug}))
    assert page.status_code == 200
    assert 'data-testid="new-job"' not in page.content.decode()
    assert client.get(_new_job_url(workspace)).status_code == 403
    assert client.post(_new_job_url(workspace), _job_post(dataset)).status_code == 403
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_developer_sees_the_create_button(client, workspace, developer):
    page = client.get(reverse("training-jobs", kwargs={"ws": workspace.slug}))
    assert 'data-testid="new-job"' in page.content.decode()


# --- pipelines ---------------------------------------------------------------------------------


@pytest.fixture
def pipeline(workspace):
    return pipeline_create(actor=None, workspace=workspace, name="daily")


def _run_url(workspace):
    return reverse("training-pipeline-run-new", kwargs={"ws": workspace.slug})


def test_pipeline_run_form_starts_a_run(client, workspace, dataset, pipeline, developer):
    response = client.post(
        _run_url(workspace),
        {"pipeline": "daily", "dataset": dataset.name, "params": '{"train.epochs": 1}'},
    )
    assert response.status_code == 302
    run = PipelineRun.objects.for_workspace(workspace).get()
    assert run.pipeline == pipeline and run.state == RunState.RUNNING
    assert run.params == {"dataset": dataset.name, "train.epochs": 1}
    assert [s.name for s in run.stage_runs.order_by("position")] == [
        s["name"] for s in pipeline.stages
    ]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"pipeline": "weekly"}, "pipeline", "use one of: daily"),
        ({"pipeline": "daily", "params": "[]"}, "params", "must be a JSON object"),
        ({"pipeline": "daily", "dataset": "nope"}, "dataset", "use one of: "),
        # the API's dataset check ("params.dataset_id"), next to params
        ({"pipeline": "daily", "params": '{"dataset_id": 999999}'}, "params", "no such dataset"),
    ],
)
def test_pipeline_run_form_errors_create_nothing(
    client, workspace, dataset, pipeline, developer, body, field, message
):
    response = client.post(_run_url(workspace), body)
    assert response.status_code == 400
    errors = response.context["run_form"].errors
    assert message in " ".join(errors[field])
    assert not PipelineRun.objects.for_workspace(workspace).exists()


def _failed_run(pipeline):
    run = pipeline_run_start(actor=None, pipeline=pipeline, params={}, dispatch=False)
    stages = list(
        StageRun.objects.for_workspace(run.workspace).filter(run=run).order_by("position")
    )
    stages[0].state = RunState.SUCCEEDED
    stages[0].save()
    stages[1].state, stages[1].error = RunState.FAILED, "boom"
    stages[1].save()
    run.state, run.error = RunState.FAILED, "boom"
    run.save()
    return run, stages


def test_retry_reruns_a_failed_run_from_its_failed_stage(client, workspace, pipeline, developer):
    run, stages = _failed_run(pipeline)
    page = client.get(reverse("training-pipelines", kwargs={"ws": workspace.slug}))
    assert 'data-testid="retry-run"' in page.content.decode()
    response = client.post(
        reverse("training-pipeline-run-retry", kwargs={"ws": workspace.slug, "pk": run.pk})
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    states = dict(
        StageRun.objects.for_workspace(workspace).filter(run=run).values_list("name", "state")
    )
    assert states[stages[0].name] == RunState.SUCCEEDED
    assert states[stages[1].name] == RunState.PENDING
    event = Event.objects.for_workspace(workspace).get(verb="training.pipeline_run.retried")
    assert event.payload["from_stage"] == stages[1].name


def test_retry_of_a_run_that_has_not_failed_says_so(client, workspace, pipeline, developer):
    run = pipeline_run_start(actor=None, pipeline=pipeline, params={}, dispatch=False)
    response = client.post(
        reverse("training-pipeline-run-retry", kwargs={"ws": workspace.slug, "pk": run.pk}),
        follow=True,
    )
    assert "not failed" in response.content.decode()
    assert (
        not Event.objects.for_workspace(workspace)
        .filter(verb="training.pipeline_run.retried")
        .exists()
    )


def test_viewer_cannot_start_or_retry_runs(client, workspace, dataset, pipeline, viewer):
    run, _ = _failed_run(pipeline)
    page = client.get(reverse("training-pipelines", kwargs={"ws": workspace.slug})).content
    assert b'data-testid="pipeline-run-form"' not in page
    assert b'data-testid="retry-run"' not in page
    assert b'data-testid="pipeline-create-form"' not in page
    assert client.post(_run_url(workspace), {"pipeline": "daily"}).status_code == 403
    retry = reverse("training-pipeline-run-retry", kwargs={"ws": workspace.slug, "pk": run.pk})
    assert client.post(retry).status_code == 403
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert PipelineRun.objects.for_workspace(workspace).count() == 1
    assert Pipeline.objects.for_workspace(workspace).count() == 1


def test_pipeline_form_creates_one_from_the_default_template(client, workspace, developer):
    url = reverse("training-pipeline-new", kwargs={"ws": workspace.slug})
    assert client.post(url, {"name": "daily"}).status_code == 302
    pipeline = Pipeline.objects.for_workspace(workspace).get()
    assert [s["name"] for s in pipeline.stages] == [
        "build_samples",
        "train",
        "evaluate",
        "register",
    ]
    again = client.post(url, {"name": "daily"})  # a name in use: the conflict, next to name
    assert again.status_code == 400
    assert "exists" in " ".join(again.context["create_form"].errors["name"])
    assert Pipeline.objects.for_workspace(workspace).count() == 1


def test_viewer_cannot_create_a_pipeline(client, workspace, viewer):
    url = reverse("training-pipeline-new", kwargs={"ws": workspace.slug})
    assert client.post(url, {"name": "daily"}).status_code == 403
    assert not Pipeline.objects.for_workspace(workspace).exists()


def test_a_rule_on_one_param_shows_next_to_its_field(workspace, dataset, entry_point):
    """A service error keyed "params.<name>" (as the API's body errors are keyed) goes next to
    the param's own field of a template, and next to the free params of an entry point."""
    from django.core.exceptions import ValidationError

    from training.forms import put_service_errors

    refusal = ValidationError({"params.epochs": "at most 50", "entry_point": "x"})
    form = JobCreateForm(_job_post(dataset), workspace=workspace)
    assert form.is_valid()
    put_service_errors(form, refusal, form.service_fields)
    assert form.errors["param_epochs"] == ["at most 50"]
    assert form.errors["code"] == ["x"]
    body = _job_post(dataset, code="entry_point:my-model", params='{"epochs": 99}')
    form = JobCreateForm(body, workspace=workspace)
    assert form.is_valid()
    put_service_errors(form, refusal, form.service_fields)
    assert form.errors["params"] == ["params.epochs: at most 50"]


def test_a_job_with_data_parallel_workers_from_the_form(client, workspace, dataset, developer):
    body = _job_post(dataset, workers="2", param_solver="adam")
    response = client.post(_new_job_url(workspace), body)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert job.workers == 2 and job.params["solver"] == "adam"
    page = client.get(response["Location"]).content.decode()
    assert '<span data-testid="workers">2 data-parallel workers</span>' in page
