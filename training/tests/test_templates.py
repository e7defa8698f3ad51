"""Templates, loader, evaluation maths and the runner in-process (no database)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from training import data, evaluation, runner, synthetic
from training.bundle import load_bundle


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("demo") / "d.parquet", scale=0.1)


def _job(path, tmp_path, template="fine_ranking", **params):
    return data.JobSpec(
        job_id=1,
        template=template,
        dataset_path=str(path),
        features=synthetic.feature_dicts(),
        work_dir=str(tmp_path / template),
        label="click",
        params={"epochs": 2, "batch_size": 128, "threads": 1, **params},
        slice_column="impressions__device",
    )


def _train(job):
    events = []
    assert runner.train(job, emit=runner.Emitter(sink=events.append)) == 0
    return events, next(e for e in events if e["type"] == "done")


def test_auc_and_logloss_match_sklearn():
    rng = np.random.default_rng(1)
    y = rng.random(500) < 0.3
    p = np.clip(rng.random(500) * 0.5 + y * 0.3, 0.01, 0.99)
    p[:50] = 0.5  # ties
    assert evaluation.auc(y, p) == pytest.approx(roc_auc_score(y, p))
    assert evaluation.logloss(y, p) == pytest.approx(log_loss(y, p))
    assert evaluation.auc(np.ones(3), np.ones(3)) is None


def test_batch_order_depends_only_on_seed_and_step():
    a, b = data.BatchOrder(100, 32, seed=7), data.BatchOrder(100, 32, seed=7)
    assert a.steps_per_epoch == 4
    later = [b.indices(s).tolist() for s in (9, 5)]
    assert later == [a.indices(9).tolist(), a.indices(5).tolist()]
    epoch = torch.cat([a.indices(s) for s in range(4)])
    assert sorted(epoch.tolist()) == list(range(100))
    assert data.BatchOrder(100, 32, seed=8).indices(0).tolist() != a.indices(0).tolist()


@pytest.mark.parametrize("template", ["logreg", "fine_ranking", "two_tower"])
def test_each_template_trains_evaluates_and_bundles(demo_parquet, tmp_path, template):
    job = _job(demo_parquet, tmp_path, template, epochs=4)
    events, done = _train(job)
    metrics = done["metrics"]
    # Recall (two-tower) only ranks by user-item affinity; it needs more data than this to shine.
    floor = 0.53 if template == "two_tower" else 0.6
    assert metrics["holdout"]["auc"] > floor, metrics["holdout"]
    assert set(metrics["slices"]) == {"ios", "android", "desktop"}
    assert set(metrics["importance"]) == {ref for ref, *_ in synthetic.DEMO_FEATURES}
    assert metrics["roc"][0] == [0.0, 0.0] and len(metrics["calibration"]) == 10
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and progress[-1]["step"] == progress[-1]["total_steps"]
    # The bundle predicts the same (calibrated) probabilities from raw columns as the
    # evaluation of the trained model did.
    bundle = load_bundle(job.model_dir)
    assert bundle.spec.extra["calibration"]["method"] == "temperature"
    table = data.read_table(demo_parquet, [f["column"] for f in job.features])
    head = table.slice(0, 50)
    raw = bundle.predict({c: head.column(c) for c in head.column_names}, 50)
    split = data.encode_split(bundle.spec, head, "click")
    assert np.allclose(raw, evaluation.predict_bundle(bundle, split), atol=1e-6)
    uncalibrated = evaluation.predict(bundle.model, split.dense, split.cat)
    assert not np.allclose(raw, uncalibrated, atol=1e-6)


def test_fine_ranking_beats_logreg_on_the_demo_log(demo_parquet, tmp_path):
    _, fine = _train(_job(demo_parquet, tmp_path, "fine_ranking", epochs=3, importance=False))
    _, linear = _train(_job(demo_parquet, tmp_path, "logreg", epochs=3, importance=False))
    assert fine["metrics"]["holdout"]["auc"] > linear["metrics"]["holdout"]["auc"]


def test_resume_from_a_checkpoint_gives_the_same_model(demo_parquet, tmp_path):
    whole = _job(demo_parquet, tmp_path / "whole", checkpoint_every_steps=7, importance=False)
    _, expected = _train(whole)

    class StopAt(runner.StopFlag):
        def __init__(self, events):
            super().__init__()
            self.events = events

        @property
        def requested(self):
            return any(e["type"] == "progress" and e["step"] >= 11 for e in self.events)

        @requested.setter
        def requested(self, value):
            pass

    part = _job(demo_parquet, tmp_path / "part", checkpoint_every_steps=7, importance=False)
    events: list = []
    code = runner.train(part, emit=runner.Emitter(sink=events.append), stop=StopAt(events))
    assert code == runner.EXIT_STOPPED
    stopped = next(e for e in events if e["type"] == "stopped")["step"]
    assert 0 < stopped < expected["step"]
    _, resumed = _train(part)
    assert resumed["metrics"]["holdout"]["auc"] == pytest.approx(
        expected["metrics"]["holdout"]["auc"], abs=1e-9
    )


def test_incremental_training_starts_from_the_base_model(demo_parquet, tmp_path):
    base = _job(demo_parquet, tmp_path / "base", importance=False)
    _, first = _train(base)
    follow = _job(demo_parquet, tmp_path / "next", importance=False, epochs=1, lr=1e-9)
    follow.base_model_path = str(base.model_dir)
    events, second = _train(follow)
    assert any("incremental" in e.get("message", "") for e in events if e["type"] == "log")
    # With a vanishing learning rate the continued model is the base model.
    assert second["metrics"]["holdout"]["auc"] == pytest.approx(
        first["metrics"]["holdout"]["auc"], abs=1e-4
    )


def test_user_entry_point_script_runs_like_a_template(demo_parquet, tmp_path):
    script = tmp_path / "my_model.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Tiny(nn.Module):\n"
        "    def __init__(self, d):\n"
        "        super().__init__(); self.lin = nn.Linear(d, 1)\n"
        "    def forward(self, dense, cat):\n"
        "        return self.lin(dense).squeeze(-1)\n"
        "def build(spec):\n"
        "    return Tiny(spec.dense_dim)\n"
    )
    job = _job(demo_parquet, tmp_path, template="", importance=False)
    job.entry_point = str(script)
    _, done = _train(job)
    assert done["metrics"]["holdout"]["auc"] > 0.55


def test_a_list_param_reaches_the_model(demo_parquet, tmp_path):
    """fine_ranking's ``hidden`` is a list (the schema's int_list): the bundle spec keeps it, so
    the model is built with those layer widths, not the default ones."""
    from training.bundle import build_model

    job = _job(demo_parquet, tmp_path, hidden=[16, 8], scheduler={"auto_recommend": True})
    spec = data.load(job).spec
    assert spec.hparams["hidden"] == [16, 8] and "scheduler" not in spec.hparams
    model = build_model(spec)
    widths = [layer.out_features for layer in model.deep if isinstance(layer, torch.nn.Linear)]
    assert widths == [16, 8]
