"""The training API: job validation, consumers, cancel; entry points; the UI pages."""

from __future__ import annotations

import pytest

from features.models import Consumer, DatasetStatus
from training.models import JobState, PipelineRun, TrainingJob
from training.pipelines import pipeline_create
from training.services import job_create
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


def _attrs(response) -> set[str]:
    body = response.json()
    return {body.get("attr")} | {e.get("attr") for e in body.get("errors") or []}


def _url(workspace, tail=""):
    return f"/api/v1/workspaces/{workspace.slug}/{tail}"


def test_create_job_registers_feature_consumers(workspace, dev, dataset):
    response = dev.post(
        _url(workspace, "training-jobs/"),
        {
            "name": "ctr-v1",
            "template": "fine_ranking",
            "dataset": dataset.pk,
            "params": {"epochs": 1},
            "cpu_milli": 2000,
            "memory_mb": 2048,
            "priority_class": "production",
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "pending" and body["priority_class"] == "production"
    consumers = Consumer.objects.for_workspace(workspace).filter(
        kind="training_job", object_id=str(body["id"])
    )
    assert consumers.count() == len(dataset.feature_refs)
    listing = dev.get(_url(workspace, "training-jobs/?state=pending")).json()
    assert [j["id"] for j in listing["results"]] == [body["id"]]


@pytest.mark.parametrize(
    ("change", "attr"),
    [
        ({"template": "nope"}, "template"),
        ({"template": ""}, "template"),
        ({"cpu_milli": 0}, "cpu_milli"),
        ({"memory_mb": -5}, "memory_mb"),
        ({"priority_class": "urgent"}, "priority_class"),
        ({"name": "Bad Name"}, "name"),
        ({"dataset": "one"}, "dataset"),
        ({"base_job": "one"}, "base_job"),
        ({"gpu_milli": 1500}, "gpu_milli"),
        ({"workers": 0}, "workers"),
        ({"workers": 17}, "workers"),
        ({"workers": 2}, "workers"),  # logreg's default solver, lbfgs, is one process
        ({"workers": 2, "template": "lightgbm"}, "workers"),
        ({"workers": 2, "template": "fine_ranking", "params": {"members": 3}}, "workers"),
    ],
)
def test_invalid_jobs_are_refused(workspace, dev, dataset, change, attr):
    body = {"name": "ctr", "template": "logreg", "dataset": dataset.pk, **change}
    response = dev.post(_url(workspace, "training-jobs/"), body, format="json")
    assert response.status_code == 400, response.content
    assert attr in _attrs(response)


@pytest.mark.parametrize(
    ("change", "attr"),
    [
        ({"entry_point": "missing", "template": ""}, "entry_point"),
        ({"dataset": 999999}, "dataset"),
        ({"base_job": 999999}, "base_job"),
    ],
)
def test_missing_references_are_not_found_naming_the_field(workspace, dev, dataset, change, attr):
    body = {"name": "ctr", "template": "logreg", "dataset": dataset.pk, **change}
    response = dev.post(_url(workspace, "training-jobs/"), body, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["type"] == "not_found"
    assert response.json()["attr"] == attr
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_a_job_asks_for_data_parallel_workers(workspace, dev, dataset):
    body = {"name": "ddp", "template": "logreg", "dataset": dataset.pk, "workers": 3}
    response = dev.post(_url(workspace, "training-jobs/"), body, format="json")
    assert response.status_code == 400
    assert "give solver adam" in response.json()["errors"][0]["detail"]
    body["params"] = {"solver": "adam"}
    response = dev.post(_url(workspace, "training-jobs/"), body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["workers"] == 3
    assert TrainingJob.objects.for_workspace(workspace).get(name="ddp").workers == 3


def test_dataset_must_be_ready_and_in_the_workspace(workspace, other_workspace, dev, dataset):
    foreign = make_demo_dataset(other_workspace, scale=0.01)
    response = dev.post(
        _url(workspace, "training-jobs/"),
        {"name": "x", "template": "logreg", "dataset": foreign.pk},
        format="json",
    )
    assert response.status_code == 404
    assert response.json()["attr"] == "dataset"
    dataset.status = DatasetStatus.BUILDING
    dataset.save()
    response = dev.post(
        _url(workspace, "training-jobs/"),
        {"name": "x", "template": "logreg", "dataset": dataset.pk},
        format="json",
    )
    assert response.status_code == 400 and "dataset" in _attrs(response)


def test_cancel_a_pending_job_and_refuse_a_second_cancel(workspace, dev, dataset):
    job = job_create(actor=None, workspace=workspace, name="c", dataset=dataset, template="logreg")
    url = _url(workspace, f"training-jobs/{job.pk}/cancel/")
    assert dev.post(url).json()["state"] == "cancelled"
    assert dev.post(url).status_code == 409


def test_running_job_cancel_sets_stop_requested(workspace, dataset):
    from training.services import job_request_stop, job_transition
    from training.tests.factories import make_node, place

    job = job_create(actor=None, workspace=workspace, name="r", dataset=dataset, template="logreg")
    place(job, make_node())
    job_transition(job=job, to=JobState.RUNNING)
    job_request_stop(job=job, mode="cancel", reason="test")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.stop_requested == "cancel"


def test_entry_point_script_is_stored_and_usable_by_a_job(workspace, dev, dataset):
    script = "from training.templates.logreg import build  # noqa\n"
    response = dev.post(
        _url(workspace, "entry-points/"), {"name": "my-model", "script": script}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "script" and len(response.json()["sha256"]) == 64
    bad = dev.post(
        _url(workspace, "entry-points/"), {"name": "broken", "script": "def ("}, format="json"
    )
    assert bad.status_code == 400
    job = dev.post(
        _url(workspace, "training-jobs/"),
        {"name": "custom", "entry_point": "my-model", "dataset": dataset.pk},
        format="json",
    )
    assert job.status_code == 201, job.content


def test_ui_pages_render(workspace, client, dataset):
    from training.tests.factories import make_node, place

    user = make_member(workspace, Role.VIEWER)
    client.force_login(user)
    job = job_create(actor=None, workspace=workspace, name="ui", dataset=dataset, template="logreg")
    place(job, make_node())
    TrainingJob.objects.for_workspace(workspace).filter(pk=job.pk).update(
        metrics={
            "holdout": {"auc": 0.71, "logloss": 0.2, "rows": 10},
            "roc": [[0, 0], [0.5, 0.8], [1, 1]],
            "calibration": [{"predicted": 0.1, "observed": 0.12, "count": 5}],
            "importance": {"ad_profile:ctr_prior": 0.05},
            "slices": {"ios": {"auc": 0.7, "rows": 5}},
        }
    )
    base = f"/w/{workspace.slug}/training/"
    page = client.get(base)
    assert page.status_code == 200 and b"ui #" in page.content
    detail = client.get(f"{base}jobs/{job.pk}/")
    assert detail.status_code == 200
    assert b'data-testid="roc"' in detail.content and b"ad_profile:ctr_prior" in detail.content
    live = client.get(f"{base}jobs/{job.pk}/live.json").json()
    assert live["job"]["state"] == "placed"
    assert client.get(f"{base}jobs.json").json()["jobs"][0]["id"] == job.pk
    assert client.get(f"{base}pipelines/").status_code == 200
    assert client.get(f"{base}pipelines/runs.json").status_code == 200
    assert client.get(f"/w/{workspace.slug}/training/jobs/999999/").status_code == 404


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"dataset_id": "one"}, 400),
        ({"dataset_id": True}, 400),
        ({"dataset_id": None}, 400),
        ({"dataset": 5}, 400),
        ({"dataset_id": 999999}, 404),
        ({"dataset": "no-such-dataset"}, 404),
    ],
)
def test_pipeline_dataset_params_of_the_wrong_type_are_400_and_unknown_ones_404(
    workspace, dev, params, status
):
    pipeline = pipeline_create(actor=None, workspace=workspace, name="daily")
    response = dev.post(
        _url(workspace, f"pipelines/{pipeline.name}/run/"), {"params": params}, format="json"
    )
    assert response.status_code == status, response.content
    assert response.json()["attr"] == f"params.{next(iter(params))}"
    assert not PipelineRun.objects.for_workspace(workspace).exists()


def test_the_job_log_reads_on_from_an_offset_in_whole_lines(workspace, dev, dataset, monkeypatch):
    from training.agent import LOG_FILE
    from training.api import views
    from training.services import job_work_dir

    job = job_create(actor=None, workspace=workspace, name="l", dataset=dataset, template="logreg")
    url = _url(workspace, f"training-jobs/{job.pk}/log/")
    empty = dev.get(url).json()
    assert empty == {
        "offset": 0, "next_offset": 0, "size": 0, "text": "", "done": False, "state": "pending"
    }  # fmt: skip
    folder = job_work_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"line {n} {'é' * (n % 3)}" for n in range(40)]
    (folder / LOG_FILE).write_bytes(("\n".join(lines) + "\n").encode())
    monkeypatch.setattr(views, "MAX_LOG_CHUNK", 100)
    text, offset, chunks = "", 0, 0
    while True:
        chunk = dev.get(url, {"offset": offset}).json()
        assert chunk["offset"] == offset and chunk["text"].endswith("\n")
        text += chunk["text"]
        chunks += 1
        if chunk["next_offset"] >= chunk["size"]:
            break
        offset = chunk["next_offset"]
    assert text.splitlines() == lines and chunks > 3
    assert dev.get(url, {"offset": 10**9}).json()["text"] == ""
    refused = dev.get(url, {"offset": "-1"})
    assert refused.status_code == 400 and refused.json()["attr"] == "offset"
