"""The job page through Django's test client: its curves are chart containers with axes and
units (and an empty state before the first step), the ROC/calibration come from the stored
evaluation, the hyperparameters show the template's defaults under the job's own params, and
the MLflow run is a link when an MLflow UI is configured, else a run id and tracking URI to copy."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from training.models import JobMetric, JobState, TrainingJob
from workspaces.models import Role

pytestmark = pytest.mark.django_db
RUN_ID = "a" * 32


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_job(workspace, **extra) -> TrainingJob:
    fields = {
        "workspace": workspace,
        "name": "ranker-train",
        "template": "fine_ranking",
        "params": {"epochs": 5, "hidden": [128, 64]},
        "state": JobState.SUCCEEDED,
        "mlflow_run_id": RUN_ID,
        "metrics": {
            "holdout": {"auc": 0.73, "logloss": 0.4, "rows": 100},
            "roc": [[0.0, 0.0], [0.3, 0.7], [1.0, 1.0]],
            "calibration": [{"predicted": 0.05, "observed": 0.06, "count": 50}],
        },
    }
    fields.update(extra)
    return TrainingJob.objects.create(**fields)


def _figure(html: str, chart: str) -> str:
    match = re.search(rf'<figure [^>]*data-chart="{chart}".*?</figure>', html, re.S)
    assert match, f"no chart {chart}"
    return match.group(0)


def _data(html: str, chart: str) -> dict:
    match = re.search(
        rf'<script id="chart-data-{chart}" type="application/json">(.*?)</script>', html, re.S
    )
    assert match, f"no data for chart {chart}"
    return json.loads(match.group(1))


def _page(workspace, members, job) -> str:
    response = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/training/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_curves_have_axes_units_and_an_empty_state_before_the_first_step(workspace, members):
    job = make_job(workspace, state=JobState.PENDING, metrics={}, mlflow_run_id="")
    html = _page(workspace, members, job)
    for chart, y_label in (("loss", "Loss"), ("auc", "AUC"), ("rate", "Samples / s")):
        figure = _figure(html, chart)
        assert 'data-x-label="Training step"' in figure and f'data-y-label="{y_label}"' in figure
        assert "<figcaption>" in figure
        assert '<p class="chart-empty" data-testid="chart-empty">No data yet:' in figure
    assert 'data-units="samples/s"' in _figure(html, "rate")
    assert 'data-testid="evaluation"' not in html  # no held-out evaluation before it ran
    assert "js/charts.js" in html


def test_curves_and_evaluation_charts_carry_the_job_data(workspace, members):
    job = make_job(workspace)
    JobMetric.objects.bulk_create(
        JobMetric(workspace=workspace, job=job, step=step, name="loss", value=1.0 / step)
        for step in (1, 2, 3)
    )
    html = _page(workspace, members, job)
    loss = _data(html, "loss")
    assert loss["x"] == [1, 2, 3] and loss["series"][0]["values"] == pytest.approx([1, 0.5, 1 / 3])
    # live charts keep the empty state for the script, hidden while there are points
    assert 'data-testid="chart-empty" hidden>' in _figure(html, "loss")
    assert 'data-testid="chart-empty">' in _figure(html, "auc")
    roc = _figure(html, "roc")
    assert 'data-testid="roc"' in roc and 'data-x-label="False positive rate"' in roc
    assert 'data-x-range="0,1"' in roc and "No data yet" not in roc
    assert _data(html, "roc")["series"][0]["values"] == [0.0, 0.7, 1.0]
    assert _data(html, "calibration")["x"][:2] == [0.0, 0.05]


def test_hyperparameters_fill_in_the_template_defaults(workspace, members):
    html = _page(workspace, members, make_job(workspace))
    section = html.split('data-testid="hyperparameters"')[1].split("</section>")[0]
    epochs = section.split('data-param="epochs"')[1].split("</tr>")[0]
    assert 'data-source="set"' in epochs and "<code>5</code>" in epochs
    hidden = section.split('data-param="hidden"')[1].split("</tr>")[0]
    assert "<code>128, 64</code>" in hidden and 'data-source="set"' in hidden
    dropout = section.split('data-param="dropout"')[1].split("</tr>")[0]
    assert 'data-source="default"' in dropout and "template default" in dropout
    assert 'data-param="batch_size"' in section  # a common param every template reads


def test_entry_point_job_shows_only_its_params(workspace, members):
    job = make_job(workspace, template="", entry_point="my-model", params={"depth": 3})
    section = _page(workspace, members, job).split('data-testid="hyperparameters"')[1]
    section = section.split("</section>")[0]
    assert re.findall(r'data-param="([^"]+)"', section) == ["depth"]


def test_mlflow_run_links_to_the_configured_ui(workspace, members, settings):
    settings.MLFLOW_UI_URL = "http://localhost:5000/"
    html = _page(workspace, members, make_job(workspace))
    link = re.search(r'<a href="([^"]+)"[^>]*data-testid="mlflow-link"', html)
    assert link and link.group(1) == f"http://localhost:5000/#/runs/{RUN_ID}"


def test_without_a_configured_ui_the_run_links_to_the_platforms_own_mlflow(
    workspace, members, settings
):
    settings.MLFLOW_UI_URL = ""
    settings.MLFLOW_TRACKING_URI = "sqlite:////srv/mlflow/mlflow.db"
    html = _page(workspace, members, make_job(workspace))
    link = re.search(r'<a href="([^"]+)"[^>]*data-testid="mlflow-link"', html)
    assert link and link.group(1) == f"/mlflow/w/{workspace.slug}/#/runs/{RUN_ID}"


def test_without_an_mlflow_ui_the_run_id_and_tracking_uri_are_there_to_copy(
    workspace, members, settings
):
    settings.MLFLOW_UI_URL = ""
    settings.MLFLOW_TRACKING_URI = "http://mlflow:5000"
    html = _page(workspace, members, make_job(workspace))
    run = html.split('data-testid="mlflow-run"')[1].split("</p>")[0]
    assert 'data-testid="mlflow-link"' not in run
    assert f'<code id="mlflow-run-id">{RUN_ID}</code>' in run
    assert '<code id="mlflow-tracking-uri">http://mlflow:5000</code>' in run
    assert 'data-copy="mlflow-run-id"' in run and "mlflow ui --backend-store-uri" in run


@pytest.mark.django_db
def test_the_eta_reads_in_words(workspace, client):
    from training.models import JobState, TrainingJob
    from workspaces.models import Role
    from workspaces.testing.factories import make_member

    job = TrainingJob.objects.create(
        workspace=workspace, name="long", template="logreg", state=JobState.RUNNING, eta_s=11520
    )
    client.force_login(make_member(workspace, Role.VIEWER))
    page = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/").content.decode()
    assert '<span data-field="eta_s">3 h 12 min</span>' in page
    listing = client.get(f"/w/{workspace.slug}/training/").content.decode()
    assert "3 h 12 min" in listing and "11520 s" not in listing


@pytest.mark.django_db
def test_the_job_page_shows_early_stopping_calibration_and_ece(workspace, client):
    from training.models import JobState, TrainingJob
    from workspaces.models import Role
    from workspaces.testing.factories import make_member

    job = TrainingJob.objects.create(
        workspace=workspace,
        name="stopped",
        template="fine_ranking",
        state=JobState.SUCCEEDED,
        metrics={
            "holdout": {"auc": 0.74, "logloss": 0.22, "ece": 0.0187, "rows": 1200},
            "best_epoch": 1,
            "stopped_early": True,
            "validation": {
                "rows": 480,
                "logloss": 0.1644,
                "ece": 0.0171,
                "uncalibrated_logloss": 0.1646,
                "uncalibrated_ece": 0.0211,
                "calibration": "temperature",
                "temperature": 1.036,
                "early_stopping_metric": "logloss",
            },
        },
    )
    client.force_login(make_member(workspace, Role.VIEWER))
    page = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/").content.decode()
    assert '<td data-testid="ece">0.0187</td>' in page
    assert "best logloss at epoch 1, stopped early" in page
    assert "temperature 1.036" in page and "0.1646 → 0.1644" in page
    assert 'data-chart="val"' in page


@pytest.mark.parametrize(
    ("template", "validation_rows", "params", "hinted"),
    [
        ("fine_ranking", 20, {}, True),
        ("lightgbm", 999, {"cv_folds": 0}, True),
        ("fine_ranking", 1000, {}, False),  # enough rows
        ("fine_ranking", 20, {"cv_folds": 5}, False),  # already cross-fitted
        ("two_tower", 20, {}, False),  # a template without cv_folds
    ],
)
def test_a_job_validated_on_few_rows_is_pointed_at_cv_folds(
    workspace, members, template, validation_rows, params, hinted
):
    job = make_job(
        workspace,
        template=template,
        params=params,
        metrics={
            "holdout": {"auc": 0.7, "logloss": 0.5, "rows": 40},
            "validation": {"rows": validation_rows, "logloss": 0.5, "calibration": "temperature"},
        },
    )
    html = _page(workspace, members, job)
    hint = re.search(r'<p [^>]*data-testid="cv-hint">(.*?)</p>', html, re.S)
    assert bool(hint) is hinted
    if hinted:
        assert f"only {validation_rows} rows" in hint.group(1)
        assert "cv_folds = 5" in hint.group(1)
