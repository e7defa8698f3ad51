"""Serving pages through Django's test client: the deployment page's charts (axes, units, empty
state) and readable details, a version's held-out evaluation, and two versions side by side
(same or different dataset version, overlaid curves, the parameter diff, bad input, 404s).

Rows are written straight to the database: the pages only read them, no bundle is loaded."""

from __future__ import annotations

import itertools
import json
import re
import uuid

import pytest
from django.test import Client

from features.models import Dataset, DatasetStatus, EntityKind
from features.tests.factories import make_group
from serving.models import (
    Deployment,
    DeploymentChange,
    DeploymentStatus,
    ModelVersion,
    PredictionLog,
    RegisteredModel,
)
from training.models import JobState, TrainingJob
from workspaces.models import Role
from workspaces.testing.markup import markup_problems

pytestmark = pytest.mark.django_db
_n = itertools.count(1)

ROC_A = [[0.0, 0.0], [0.1, 0.4], [0.1, 0.5], [0.5, 0.8], [1.0, 1.0]]
ROC_B = [[0.0, 0.0], [0.2, 0.6], [0.6, 0.9], [1.0, 1.0]]
CALIBRATION = [
    {"predicted": 0.02, "observed": 0.025, "count": 50},
    {"predicted": 0.08, "observed": 0.07, "count": 50},
]


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_dataset(workspace, version: int = 1) -> Dataset:
    group = make_group(
        workspace,
        name=f"labels_{next(_n)}",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    return Dataset.objects.create(
        workspace=workspace,
        name="clicks_sample",
        version=version,
        label_group=group,
        label_columns=["clicked"],
        feature_refs=[],
        status=DatasetStatus.READY,
    )


def make_job(workspace, dataset, *, auc: float, params: dict, roc=ROC_A, production=True):
    metrics = {
        "holdout": {
            "auc": auc,
            "logloss": 0.41,
            "predicted_ctr": 0.05,
            "observed_ctr": 0.048,
            "calibration_ratio": 1.04,
            "rows": 2000,
        },
        "roc": roc,
        "calibration": CALIBRATION,
    }
    if production:
        metrics["production"] = {"auc": 0.70, "logloss": 0.45, "rows": 2000}
        metrics["auc_delta_vs_production"] = auc - 0.70
    return TrainingJob.objects.create(
        workspace=workspace,
        name=f"job-{next(_n)}",
        template="fine_ranking",
        params=params,
        dataset=dataset,
        state=JobState.SUCCEEDED,
        model_path="x",
        metrics=metrics,
    )


def make_version(workspace, model, job=None) -> ModelVersion:
    number = ModelVersion.objects.for_workspace(workspace).filter(model=model).count() + 1
    return ModelVersion.objects.create(
        workspace=workspace,
        model=model,
        version=number,
        job=job,
        dataset=job.dataset if job else None,
        metrics=dict(job.metrics) if job else {},
        artifact_path=f"{workspace.slug}/models/{model.name}/{number}",
    )


@pytest.fixture
def ranker(workspace):
    """Model ``ranker`` with v1 and v2 trained on the same dataset version, v3 on the next."""
    model = RegisteredModel.objects.create(workspace=workspace, name="ranker")
    ds1, ds2 = make_dataset(workspace, 1), make_dataset(workspace, 2)
    v1 = make_version(
        workspace, model, make_job(workspace, ds1, auc=0.74, params={"epochs": 2, "lr": 0.01})
    )
    v2 = make_version(
        workspace,
        model,
        make_job(workspace, ds1, auc=0.76, params={"epochs": 4, "lr": 0.01}, roc=ROC_B),
    )
    v3 = make_version(
        workspace, model, make_job(workspace, ds2, auc=0.75, params={"epochs": 4, "lr": 0.01})
    )
    return model, v1, v2, v3


def _chart(page: str, name: str) -> str:
    """The markup of one chart figure."""
    match = re.search(rf'<figure [^>]*data-chart="{name}".*?</figure>', page, re.S)
    assert match, f"no chart {name}"
    return match.group(0)


def _chart_data(page: str, name: str) -> dict:
    match = re.search(
        rf'<script id="chart-data-{name}" type="application/json">(.*?)</script>', page, re.S
    )
    assert match, f"no data for chart {name}"
    return json.loads(match.group(1))


# -- deployment page ---------------------------------------------------------------------------


def test_deployment_page_charts_have_axes_and_an_empty_state(workspace, members, ranker):
    model, v1, v2, _ = ranker
    dep = Deployment.objects.create(
        workspace=workspace,
        name="web",
        model=model,
        version=v2,
        previous_version=v1,
        scaling={"mode": "load", "target_qps_per_replica": 50, "min": 1, "max": 4},
    )
    DeploymentStatus.objects.create(
        workspace=workspace,
        deployment=dep,
        detail={"processes": [{"pid": 123, "port": 8100, "alive": True}]},
    )
    DeploymentChange.objects.create(
        workspace=workspace,
        deployment=dep,
        kind=DeploymentChange.Kind.SCALE,
        from_version=v2,
        to_version=v2,
        detail={
            "before": {"replicas": 1, "scaling": {"mode": "fixed"}},
            "replicas": 2,
            "scaling": dep.scaling,
        },
    )
    page = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/deployments/web/")
    assert page.status_code == 200
    html = page.content.decode()
    expected = {
        "qps": ('data-x-label="Time (UTC)"', 'data-y-label="Requests / s"', 'data-units="req/s"'),
        "latency": (
            'data-x-label="Latency, upper bound of bucket (ms)"',
            'data-y-label="Requests"',
        ),
        "errors": ('data-x-label="Time (UTC)"', 'data-y-label="Errors / min"'),
        "mix": ('data-x-label="Model version"', 'data-y-label="Requests"'),
    }
    for name, attributes in expected.items():
        figure = _chart(html, name)
        for attribute in attributes:
            assert attribute in figure, (name, attribute)
        assert "<figcaption>" in figure
        assert "No data yet:" in figure and "once the deployment answers" in figure
        assert _chart_data(html, name)["x"] == []
    assert 'data-x-time="true"' in _chart(html, "qps")
    assert "js/charts.js" in html and "js/uplot.iife.min.js" in html
    # no raw Python dicts anywhere: scaling, status and the change's details are readable
    assert "{'" not in html and "{&#x27;" not in html
    assert "By load: 50 req/s per replica, between 1 and 4 replicas" in html
    assert "Replicas 1 → 2" in html and "Scaling: Fixed" in html
    assert "processes 1 / port" in html and "8100" in html
    assert "All traffic goes to production (v2)" in html


def test_deployment_page_with_traffic_draws_instead_of_the_empty_state(workspace, members, ranker):
    model, v1, v2, _ = ranker
    dep = Deployment.objects.create(workspace=workspace, name="web", model=model, version=v2)
    PredictionLog.objects.bulk_create(
        PredictionLog(
            workspace=workspace,
            request_id=uuid.uuid4().hex,
            unit_id=f"u{i}",
            deployment=dep,
            deployment_name=dep.name,
            model_version=v2 if i % 3 else v1,
            latency_ms=3.0 + i % 7,
        )
        for i in range(30)
    )
    html = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/deployments/web/").content
    html = html.decode()
    for name in ("qps", "latency", "mix"):
        assert "No data yet" not in _chart(html, name), name
    qps = _chart_data(html, "qps")
    assert len(qps["x"]) == len(qps["series"][0]["values"]) > 0
    assert qps["series"][0]["values"][-1] == pytest.approx(30 / 60)
    latency = _chart_data(html, "latency")
    assert sum(latency["series"][0]["values"]) == 30
    assert latency["x_labels"][:3] == ["≤ 1 ms", "≤ 2 ms", "≤ 5 ms"]
    mix = _chart_data(html, "mix")
    assert dict(zip(mix["x_labels"], mix["series"][0]["values"], strict=True)) == {
        "v1": 10,
        "v2": 20,
    }


# -- version page ------------------------------------------------------------------------------


def test_version_page_shows_the_held_out_metrics_and_the_production_comparison(
    workspace, members, ranker
):
    html = (
        browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/models/ranker/v2/").content
    ).decode()
    assert re.search(r'data-testid="holdout-auc">0\.7600<', html)
    assert re.search(r'data-testid="holdout-logloss">0\.4100<', html)
    assert re.search(r'data-testid="auc-delta" class="delta-up">\+0\.0600<', html)
    table = html.split('data-testid="holdout-table"')[1].split("</table>")[0]
    assert "Production model (same rows)" in table and "0.7000" in table and "0.4500" in table
    assert "No data yet" not in _chart(html, "roc")
    assert _chart_data(html, "roc")["x"][-1] == 1.0
    assert 'data-x-label="False positive rate"' in _chart(html, "roc")
    assert f"/w/{workspace.slug}/models/ranker/compare/" in html  # the compare form


def test_version_page_links_its_mlflow_run_when_a_ui_is_configured(
    workspace, members, ranker, settings
):
    ModelVersion.objects.unscoped().filter(pk=ranker[2].pk).update(mlflow_run_id="r" * 32)
    url = f"/w/{workspace.slug}/models/ranker/v2/"
    settings.MLFLOW_UI_URL = "http://localhost:5000"
    html = browser(members[Role.VIEWER]).get(url).content.decode()
    assert f'<a href="http://localhost:5000/#/runs/{"r" * 32}"' in html
    settings.MLFLOW_UI_URL = ""  # the platform serves MLflow from its own database store
    html = browser(members[Role.VIEWER]).get(url).content.decode()
    assert f'<a href="/mlflow/w/{workspace.slug}/#/runs/{"r" * 32}"' in html
    settings.MLFLOW_TRACKING_URI = "http://mlflow.internal:5000"  # nothing a browser reaches
    html = browser(members[Role.VIEWER]).get(url).content.decode()
    assert 'data-testid="mlflow-link"' not in html and f"<code>{'r' * 32}</code>" in html


def test_version_without_evaluation_says_so(workspace, members):
    model = RegisteredModel.objects.create(workspace=workspace, name="imported")
    make_version(workspace, model)
    html = (
        browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/models/imported/v1/").content
    ).decode()
    assert 'data-testid="holdout-empty"' in html
    assert "No data yet: the ROC curve will show here once" in _chart(html, "roc")


# -- compare -----------------------------------------------------------------------------------


def test_compare_same_dataset_version(workspace, members, ranker):
    page = browser(members[Role.VIEWER]).get(
        f"/w/{workspace.slug}/models/ranker/compare/", {"a": "1", "b": "2"}
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-same="true"' in html and "same dataset version, clicks_sample v1" in html
    auc_row = html.split('data-metric="AUC"')[1].split("</tr>")[0]
    assert "0.7400" in auc_row and "0.7600" in auc_row and "+0.0200" in auc_row
    assert '<td class="better">0.7600' in auc_row
    roc = _chart_data(html, "compare-roc")
    labels = [s["label"] for s in roc["series"]]
    assert labels == ["v1 TPR", "v2 TPR", "Random (AUC 0.5)"]
    assert all(len(s["values"]) == len(roc["x"]) for s in roc["series"])
    # ROC A has two points at FPR 0.1: the curve keeps the top one
    assert roc["series"][0]["values"][roc["x"].index(0.1)] == 0.5
    assert roc["series"][1]["values"][roc["x"].index(0.1)] is None
    calibration = _chart_data(html, "compare-calibration")
    assert [s["label"] for s in calibration["series"]][:2] == ["v1 observed", "v2 observed"]
    # the parameter diff: epochs changed, lr did not, template defaults are filled in
    diff = html.split('data-testid="param-diff"')[1].split("</section>")[0]
    epochs = diff.split('data-param="epochs"')[1].split("</tr>")[0]
    assert 'data-changed="true"' in epochs and ">2<" in epochs and ">4<" in epochs
    lr = diff.split('data-param="lr"')[1].split("</tr>")[0]
    assert "data-changed" not in lr
    hidden = diff.split('data-param="hidden"')[1].split("</tr>")[0]
    assert "64, 32" in hidden and "(template default)" in hidden


def test_compare_different_dataset_versions_says_they_differ(workspace, members, ranker):
    html = (
        browser(members[Role.VIEWER])
        .get(f"/w/{workspace.slug}/models/ranker/compare/", {"a": "v2", "b": "v3"})
        .content.decode()
    )
    assert 'data-same="false"' in html
    assert "different dataset versions (v2: clicks_sample v1, v3: clicks_sample v2)" in html


def test_compare_defaults_to_the_two_newest_versions(workspace, members, ranker):
    html = (
        browser(members[Role.VIEWER])
        .get(f"/w/{workspace.slug}/models/ranker/compare/")
        .content.decode()
    )
    assert "A: v2</a>" in html and "B: v3</a>" in html


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"a": "1", "b": "9"}, "b: v9 is not a version of ranker; it has v1, v2, v3."),
        ({"a": "latest", "b": "2"}, "a: &#x27;latest&#x27; is not a version number"),
        ({"a": "1"}, "b: &#x27;&#x27; is not a version number"),
    ],
)
def test_compare_bad_input_is_a_clear_400(workspace, members, ranker, query, message):
    page = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/models/ranker/compare/", query)
    assert page.status_code == 400
    html = page.content.decode()
    assert 'data-testid="compare-error"' in html and message in html
    assert 'data-testid="compare-metrics"' not in html


def test_compare_another_workspaces_model_is_404(workspace, other_workspace, members, ranker):
    RegisteredModel.objects.create(workspace=other_workspace, name="theirs")
    client = browser(members[Role.VIEWER])
    assert client.get(f"/w/{workspace.slug}/models/theirs/compare/?a=1&b=2").status_code == 404
    assert client.get(f"/w/{workspace.slug}/models/nope/compare/").status_code == 404
    outsider = browser(members["outsider"])
    assert outsider.get(f"/w/{workspace.slug}/models/ranker/compare/").status_code == 404


def test_model_list_links_the_comparison(workspace, members, ranker):
    html = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/models/").content.decode()
    form = html.split('data-testid="compare-ranker"')[0].rsplit("<form", 1)[1]
    assert f'action="/w/{workspace.slug}/models/ranker/compare/"' in form
    # A developer sees both forms (register a job, import from MLflow): their ids differ, so
    # each label names its own form's field (both have a "model" field).
    page = browser(members[Role.DEVELOPER]).get(f"/w/{workspace.slug}/models/").content.decode()
    assert 'id="import_model"' in page and 'id="id_model"' in page
    assert markup_problems(page) == []
