"""The tuning-job API: create (with the default space, or one that the template's params check),
bad input answered 400 naming the field, another workspace's objects 404, viewers read only,
the detail with its trials, and cancel."""

from __future__ import annotations

import pytest

from training import tuning
from training.models import JobState, TrialState, TuningJob, TuningState, TuningTrial
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev(workspace, client_for):
    return client_for(make_member(workspace, Role.DEVELOPER))


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.01)


def _url(workspace, tail=""):
    return f"/api/v1/workspaces/{workspace.slug}/tuning-jobs/{tail}"


def _body(dataset, /, **extra):
    return {"name": "tune-it", "template": "logreg", "dataset": dataset.pk} | extra


def _attrs(response) -> set[str]:
    body = response.json()
    return {body.get("attr")} | {e.get("attr") for e in body.get("errors") or []}


def test_create_shows_the_default_space_and_starts_two_trials(workspace, dev, dataset):
    response = dev.post(_url(workspace), _body(dataset, n_trials=3), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["space"] == tuning.default_space_json("logreg")
    assert body["state"] == TuningState.QUEUED and body["trials"] == []
    assert body["metric"] == "logloss" and body["direction"] == "minimize"
    assert body["model_name"] == "tune-it" and body["parallelism"] == 2
    tuning.tuning_job_advance(body["id"])
    detail = dev.get(_url(workspace, f"{body['id']}/")).json()
    assert detail["state"] == TuningState.RUNNING and detail["trials_started"] == 2
    assert [t["number"] for t in detail["trials"]] == [0, 1]
    trial = detail["trials"][0]
    assert trial["job_state"] == JobState.PENDING and set(trial["params"]) == {
        "l2",
        "vocab_min_count",
        "numeric_transform",
    }
    assert trial["intermediate"] == [] and detail["importances"] == {}


def test_a_search_space_of_the_template_and_bad_ones(workspace, dev, dataset):
    good = {"lr": {"low": 0.001, "high": 0.1, "log": True}}
    response = dev.post(_url(workspace), _body(dataset, space=good, metric="auc"), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["space"] == good and response.json()["direction"] == "maximize"
    cases = [
        ({"space": {"embedding_dim": {"choices": [8]}}}, "space.embedding_dim"),
        ({"space": {"lr": {"low": -1, "high": 0.1}}}, "space.lr"),
        ({"space": ["lr"]}, "space"),
        ({"params": {"l2": 0.1}}, "params.l2"),  # searched by the default space
        ({"params": "fast"}, "params"),
        ({"n_trials": 0}, "n_trials"),
        ({"n_trials": "eight"}, "n_trials"),
        ({"parallelism": 0}, "parallelism"),
        ({"metric": "accuracy"}, "metric"),
        ({"max_minutes": -5}, "max_minutes"),
        ({"template": "nope"}, "template"),
        ({"dataset": None}, "dataset"),
        ({"name": "Not A Name"}, "name"),
    ]
    for extra, field in cases:
        response = dev.post(_url(workspace), _body(dataset, **extra), format="json")
        assert response.status_code == 400, (extra, response.content)
        assert field in _attrs(response), (extra, response.json())
    assert TuningJob.objects.for_workspace(workspace).count() == 1


def test_parallelism_above_the_quota_is_refused_naming_it(workspace, dev, dataset):
    from training.scheduler.models import WorkspaceQuota

    WorkspaceQuota.objects.create(workspace=workspace, cpu_milli=2000)
    response = dev.post(
        _url(workspace), _body(dataset, parallelism=3, cpu_milli=1000), format="json"
    )
    assert response.status_code == 400
    assert "parallelism" in _attrs(response) and "at most 2" in response.content.decode()


def test_another_workspaces_objects_are_not_found(
    workspace, other_workspace, dev, dataset, client_for
):
    theirs = make_demo_dataset(other_workspace, scale=0.01)
    response = dev.post(_url(workspace), _body(theirs), format="json")
    assert response.status_code == 404 and "dataset" in _attrs(response)
    their_tuning = tuning.tuning_job_create(
        actor=None, workspace=other_workspace, name="theirs", dataset=theirs,
        template="logreg", dispatch=False,
    )  # fmt: skip
    assert dev.get(_url(workspace, f"{their_tuning.pk}/")).status_code == 404
    assert dev.post(_url(workspace, f"{their_tuning.pk}/cancel/")).status_code == 404
    outsider = client_for(make_member(other_workspace, Role.ADMIN))
    assert outsider.get(_url(workspace)).status_code == 404
    assert dev.get(_url(workspace)).json()["results"] == []


def test_viewers_read_and_cannot_create_or_cancel(workspace, dataset, client_for):
    viewer = client_for(make_member(workspace, Role.VIEWER))
    assert viewer.post(_url(workspace), _body(dataset), format="json").status_code == 403
    tj = tuning.tuning_job_create(
        actor=None, workspace=workspace, name="mine", dataset=dataset, template="logreg",
        dispatch=False,
    )  # fmt: skip
    assert viewer.get(_url(workspace, f"{tj.pk}/")).status_code == 200
    assert viewer.post(_url(workspace, f"{tj.pk}/cancel/")).status_code == 403


def test_cancel_stops_the_trials_and_a_second_cancel_conflicts(workspace, dev, dataset):
    created = dev.post(_url(workspace), _body(dataset), format="json").json()
    tuning.tuning_job_advance(created["id"])
    response = dev.post(_url(workspace, f"{created['id']}/cancel/"))
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == TuningState.CANCELLED
    assert {t["state"] for t in body["trials"]} == {TrialState.CANCELLED}
    assert {t["job_state"] for t in body["trials"]} == {JobState.CANCELLED}
    assert dev.post(_url(workspace, f"{created['id']}/cancel/")).status_code == 409


def test_the_list_does_not_query_per_tuning_job(
    workspace, dev, dataset, django_assert_max_num_queries
):
    for n in range(4):
        tj = tuning.tuning_job_create(
            actor=None, workspace=workspace, name=f"t{n}", dataset=dataset, template="logreg",
            dispatch=False,
        )  # fmt: skip
        tuning.tuning_job_advance(tj.pk)
    with django_assert_max_num_queries(12):
        response = dev.get(_url(workspace))
    assert response.status_code == 200 and len(response.json()["results"]) == 4
    assert {r["trials_started"] for r in response.json()["results"]} == {2}
    assert TuningTrial.objects.for_workspace(workspace).count() == 8


def test_refit_cv_folds_is_taken_shown_and_a_bad_one_names_the_field(workspace, dev, dataset):
    bad = dev.post(_url(workspace), _body(dataset, template="two_tower", refit_cv_folds=3),
                   format="json")  # fmt: skip
    assert bad.status_code == 400 and "refit_cv_folds" in _attrs(bad), bad.content
    assert "lightgbm" in bad.content.decode()  # names the templates that have cv_folds
    wrong_type = dev.post(_url(workspace), _body(dataset, refit_cv_folds="x"), format="json")
    assert wrong_type.status_code == 400 and "refit_cv_folds" in _attrs(wrong_type)
    response = dev.post(_url(workspace), _body(dataset, refit_cv_folds=4), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["refit_cv_folds"] == 4 and body["refit_job"] is None
