"""Encoding as the reference CTR libraries do it (``training.bundle``'s docstring): vocabularies
fitted on the train rows only with a minimum count and an out-of-vocabulary index, hashing above
``max_vocab`` and for bundles written before vocabularies, lists of categories padded into the
categorical matrix and mean-pooled by ``training.templates.inputs``, numeric fields standardised
(optionally after a log). No database: the runner runs in-process, as in test_templates."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training import data, evaluation, runner
from training.bundle import (
    SPEC_FILE,
    BundleSpec,
    FeatureEncoder,
    FeatureSpec,
    build_model,
    hash_bucket,
    load_bundle,
)
from training.templates.inputs import FieldEmbedding

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FEATURES = [
    {"ref": "u:city", "column": "u__city", "dtype": "categorical", "entity": "user"},
    {"ref": "u:recent", "column": "u__recent", "dtype": "categorical_list", "entity": "user"},
    {"ref": "u:age", "column": "u__age", "dtype": "int", "entity": "user"},
    {"ref": "u:visits", "column": "u__visits", "dtype": "int", "entity": "user"},
    {"ref": "u:new", "column": "u__new", "dtype": "bool", "entity": "user"},
    {"ref": "i:cat", "column": "i__cat", "dtype": "string", "entity": "item"},
]
TOPICS = ["sports", "travel", "food", "music", "news"]


def write_table(path, columns: dict, n: int) -> str:
    table = pa.table(
        {
            "event_time": pa.array([T0 + timedelta(minutes=i) for i in range(n)]),
            **columns,
        }
    )
    pq.write_table(table, path)
    return str(path)


def job(path, tmp_path, template="logreg", **params) -> data.JobSpec:
    return data.JobSpec(
        job_id=1,
        template=template,
        dataset_path=str(path),
        features=[dict(f) for f in FEATURES],
        work_dir=str(tmp_path / template),
        label="click",
        params={"validation_fraction": 0.0, "holdout_fraction": 0.2, **params},
    )


def feature(spec: BundleSpec, ref: str) -> FeatureSpec:
    return next(f for f in spec.features if f.ref == ref)


def small_dataset(tmp_path) -> str:
    """100 rows, time-ordered: the first 80 train, the newest 20 test."""
    city = ["a"] * 40 + ["b"] * 20 + ["d"] * 7 + ["c"] * 7 + ["rare"] + [None] * 5
    city += ["new"] * 10 + ["a"] * 5 + [None] * 5  # test rows: "new" is never seen in training
    recent = [["sports", "food"], ["food"], None, [], ["sports", "travel", "food", "music", "x"]]
    recent = (recent * 16) + [["only_in_test"]] * 20
    return write_table(
        tmp_path / "small.parquet",
        {
            "u__city": city,
            "u__recent": pa.array(recent, type=pa.list_(pa.string())),
            "u__age": [None if i % 10 == 0 else 20 + i % 30 for i in range(100)],
            "u__visits": [int(10 ** (i % 5)) for i in range(100)],
            "u__new": [i % 3 == 0 for i in range(100)],
            "i__cat": [f"k{i % 4}" for i in range(100)],
            "click": [i % 2 for i in range(100)],
        },
        100,
    )


def test_the_vocabulary_is_fitted_on_train_rows_only_by_count_then_value(tmp_path):
    loaded = data.load(job(small_dataset(tmp_path), tmp_path))
    city = feature(loaded.spec, "u:city")
    # "rare" (once) is below the default minimum count of 2; "c" and "d" tie and sort by text.
    assert city.vocab == ["a", "b", "c", "d"]
    assert (city.buckets, city.oov_index) == (5, 5)
    train_raw = pq.read_table(tmp_path / "small.parquet")["u__city"].to_pylist()
    assert loaded.spec.categorical_features[0] is city  # column 0 of the cat matrix
    train_cat = loaded.train.cat[:, 0].tolist()
    expected = {"a": 1, "b": 2, "c": 3, "d": 4, "rare": 5, None: 0}
    assert train_cat == [expected[v] for v in train_raw[:80]]
    # The test rows: "new" only appears there, so it is out of vocabulary, like "rare".
    test_cat = loaded.holdout.cat[:, 0].tolist()
    assert test_cat == [5] * 10 + [1] * 5 + [0] * 5


def test_min_count_one_keeps_every_train_value(tmp_path):
    loaded = data.load(job(small_dataset(tmp_path), tmp_path, vocab_min_count=1))
    city = feature(loaded.spec, "u:city")
    assert city.vocab == ["a", "b", "c", "d", "rare"]
    assert city.buckets == 6
    encoded = FeatureEncoder(loaded.spec).encode({"u__city": ["rare", "new", None, "b"]}, 4)[1]
    assert encoded[:, 0].tolist() == [5, 6, 0, 2]


def test_a_list_feature_is_padded_truncated_and_shares_one_vocabulary(tmp_path):
    path = small_dataset(tmp_path)
    loaded = data.load(job(path, tmp_path))
    recent = feature(loaded.spec, "u:recent")
    assert recent.dim == 5  # the longest train list (under max_list_length 8)
    # Items over every train list: food 48, sports 32, music/travel 16, "x" 16; test-only
    # items are not in it.
    assert recent.vocab == ["food", "sports", "music", "travel", "x"]
    assert recent.buckets == 6
    short = data.load(job(path, tmp_path, max_list_length=3)).spec
    recent3 = feature(short, "u:recent")
    assert recent3.dim == 3
    encoder = FeatureEncoder(short)
    rows = [["sports"], None, [], ["sports", "travel", "food", "music"], ["zzz", "food"], "food"]
    _, cat = encoder.encode({"u:recent": rows}, len(rows))  # by ref, as serving sends it
    start = 1  # u:city takes column 0
    assert cat[:, start : start + 3].tolist() == [
        [2, 0, 0],
        [0, 0, 0],
        [0, 0, 0],
        [2, 4, 1],  # the first three items
        [6, 1, 0],  # an unknown item is OOV, not padding
        [1, 0, 0],  # a bare value is a one-item list
    ]
    assert cat.shape == (len(rows), 1 + 3 + 1)  # city, recent's slots, i:cat
    # A dataset's Arrow column (sliced in Arrow) encodes as the same Python lists do, an
    # integer item as its text and a null item as padding.
    lists = [["sports", None, "food"], None, [], ["x", "zzz", "music", "food"]]
    arrow = encoder.encode({"u__recent": pa.array(lists)}, 4)[1]
    assert arrow.tolist() == encoder.encode({"u__recent": lists}, 4)[1].tolist()
    assert arrow[:, 1:4].tolist() == [[2, 0, 1], [0, 0, 0], [0, 0, 0], [5, 6, 3]]
    ints = FeatureEncoder(
        BundleSpec("logreg", [FeatureSpec("n", "n", "categorical_list", dim=2, vocab=["7"])])
    )
    as_arrow = ints.encode({"n": pa.array([[7, 8], [8, 7]], type=pa.list_(pa.int32()))}, 2)[1]
    assert as_arrow.tolist() == ints.encode({"n": [["7", 8], [8, "7"]]}, 2)[1].tolist()
    assert as_arrow.tolist() == [[1, 2], [2, 1]]


def test_null_and_numeric_fields_are_standardised_and_log_is_optional(tmp_path):
    path = small_dataset(tmp_path)
    spec = data.load(job(path, tmp_path)).spec
    age = feature(spec, "u:age")
    train_ages = [None if i % 10 == 0 else 20 + i % 30 for i in range(80)]
    known = np.array([a for a in train_ages if a is not None], dtype=np.float64)
    assert (age.mean, age.std) == pytest.approx((known.mean(), known.std()))
    dense, _ = FeatureEncoder(spec).encode({"u__age": [None, age.mean], "u__new": [True, False]}, 2)
    assert dense[:, 0].tolist() == [0.0, 0.0]  # a null is the mean
    new = feature(spec, "u:new")
    assert dense[:, 2].tolist() == pytest.approx(
        [(1 - new.mean) / new.std, (0 - new.mean) / new.std]
    )  # a bool is 0/1
    logged = data.load(job(path, tmp_path, numeric_transform="log")).spec
    visits = feature(logged, "u:visits")
    assert visits.transform == "log" and feature(logged, "u:new").transform == ""
    train_visits = np.log1p(np.array([10 ** (i % 5) for i in range(80)], dtype=np.float64))
    assert visits.mean == pytest.approx(train_visits.mean())
    dense, _ = FeatureEncoder(logged).encode({"u__visits": [10_000, -5, None]}, 3)
    assert dense[:, 1].tolist() == pytest.approx(
        [(np.log1p(10_000) - visits.mean) / visits.std, (0 - visits.mean) / visits.std, 0.0],
        rel=1e-6,
    )


def test_above_max_vocab_a_feature_hashes(tmp_path):
    path = small_dataset(tmp_path)
    spec = data.load(job(path, tmp_path, max_vocab=3)).spec
    city = feature(spec, "u:city")
    assert city.vocab == []  # four kept values, more than 3
    assert city.buckets == data.choose_buckets(["a", "b", "d", "c", "rare"])
    values = ["a", "b", "new", None]
    encoded = FeatureEncoder(spec).encode({"u__city": values}, 4)[1][:, 0]
    assert encoded.tolist() == hash_bucket(values, city.buckets).tolist()
    assert feature(spec, "i:cat").vocab == []
    # At the limit a feature keeps its vocabulary; the list's five items hash.
    at_limit = data.load(job(path, tmp_path, max_vocab=4)).spec
    assert feature(at_limit, "u:city").vocab == ["a", "b", "c", "d"]
    recent = feature(at_limit, "u:recent")
    assert recent.vocab == [] and recent.buckets >= data.MIN_BUCKETS
    _, cat = FeatureEncoder(at_limit).encode({"u__recent": [["food", "zzz"]]}, 1)
    assert cat[0, 1:3].tolist() == hash_bucket(["food", "zzz"], recent.buckets).tolist()


def test_a_hash_only_bundle_written_before_vocabularies_encodes_as_before():
    old = BundleSpec.from_json(
        {
            "format": "rankops-bundle/1",
            "template": "logreg",
            "features": [
                {"ref": "u:a", "column": "u__a", "dtype": "categorical", "dim": 1, "buckets": 16}
            ],
        }
    )
    assert old.features[0].vocab == []
    _, cat = FeatureEncoder(old).encode({"u__a": ["a", "b", None, "c", 7, "7"]}, 6)
    # The values hash_bucket gave before this change (computed with that code).
    assert cat[:, 0].tolist() == [1, 16, 0, 1, 1, 1]
    assert hash_bucket(["sports", "travel", "x"], 1000).tolist() == [895, 662, 318]


SINGLE = [
    FeatureSpec("u:a", "u__a", "categorical", "user", buckets=7),
    FeatureSpec("i:b", "i__b", "string", "item", buckets=5),
    FeatureSpec("u:x", "u__x", "float", "user"),
    FeatureSpec("i:e", "i__e", "embedding", "item", dim=3),
]
# Each template's state-dict keys before FieldEmbedding (computed with that code): saved
# bundles load into the new modules.
KEYS = {
    "logreg": ["bias", "cat_weights.0.weight", "cat_weights.1.weight", "linear.bias"],
    "fine_ranking": ["embeddings.0.weight", "embeddings.1.weight", "head.weight"],
    "deepfm": [
        "cat_embeddings.0.weight",
        "cat_embeddings.1.weight",
        "cat_weights.0.weight",
        "cat_weights.1.weight",
        "dense_embeddings.1.weight",
    ],
    "two_tower": [
        "item.cat_idx",
        "item.embeddings.0.weight",
        "user.cat_idx",
        "user.dense_idx",
        "user.embeddings.0.weight",
    ],
}


@pytest.mark.parametrize("template", sorted(KEYS))
def test_single_valued_fields_keep_their_state_dict_keys(template):
    keys = set(build_model(BundleSpec(template=template, features=SINGLE)).state_dict())
    assert set(KEYS[template]) <= keys
    assert not any("tables" in k for k in keys)


def test_field_embedding_mean_pools_a_list_and_looks_a_single_value_up():
    spec = BundleSpec(
        template="logreg",
        features=[
            FeatureSpec("u:a", "u__a", "categorical", buckets=4),
            FeatureSpec("u:l", "u__l", "categorical_list", dim=3, buckets=6),
        ],
    )
    torch.manual_seed(0)
    embed = FieldEmbedding(spec, 4)
    cat = torch.tensor([[2, 1, 3, 0], [0, 5, 0, 0], [1, 0, 0, 0]])
    out = embed(cat)
    assert out.shape == (3, 2, 4)
    assert torch.equal(out[:, 0], embed[0](cat[:, 0]))
    table = embed[1].weight
    assert torch.allclose(out[0, 1], (table[1] + table[3]) / 2)  # padding ignored
    assert torch.allclose(out[1, 1], table[5])
    assert torch.equal(out[2, 1], torch.zeros(4))  # an empty list: zeros


def trainable_dataset(tmp_path, n: int = 3000) -> str:
    """Clicks follow the ``sports`` item of the list feature and the city."""
    rng = np.random.default_rng(0)
    recent, city, click = [], [], []
    for _ in range(n):
        items = list(rng.choice(TOPICS, size=int(rng.integers(0, 4)), replace=False))
        c = str(rng.choice(["a", "b", "c"]))
        p = 0.1 + 0.6 * ("sports" in items) + 0.2 * (c == "a")
        recent.append(items)
        city.append(c)
        click.append(int(rng.random() < p))
    return write_table(
        tmp_path / "train.parquet",
        {
            "u__city": city,
            "u__recent": pa.array(recent, type=pa.list_(pa.string())),
            "u__age": rng.integers(18, 60, n).tolist(),
            "u__visits": rng.integers(0, 1000, n).tolist(),
            "u__new": (rng.random(n) < 0.5).tolist(),
            "i__cat": [f"k{int(x)}" for x in rng.integers(0, 5, n)],
            "click": click,
        },
        n,
    )


@pytest.mark.parametrize("template", ["logreg", "fine_ranking", "deepfm", "two_tower"])
def test_a_trained_bundle_encodes_in_serving_as_in_training(tmp_path, template):
    path = trainable_dataset(tmp_path)
    spec_job = job(
        path,
        tmp_path,
        template,
        epochs=3,
        batch_size=128,
        lr=0.05,
        threads=1,
        validation_fraction=0.1,
        importance=True,
    )
    events: list[dict] = []
    assert runner.train(spec_job, emit=runner.Emitter(sink=events.append)) == 0
    done = next(e for e in events if e["type"] == "done")
    # The list feature has a permutation importance like any field.
    assert "u:recent" in done["metrics"]["importance"]
    # The spec is JSON with its vocabularies (no pickle).
    written = json.loads((spec_job.model_dir / SPEC_FILE).read_text())
    by_ref = {f["ref"]: f for f in written["features"]}
    assert set(by_ref["u:recent"]["vocab"]) == set(TOPICS) and by_ref["u:recent"]["dim"] == 3
    assert sorted(by_ref["u:city"]["vocab"]) == ["a", "b", "c"]
    bundle = load_bundle(spec_job.model_dir)
    table = data.read_table(path, [f["column"] for f in FEATURES])
    head = table.slice(table.num_rows - 50, 50)
    from_arrow = bundle.predict({c: head.column(c) for c in head.column_names}, 50)
    # Serving hands the encoder plain Python values by ref (the online store's JSON).
    by_ref_values = {f["ref"]: head.column(f["column"]).to_pylist() for f in FEATURES}
    from_python = bundle.predict(by_ref_values, 50)
    split = data.encode_split(bundle.spec, head, "click")
    trained = evaluation.predict(
        bundle.model, split.dense, split.cat, calibration=bundle.spec.extra.get("calibration")
    )
    assert np.allclose(from_arrow, trained, atol=1e-6)
    assert np.allclose(from_python, trained, atol=1e-6)

    # The list's items move the score; order and padding do not (mean pooling).
    def score(items):
        row = {**{ref: [values[0]] for ref, values in by_ref_values.items()}, "u:recent": [items]}
        return float(bundle.predict(row, 1)[0])

    assert abs(score(["sports"]) - score(["food"])) > 1e-3
    assert score(["sports", "food"]) == pytest.approx(score(["food", "sports"]), abs=1e-6)
    assert score(["sports", None]) == pytest.approx(score(["sports"]), abs=1e-6)
    if template != "two_tower":  # recall scores user x item affinity, not the click rate
        assert done["metrics"]["holdout"]["auc"] > 0.7, done["metrics"]["holdout"]


def test_lightgbm_takes_a_list_feature_as_one_column_per_slot(tmp_path):
    path = trainable_dataset(tmp_path)
    spec_job = job(path, tmp_path, "lightgbm", threads=1, validation_fraction=0.1)
    events: list[dict] = []
    assert runner.train(spec_job, emit=runner.Emitter(sink=events.append)) == 0, [
        e for e in events if e["type"] == "error"
    ]
    bundle = load_bundle(spec_job.model_dir)
    table = data.read_table(path, [f["column"] for f in FEATURES])
    head = table.slice(table.num_rows - 50, 50)
    split = data.encode_split(bundle.spec, head, "click")
    trained = evaluation.predict(
        bundle.model, split.dense, split.cat, calibration=bundle.spec.extra.get("calibration")
    )
    served = bundle.predict({c: head.column(c) for c in head.column_names}, 50)
    assert np.allclose(served, trained, atol=1e-9)
    by_ref_values = {f["ref"]: head.column(f["column"]).to_pylist() for f in FEATURES}

    def score(items):
        row = {**{ref: [values[0]] for ref, values in by_ref_values.items()}, "u:recent": [items]}
        return float(bundle.predict(row, 1)[0])

    assert score(["sports"]) > score(["food"])  # clicks follow sports
