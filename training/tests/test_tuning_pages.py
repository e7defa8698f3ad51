"""The tuning pages (Django test client): the Tune form shows the template's default space and
creates through the service; bad input comes back next to its field and creates nothing; a
job's page links to the form prefilled from that job; the tuning job's page shows its trials,
their curves and the importances, or says what to do while there are none."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from training import tuning
from training.models import TrialState, TuningJob, TuningTrial
from training.services import job_create
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
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


def _new_url(workspace) -> str:
    return reverse("training-tuning-new", kwargs={"ws": workspace.slug})


def _form(dataset, **extra) -> dict:
    return {
        "name": "tune-ui",
        "template": "logreg",
        "dataset": str(dataset.pk),
        "space": json.dumps({"lr": {"low": 0.001, "high": 0.1, "log": True}}),
        "params": '{"epochs": 2}',
        "metric": "logloss",
        "pruner": "median",
        "n_trials": "4",
        "parallelism": "2",
        "seed": "0",
        "cpu_milli": "1000",
        "memory_mb": "1024",
        "priority_class": "experiment",
        **extra,
    }


def test_the_form_shows_the_default_space_and_creates(client, developer, workspace, dataset):
    page = client.get(_new_url(workspace))
    assert page.status_code == 200
    shown = page.context["form"].initial["space"]
    assert json.loads(shown) == tuning.default_space_json("fine_ranking")
    assert 'id="default-spaces"' in page.content.decode()
    response = client.post(_new_url(workspace), _form(dataset))
    created = TuningJob.objects.for_workspace(workspace).get()
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "training-tuning-job", kwargs={"ws": workspace.slug, "pk": created.pk}
    )
    assert created.n_trials == 4 and created.space["lr"]["log"] is True
    assert created.params == {"epochs": 2} and created.created_by == developer


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"space": '{"depth": {"low": 1, "high": 3}}'}, "space", "space.depth: unknown param"),
        ({"space": "{not json"}, "space", "not valid JSON"),
        ({"params": '{"lr": 0.1}'}, "params", "searched in the space"),
        ({"n_trials": "0"}, "n_trials", "from 1 to 200"),
        ({"template": "nope"}, "template", "use one of"),
    ],
)
def test_bad_input_is_shown_next_to_its_field(client, developer, workspace, dataset, extra,
                                              field, says):  # fmt: skip
    response = client.post(_new_url(workspace), _form(dataset, **extra))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and says in " ".join(errors[field]), errors
    assert f'data-error-for="{field}"' in response.content.decode()
    assert not TuningJob.objects.for_workspace(workspace).exists()


def test_a_viewer_cannot_open_the_form(client, workspace, dataset):
    client.force_login(make_member(workspace, Role.VIEWER))
    assert client.get(_new_url(workspace)).status_code == 403
    assert client.post(_new_url(workspace), _form(dataset)).status_code == 403
    assert not TuningJob.objects.for_workspace(workspace).exists()


def test_a_jobs_page_links_to_the_form_copied_from_it(client, developer, workspace, dataset):
    job = job_create(
        actor=None, workspace=workspace, name="base", dataset=dataset, template="deepfm",
        params={"epochs": 3, "lr": 0.02}, cpu_milli=1500,
    )  # fmt: skip
    page = client.get(reverse("training-job", kwargs={"ws": workspace.slug, "pk": job.pk}))
    link = f"{_new_url(workspace)}?base_job={job.pk}"
    assert link in page.content.decode()
    form = client.get(link).context["form"]
    assert form.initial["template"] == "deepfm" and form.initial["cpu_milli"] == 1500
    assert json.loads(form.initial["params"]) == {"epochs": 3}  # lr is searched
    assert json.loads(form.initial["space"]) == tuning.default_space_json("deepfm")
    assert client.get(f"{_new_url(workspace)}?base_job=999999").status_code == 404


def test_the_tuning_page_before_and_after_trials(client, developer, workspace, dataset,
                                                 other_workspace):  # fmt: skip
    tj = tuning.tuning_job_create(
        actor=None, workspace=workspace, name="shown", dataset=dataset, template="logreg",
        n_trials=3, dispatch=False,
    )  # fmt: skip
    url = reverse("training-tuning-job", kwargs={"ws": workspace.slug, "pk": tj.pk})
    empty = client.get(url).content.decode()
    assert "No trials yet" in empty and 'data-testid="importances-empty"' in empty
    assert "No data yet: each trial" in empty
    tuning.tuning_job_advance(tj.pk)
    trials = list(TuningTrial.objects.for_workspace(workspace).filter(tuning_job=tj))
    # What the controller would have read from two finished trial jobs.
    for trial, value in zip(trials, (0.41, 0.37), strict=True):
        TuningTrial.objects.for_workspace(workspace).filter(pk=trial.pk).update(
            state=TrialState.COMPLETE, value=value, intermediate=[[1, value + 0.1], [2, value]]
        )
    page = client.get(url)
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('data-trial="') == 2 and 'data-value="0.37"' in html
    chart = page.context["curve_chart"]
    assert chart["x"] == [1.0, 2.0] and [s["label"] for s in chart["series"]] == [
        "Trial 0",
        "Trial 1",
    ]
    assert "Epoch" in html and "Validation logloss" in html
    names = [name for name, _value, _share in page.context["importances"]]
    assert set(names) == {"l2", "vocab_min_count", "numeric_transform"}  # logreg's default space
    assert 'data-testid="importances-empty"' not in html
    listing = client.get(reverse("training-tuning", kwargs={"ws": workspace.slug}))
    assert f'data-tuning="{tj.pk}"' in listing.content.decode()
    # Another workspace's tuning job: not found, like a missing one.
    theirs = tuning.tuning_job_create(
        actor=None, workspace=other_workspace, name="theirs",
        dataset=make_demo_dataset(other_workspace, scale=0.01), template="logreg", dispatch=False,
    )  # fmt: skip
    other_url = reverse("training-tuning-job", kwargs={"ws": workspace.slug, "pk": theirs.pk})
    assert client.get(other_url).status_code == 404


def test_cancel_from_the_page(client, developer, workspace, dataset):
    tj = tuning.tuning_job_create(
        actor=None, workspace=workspace, name="stop-me", dataset=dataset, template="logreg",
        dispatch=False,
    )  # fmt: skip
    tuning.tuning_job_advance(tj.pk)
    url = reverse("training-tuning-cancel", kwargs={"ws": workspace.slug, "pk": tj.pk})
    assert client.post(url).status_code == 302
    tj.refresh_from_db()
    assert tj.state == "cancelled"
    again = client.post(url, follow=True)
    assert "already cancelled" in again.content.decode()


def test_the_form_takes_a_refit_and_names_a_bad_one(client, developer, workspace, dataset):
    bad = client.post(_new_url(workspace), _form(dataset, refit_cv_folds="40"))
    assert bad.status_code == 400
    assert "from 0 to 20" in " ".join(bad.context["form"].errors["refit_cv_folds"])
    assert 'data-error-for="refit_cv_folds"' in bad.content.decode()
    assert not TuningJob.objects.for_workspace(workspace).exists()
    response = client.post(_new_url(workspace), _form(dataset, refit_cv_folds="5"))
    assert response.status_code == 302
    created = TuningJob.objects.for_workspace(workspace).get()
    assert created.refit_cv_folds == 5 and created.refit_job is None
    page = client.get(response["Location"]).content.decode()
    assert 'data-testid="refit"' in page and "cv_folds=5" in page
