"""The ``lightgbm`` template: boosted trees trained by ``training.gbdt`` through ``runner.train``
in-process on the demo log (better than a constant predictor, the best validation round kept,
the bundle serving loads scoring as the booster does, a stopped run resumed to the same trees,
incremental boosting on a base model), and its registration (the templates API, the job check,
a real worker running a job and the registry serving its version)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from training import data, evaluation, gbdt, runner, synthetic
from training.bundle import WEIGHTS_FILE, apply_calibration, load_bundle, template_kind
from training.models import JobState, TrainingJob
from training.templates import lightgbm
from training.tests.factories import demo_job_spec, make_demo_dataset, place, run_spec
from training.tests.workers import wait_for
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("demo") / "d.parquet", scale=0.1)


def _job(path, work, **params):
    return demo_job_spec(path, work, "lightgbm", slice_column="impressions__device", **params)


_train = run_spec


def _done(job) -> tuple[list[dict], dict]:
    code, events = _train(job)
    assert code == 0, [e for e in events if e["type"] in {"error", "log"}]
    return events, next(e for e in events if e["type"] == "done")["metrics"]


def _split_scores(job) -> np.ndarray:
    """LightGBM's own raw scores of the job's held-out rows, from the stored bundle."""
    bundle = load_bundle(job.model_dir)
    split = data.load(job, spec=bundle.spec).holdout
    x = lightgbm.feature_matrix(split.dense, split.cat)
    return np.asarray(bundle.model.booster.predict(x, raw_score=True))


class StopAfter(runner.StopFlag):
    """Asks to stop once ``count`` events named ``name`` have been emitted (what a SIGTERM
    at that moment does)."""

    def __init__(self, events: list[dict], name: str, count: int) -> None:
        super().__init__()
        self.events, self.name, self.count = events, name, count

    @property
    def requested(self) -> bool:
        return sum(e.get("name") == self.name for e in self.events) >= self.count

    @requested.setter
    def requested(self, value) -> None:
        pass


# A learning rate that overfits the small demo log within a few dozen rounds.
OVERFIT = {"learning_rate": 0.3, "num_boost_round": 300, "early_stopping_rounds": 10}


def test_a_lightgbm_job_beats_a_constant_predictor_and_reports_like_a_torch_job(
    demo_parquet, tmp_path
):
    job = _job(demo_parquet, tmp_path, importance=True, log_every_steps=5)
    events, metrics = _done(job)
    loaded = data.load(job)
    y = loaded.holdout.label.numpy()
    base_rate = float(loaded.train.label.numpy().mean())
    constant = evaluation.logloss(y, np.full(len(y), base_rate))
    # Seed 0, 1,440 training rows: held-out AUC 0.746 and log loss 0.209 against the constant
    # predictor's 0.238 when this was written.
    assert metrics["holdout"]["auc"] > 0.68
    assert metrics["holdout"]["logloss"] < constant - 0.01, (metrics["holdout"], constant)
    # the done payload has the torch path's blocks, so the job page, gate and registry work
    assert {"holdout", "roc", "calibration", "slices", "importance", "validation"} <= set(metrics)
    assert set(metrics["importance"]) == {ref for ref, *_ in synthetic.DEMO_FEATURES}
    assert metrics["holdout"]["ece"] is not None and metrics["validation"]["ece"] is not None
    assert metrics["best_epoch"] == metrics["best_iteration"] == metrics["trees"] > 0
    # rounds are the steps: start, progress every log_every_steps rounds, val_* metrics
    start = next(e for e in events if e["type"] == "start")
    assert start["total_steps"] == 1000
    progress = [e for e in events if e["type"] == "progress"]
    assert [e["step"] for e in progress] == list(range(5, metrics["steps"] + 1, 5))
    assert all(e["total_steps"] == 1000 and e["loss"] > 0 for e in progress)
    assert progress[-1]["loss"] < progress[0]["loss"]  # the training log loss falls
    assert {"val_auc", "val_logloss"} <= {e["name"] for e in events if e["type"] == "metric"}
    # the bundle: LightGBM's text model, no torch weights, no pickle
    files = sorted(p.name for p in job.model_dir.iterdir())
    assert files == ["model.txt", "spec.json"] and WEIGHTS_FILE not in files
    assert (job.model_dir / "model.txt").read_text().startswith("tree")
    assert template_kind("lightgbm") == "gbdt" and template_kind("deepfm") == "torch"


def test_early_stopping_keeps_the_best_validation_round(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path, calibration="none", log_every_steps=1, **OVERFIT)
    events, metrics = _done(job)
    validation = metrics["validation"]
    curve = validation["curve"]
    values = [value for _, value in curve]
    assert metrics["stopped_early"] is True
    # every round scored (log_every_steps 1), stopped ``early_stopping_rounds`` after the best
    assert [r for r, _ in curve] == list(range(1, len(curve) + 1))
    assert len(curve) == metrics["best_epoch"] + 10 < OVERFIT["num_boost_round"]
    assert validation["best_value"] == min(values) == curve[metrics["best_epoch"] - 1][1]
    assert values[-1] > min(values)
    series = [e["value"] for e in events if e["type"] == "metric" and e["name"] == "val_logloss"]
    assert series == values
    # the bundle holds the best round's trees, and scores the validation rows at its value
    bundle = load_bundle(job.model_dir)
    assert bundle.model.num_trees == metrics["best_epoch"] == metrics["trees"]
    split = data.load(job, spec=bundle.spec).validation
    prob = evaluation.predict(bundle.model, split.dense, split.cat)
    assert evaluation.logloss(split.label.numpy(), prob) == pytest.approx(min(values), abs=1e-6)


def test_early_stopping_by_auc_and_without_early_stopping(demo_parquet, tmp_path):
    by_auc = _job(demo_parquet, tmp_path / "auc", early_stopping_metric="auc", **OVERFIT)
    _, metrics = _done(by_auc)
    validation = metrics["validation"]
    assert validation["early_stopping_metric"] == "auc"
    assert validation["best_value"] == max(v for _, v in validation["curve"])
    assert metrics["trees"] == metrics["best_epoch"]
    every = _job(
        demo_parquet,
        tmp_path / "all",
        **{**OVERFIT, "num_boost_round": 40, "early_stopping_rounds": 0},
    )
    _, metrics = _done(every)
    assert metrics["stopped_early"] is False and metrics["best_epoch"] is None
    assert metrics["trees"] == metrics["steps"] == 40
    assert [r for r, _ in metrics["validation"]["curve"]] == [10, 20, 30, 40]


def test_the_bundle_scores_raw_columns_as_the_booster_with_its_calibration(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path, calibration="temperature", num_boost_round=60)
    _, metrics = _done(job)
    bundle = load_bundle(job.model_dir)
    assert isinstance(bundle.model, lightgbm.LightGBMModel)
    calibration = bundle.spec.extra["calibration"]
    assert calibration["method"] == "temperature" and calibration["temperature"] != 1.0
    # serving's path: raw columns through the bundle's encoder and model ...
    table = data.read_table(demo_parquet, [f["column"] for f in job.features]).slice(0, 80)
    served = bundle.predict({c: table.column(c) for c in table.column_names}, 80)
    # ... equals LightGBM's own raw prediction on the same encoding, calibrated
    dense, cat = bundle.encoder.encode({c: table.column(c) for c in table.column_names}, 80)
    raw = bundle.model.booster.predict(lightgbm.feature_matrix(dense, cat), raw_score=True)
    assert np.allclose(served, apply_calibration(raw, calibration), atol=1e-6)
    assert not np.allclose(served, apply_calibration(raw, None), atol=1e-4)
    # and the stored bundle scores the held-out rows as the job's evaluation did
    score = evaluation.evaluate_bundle(str(job.model_dir), job)
    assert score["logloss"] == pytest.approx(metrics["holdout"]["logloss"], abs=1e-9)
    assert score["auc"] == pytest.approx(metrics["holdout"]["auc"], abs=1e-9)
    # the wrapper answers like a torch module to the callers that treat it as one
    assert bundle.model.eval() is bundle.model and bundle.model.training is False
    logits = bundle.model(torch.from_numpy(dense), torch.from_numpy(cat))
    assert logits.shape == (80,) and np.allclose(logits.numpy(), raw)
    assert bundle.model(torch.zeros(0, dense.shape[1]), torch.zeros(0, cat.shape[1])).shape == (0,)


def test_categorical_codes_are_lightgbm_categories_unless_switched_off(demo_parquet, tmp_path):
    native = _job(demo_parquet, tmp_path / "native", num_boost_round=30)
    plain = _job(demo_parquet, tmp_path / "plain", num_boost_round=30, categorical=False)
    _done(native), _done(plain)
    native_text = (native.model_dir / "model.txt").read_text()
    plain_text = (plain.model_dir / "model.txt").read_text()
    names, categorical = lightgbm.feature_layout(load_bundle(native.model_dir).spec)
    assert len(categorical) == 5 and names[categorical[0]] == "user_profile__age_bucket"
    assert "user_embedding__interest_7" in names
    assert "cat_boundaries" in native_text and "cat_boundaries" not in plain_text
    assert not np.allclose(_split_scores(native), _split_scores(plain))


@pytest.mark.parametrize("feature_fraction", [0.9, 1.0])
def test_a_stopped_run_resumes_from_its_booster_to_the_same_trees(
    demo_parquet, tmp_path, feature_fraction
):
    params = {**OVERFIT, "log_every_steps": 1, "feature_fraction": feature_fraction}
    whole = _job(demo_parquet, tmp_path / "whole", **params)
    _, expected = _done(whole)

    part = _job(demo_parquet, tmp_path / "part", checkpoint_every_steps=4, **params)
    events: list[dict] = []
    stop = StopAfter(events, "val_logloss", 7)
    code = runner.train(part, emit=runner.Emitter(sink=events.append), stop=stop)
    assert code == runner.EXIT_STOPPED
    assert events[-1] == {"type": "stopped", "step": 7}
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [4, 7]
    assert not part.model_dir.exists()
    checkpoint = torch.load(part.checkpoint_file, weights_only=True)
    assert checkpoint["format"] == gbdt.GBDT_CHECKPOINT_FORMAT and checkpoint["step"] == 7
    assert checkpoint["model"].count("Tree=") == 7

    resumed_events, resumed = _done(part)
    assert any(e.get("message") == "resumed from checkpoint at round 7" for e in resumed_events)
    assert next(e for e in resumed_events if e["type"] == "start")["step"] == 7
    assert resumed["best_epoch"] == expected["best_epoch"]
    assert resumed["validation"]["curve"] == expected["validation"]["curve"]
    assert np.allclose(_split_scores(part), _split_scores(whole), atol=1e-9)
    assert resumed["holdout"]["logloss"] == pytest.approx(expected["holdout"]["logloss"], abs=1e-9)


def test_a_bagging_run_resumes_and_finishes(demo_parquet, tmp_path):
    """Bagging's draws restart with a resumed run (documented in ``training.gbdt``): the run
    finishes with every round, not necessarily the uninterrupted run's trees."""
    params = {"num_boost_round": 30, "early_stopping_rounds": 0, "log_every_steps": 1}
    job = _job(demo_parquet, tmp_path, bagging_fraction=0.7, bagging_freq=1, **params)
    events: list[dict] = []
    stop = StopAfter(events, "val_logloss", 12)
    assert runner.train(job, emit=runner.Emitter(sink=events.append), stop=stop) == 3
    _, metrics = _done(job)
    assert metrics["steps"] == metrics["trees"] == 30
    assert metrics["holdout"]["auc"] > 0.6


def test_the_same_seed_gives_the_same_trees_and_another_seed_other_ones(demo_parquet, tmp_path):
    params = {"num_boost_round": 25, "feature_fraction": 0.5}
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        job = _job(demo_parquet, tmp_path / name, **params, seed=seed)
        _done(job)
        runs[name] = _split_scores(job)
    assert np.array_equal(runs["a"], runs["b"])
    assert not np.allclose(runs["a"], runs["c"])


def test_incremental_training_boosts_on_the_base_models_trees(demo_parquet, tmp_path):
    base = _job(demo_parquet, tmp_path / "base", num_boost_round=20, early_stopping_rounds=0)
    _done(base)
    more = _job(demo_parquet, tmp_path / "more", num_boost_round=15, early_stopping_rounds=0)
    more.base_model_path = str(base.model_dir)
    events, metrics = _done(more)
    assert any("incremental: boosting on" in str(e.get("message")) for e in events)
    assert metrics["steps"] == 15 and metrics["trees"] == 35
    base_bundle, bundle = load_bundle(base.model_dir), load_bundle(more.model_dir)
    assert bundle.spec.features == base_bundle.spec.features  # the base model's encoding
    holdout = data.load(more, spec=bundle.spec).holdout
    x = lightgbm.feature_matrix(holdout.dense, holdout.cat)
    first = bundle.model.booster.predict(x, raw_score=True, num_iteration=20)
    assert np.allclose(first, base_bundle.model.booster.predict(x, raw_score=True))

    torch_base = tmp_path / "torch-base"
    torch_job = data.JobSpec(**{**base.__dict__, "template": "logreg", "work_dir": str(torch_base)})
    torch_job.params = {"epochs": 1, "threads": 1, "importance": False}
    _done(torch_job)
    wrong = _job(demo_parquet, tmp_path / "wrong", num_boost_round=5)
    wrong.base_model_path = str(torch_job.model_dir)
    code, events = _train(wrong)
    assert (
        code == 2 and events[-1]["message"] == "a lightgbm job continues only from a lightgbm model"
    )


# --- registration: the templates API, the job check, a worker, the registry ---------------------


def test_the_templates_api_lists_lightgbm_with_its_schema(workspace, client_for):
    client = client_for(make_member(workspace, Role.DEVELOPER))
    url = f"/api/v1/workspaces/{workspace.slug}/training-templates/"
    rows = {row["name"]: row for row in client.get(url).json()}
    assert "lightgbm" in rows
    row = client.get(f"{url}lightgbm/").json()
    assert "the strong tabular baseline" in row["description"]
    assert "do not apply" in row["description"]
    params = row["params"]
    expected = {
        "num_boost_round": ("int", 1000),
        "learning_rate": ("float", 0.05),
        "num_leaves": ("int", 31),
        "min_data_in_leaf": ("int", 20),
        "feature_fraction": ("float", 0.9),
        "bagging_fraction": ("float", 1.0),
        "bagging_freq": ("int", 0),
        "lambda_l1": ("float", 0.0),
        "lambda_l2": ("float", 0.0),
        "max_bin": ("int", 255),
        "early_stopping_rounds": ("int", 50),
        "categorical": ("bool", True),
    }
    assert {name: (params[name]["type"], params[name]["default"]) for name in expected} == expected
    assert (params["num_leaves"]["min"], params["feature_fraction"]["max"]) == (2.0, 1.0)
    assert "embedding_dim" not in params and "seed" in params
    # every template's line says when to pick it
    for name in ("logreg", "fine_ranking", "two_tower", "deepfm", "lightgbm", "lm_lora"):
        assert "pick it" in rows[name]["description"], name


def test_a_lightgbm_job_is_checked_against_its_own_params(workspace, client_for):
    client = client_for(make_member(workspace, Role.DEVELOPER))
    dataset = make_demo_dataset(workspace, scale=0.01)
    url = f"/api/v1/workspaces/{workspace.slug}/training-jobs/"

    def submit(params, **fields):
        body = {"name": "gbdt", "template": "lightgbm", "dataset": dataset.pk, "params": params}
        return client.post(url, {**body, **fields}, format="json")

    refused = submit({"hidden": [8], "num_leaves": 1, "categorical": "yes", "num_boost_round": 5})
    assert refused.status_code == 400, refused.content
    errors = {e["attr"]: e["detail"] for e in refused.json()["errors"]}
    assert sorted(errors) == ["params.categorical", "params.hidden", "params.num_leaves"]
    assert errors["params.hidden"].startswith("Unknown param; use one of:")
    assert "num_boost_round" in errors["params.hidden"]
    assert errors["params.num_leaves"] == "Give a whole number from 2 to 131072."
    created = submit({"num_boost_round": 50.0, "learning_rate": 0.1, "categorical": False})
    assert created.status_code == 201, created.content
    job = TrainingJob.objects.for_workspace(workspace).get(pk=created.json()["id"])
    assert job.params == {"num_boost_round": 50, "learning_rate": 0.1, "categorical": False}

    # incremental: a lightgbm job boosts on a lightgbm base model only
    neural = TrainingJob.objects.create(
        workspace=workspace, name="neural", template="fine_ranking", dataset=dataset,
        state=JobState.SUCCEEDED, model_path="x/model",
    )  # fmt: skip
    mixed = submit({"num_boost_round": 5}, base_job=neural.pk)
    assert mixed.status_code == 400, mixed.content
    assert mixed.json()["attr"] == "base_job" and "lightgbm" in mixed.json()["detail"]
    trees = TrainingJob.objects.create(
        workspace=workspace, name="trees", template="lightgbm", dataset=dataset,
        state=JobState.SUCCEEDED, model_path="y/model",
    )  # fmt: skip
    assert submit({"num_boost_round": 5}, name="more", base_job=trees.pk).status_code == 201
    body = {"name": "n2", "template": "fine_ranking", "dataset": dataset.pk, "base_job": trees.pk}
    back = client.post(url, body, format="json")
    assert back.status_code == 400 and back.json()["attr"] == "base_job"


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_worker_runs_a_lightgbm_job_and_the_registry_serves_its_version(
    workspace, client_for, client
):
    from serving.registry import load_version, model_version_register
    from training import agent
    from training.models import Node
    from training.tasks import run_job
    from workspaces.testing.workers import embedded_worker

    dataset = make_demo_dataset(workspace, scale=0.05)
    client = client_for(make_member(workspace, Role.DEVELOPER))
    params = {"num_boost_round": 40, "threads": 1, "log_every_steps": 5}
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/training-jobs/",
        {"name": "gbdt-worker", "template": "lightgbm", "dataset": dataset.pk, "params": params},
        format="json",
    )
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.for_workspace(workspace).get(pk=response.json()["id"])
    name = f"t{uuid.uuid4().hex[:10]}"
    queue = f"node.{name}"
    try:
        with embedded_worker([queue]):
            node = wait_for(lambda: Node.objects.filter(name=name).first(), timeout=30, what="node")
            place(job, node)
            run_job.apply_async(args=[job.pk], queue=queue)
            wait_for(
                lambda: TrainingJob.objects.unscoped().get(pk=job.pk).is_terminal,
                timeout=90,
                what="the job",
            )
    finally:
        agent.HEARTBEATS.shutdown()  # the test worker sends no worker_shutdown
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.state_reason
    assert job.total_steps == 40 and 0 < job.step <= 40
    assert job.metrics["holdout"]["auc"] > 0.55 and job.metrics["trees"] > 0
    page = client.get(f"/api/v1/workspaces/{workspace.slug}/training-jobs/{job.pk}/metrics/")
    assert {"loss", "val_logloss"} <= {row["name"] for row in page.json()}

    client.force_login(make_member(workspace, Role.VIEWER))
    html = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/").content.decode()
    best = job.metrics["best_epoch"]
    # 40 rounds, none of them 50 after the best: every round ran, the best one was kept
    assert f"best logloss at round {best}, all rounds ran" in html

    version = model_version_register(actor=None, workspace=workspace, name="gbdt", job=job)
    assert sorted(a["name"] for a in version.artifacts) == ["MLmodel", "model.txt", "spec.json"]
    bundle = load_version(version)
    assert isinstance(bundle.model, lightgbm.LightGBMModel)
    assert bundle.model.num_trees == job.metrics["trees"]
    prob = bundle.predict({}, 3)  # no feature values at all: nulls, still probabilities
    assert prob.shape == (3,) and np.all((prob > 0) & (prob < 1))


def test_the_job_form_offers_lightgbm_with_its_own_params(client, workspace):
    from django.urls import reverse

    make_demo_dataset(workspace, scale=0.01)
    client.force_login(make_member(workspace, Role.DEVELOPER))
    url = reverse("training-job-new", kwargs={"ws": workspace.slug})
    page = client.get(url, {"code": "template:lightgbm"})
    assert page.status_code == 200 and page.context["form"].template == "lightgbm"
    names = {bound.name for bound in page.context["form"].param_fields}
    assert {"param_num_boost_round", "param_num_leaves", "param_categorical"} <= names
    assert "param_embedding_dim" not in names


def test_a_lightgbm_model_logged_with_the_stock_mlflow_client_imports(
    workspace, client_for, tmp_path
):
    import mlflow
    from django.conf import settings

    from features.samples import dataset_file
    from serving import registry
    from serving.models import ModelVersion
    from serving.tests.helpers import workspace_experiment

    dataset = make_demo_dataset(workspace, scale=0.05)
    job = _job(dataset_file(dataset), tmp_path / "job", num_boost_round=20)
    _done(job)
    mlflow.set_tracking_uri(settings.MLFLOW_TRACKING_URI)
    with mlflow.start_run(experiment_id=workspace_experiment(workspace)) as run:
        mlflow.log_artifact(str(job.model_dir / "spec.json"), "model")
        mlflow.log_artifact(str(job.model_dir / "model.txt"), "model")
    with mlflow.start_run(experiment_id=workspace_experiment(workspace)) as bare:
        mlflow.log_artifact(str(job.model_dir / "spec.json"), "model")  # no trees
    client = client_for(make_member(workspace, Role.DEVELOPER))
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    body = {"model": "trees", "source": f"runs:/{run.info.run_id}/model"}
    response = client.post(url, body, format="json")
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.for_workspace(workspace).get(pk=response.json()["id"])
    imported, trained = registry.load_version(version), load_bundle(job.model_dir)
    holdout = data.load(job, spec=trained.spec).holdout
    assert np.array_equal(
        evaluation.predict_bundle(imported, holdout), evaluation.predict_bundle(trained, holdout)
    )
    missing = client.post(
        url, {"model": "trees", "source": f"runs:/{bare.info.run_id}/model"}, format="json"
    )
    assert missing.status_code == 400, missing.content
    assert missing.json()["attr"] == "source" and "no model.txt" in missing.json()["detail"]
