"""The pure parts of the quality bench: the shared split (the same rows for every model, every
run), the one metric code (ECE), and the summary arithmetic. The benchmark itself is not run
here, and the datasets are not read: the fixtures write small files in the formats of
MovieLens 100K (``u.user``, ``u.item``, ``u.data``) and of the Criteo sample (a CSV with a
header), so the suite needs nothing outside the repository."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench.areas import quality
from bench.harness import BenchError
from training import data, evaluation

CRITEO_ROWS = 200
RATINGS = 1000


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    """200 rows like the Criteo sample: label, I1-I13 (some empty), C1-C26 hashed strings."""
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("criteo") / "criteo_sample.txt"
    header = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    lines = [",".join(header)]
    for _ in range(CRITEO_ROWS):
        ints = ["" if rng.random() < 0.3 else str(int(rng.integers(0, 500))) for _ in range(13)]
        cats = [f"{int(rng.integers(0, 6)):08x}" for _ in range(26)]
        lines.append(",".join([str(int(rng.random() < 0.25)), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def movielens_dir(tmp_path_factory):
    """MovieLens 100K's three files for 30 users, 40 items and 1,000 ratings."""
    rng = np.random.default_rng(12)
    folder = tmp_path_factory.mktemp("movielens")
    jobs = ["student", "engineer", "artist"]
    (folder / "u.user").write_text(
        "".join(
            f"{u}|{int(rng.integers(18, 60))}|{'MF'[u % 2]}|{jobs[u % 3]}|{10000 + u}\n"
            for u in range(1, 31)
        )
    )
    items = []
    for i in range(1, 41):
        flags = "|".join(str(int(rng.random() < 0.2)) for _ in range(19))
        items.append(f"{i}|Film {i} (1995)|01-Jan-{1980 + i % 20}||http://x|{flags}\n")
    (folder / "u.item").write_text("".join(items), encoding="latin-1")
    start = 874_724_710
    (folder / "u.data").write_text(
        "".join(
            f"{int(rng.integers(1, 31))}\t{int(rng.integers(1, 41))}\t"
            f"{int(rng.integers(1, 6))}\t{start + int(rng.integers(0, 10_000_000))}\n"
            for _ in range(RATINGS)
        )
    )
    return folder


@pytest.fixture(scope="module")
def criteo(criteo_file):
    return quality.load_criteo(criteo_file)


@pytest.fixture(scope="module")
def movielens(movielens_dir):
    return quality.load_movielens(movielens_dir)


def test_the_criteo_split_is_the_same_every_time_and_stratified(criteo, criteo_file):
    again = quality.load_criteo(criteo_file)
    split = criteo.frame["split"].to_numpy()
    assert np.array_equal(split, again.frame["split"].to_numpy())
    assert quality.split_digest(split) == quality.split_digest(again.frame["split"])
    y = criteo.frame[quality.LABEL].to_numpy()
    assert len(split) == CRITEO_ROWS and set(split) == set(quality.SPLITS)
    # 70/10/20 within each class, so every part has clicks and non-clicks
    for cls in (0, 1):
        n = int((y == cls).sum())
        counts = {s: int(((split == s) & (y == cls)).sum()) for s in quality.SPLITS}
        assert counts["train"] == round(0.7 * n) and counts["validation"] == round(0.1 * n)
        assert sum(counts.values()) == n and counts["test"] > 0
    # another seed gives other rows: the seed, not chance, fixes them
    assert not np.array_equal(quality.stratified_split(y, seed=1), split)


def test_the_movielens_split_is_time_ordered(movielens):
    frame = movielens.frame
    counts = frame["split"].value_counts().to_dict()
    assert counts == {"train": 700, "validation": 100, "test": 200}  # 70/10/20 of 1,000
    times = {s: frame.loc[frame["split"] == s, "event_time"] for s in quality.SPLITS}
    assert times["train"].max() <= times["validation"].min()
    assert times["validation"].max() <= times["test"].min()
    assert frame[quality.LABEL].isin([0, 1]).all()


def test_every_model_gets_the_same_rows(criteo, tmp_path):
    # The peers read the shared Parquet file, LR and LightGBM the frame, the platform its own
    # table through its real loader with ``split_column``: the same rows and labels in each.
    shared = pd.read_parquet(quality.write_shared(criteo, tmp_path))
    assert shared["split"].tolist() == criteo.frame["split"].tolist()
    table_path = tmp_path / "platform.parquet"
    pq.write_table(quality.platform_table(criteo), table_path)
    settings = quality.Settings()
    base = quality.platform_base_params(criteo, settings)
    # 20 validation rows: the sample is cross-fitted, its pool the train and validation rows.
    assert base["cv_folds"] == quality.CV_FOLDS
    pooled = data.load(quality.job_spec(table_path, criteo, "logreg", tmp_path, base, "flags"))
    not_test = np.flatnonzero(criteo.frame["split"].to_numpy() != "test")
    assert np.array_equal(pooled.rows["train"], not_test) and not len(pooled.rows["validation"])
    plain = {k: v for k, v in base.items() if k != "cv_folds"}
    spec = quality.job_spec(table_path, criteo, "logreg", tmp_path / "job", plain, "flags")
    loaded = data.load(spec)
    for split in quality.SPLITS:
        positions = np.flatnonzero(criteo.frame["split"].to_numpy() == split)
        # Criteo's stand-in event times follow the file order, so the loader's time order is
        # the frame's order and the positions must match exactly.
        assert np.array_equal(loaded.rows[split], positions)
        assert np.array_equal(
            shared.loc[shared["split"] == split, quality.LABEL], criteo.labels(split)
        )
    assert np.array_equal(loaded.holdout.label.numpy(), criteo.labels("test"))
    assert np.array_equal(loaded.validation.label.numpy(), criteo.labels("validation"))
    # every platform feature column is in the table the loader read
    names = set(pq.read_schema(table_path).names)
    assert {f["column"] for f in spec.features} <= names


def test_platform_features_switch_genres_between_flags_and_a_list(movielens):
    flags = quality.platform_features(movielens, "flags")
    listed = quality.platform_features(movielens, "list")
    assert sum(f["column"].startswith("ml_item__is_") for f in flags) == 19
    assert not any(f["column"].startswith("ml_item__is_") for f in listed)
    assert [f["dtype"] for f in listed if f["column"] == "ml_item__genres"] == ["categorical_list"]
    dtypes = {f["column"]: f["dtype"] for f in flags}
    assert dtypes["ml_user__id"] == "categorical" and dtypes["ml_user__age"] == "float"
    assert dtypes["ml_item__is_drama"] == "int"


def test_ece_uses_ten_equal_width_bins():
    # bin [0.1, 0.2): two rows at 0.15, one click -> |1 - 0.3| = 0.7
    # bin [0.9, 1.0]: two rows at 0.95, two clicks -> |2 - 1.9| = 0.1
    label = [0, 1, 1, 1]
    prob = [0.15, 0.15, 0.95, 0.95]
    assert quality.ece(label, prob) == pytest.approx((0.7 + 0.1) / 4)
    # perfectly calibrated within each bin
    assert quality.ece([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.0)
    # p = 1.0 falls in the last bin, not an eleventh
    assert quality.ece([1], [1.0]) == pytest.approx(0.0)
    rng = np.random.default_rng(3)
    y, p = rng.integers(0, 2, 500), rng.random(500)
    assert quality.ece(y, p) == pytest.approx(evaluation.ece(y, p))


def test_score_is_sklearn_auc_and_clipped_logloss():
    metrics = quality.score([0, 1, 1, 0], [0.1, 0.8, 0.6, 0.7])
    assert metrics["auc"] == pytest.approx(0.75)
    assert metrics["logloss"] == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.6, 0.3])), rel=1e-9)
    # a confident mistake is clipped, not infinite
    assert np.isfinite(quality.score([1, 0], [0.0, 0.0])["logloss"])
    with pytest.raises(ValueError, match="predictions for"):
        quality.score([0, 1], [0.5])


def test_summary_takes_the_best_peer_per_metric():
    results = {
        "platform_best": {"auc": 0.80, "logloss": 0.45},
        "lr": {"auc": 0.78, "logloss": 0.44},  # best peer on log loss
        "lightgbm": {"auc": 0.81, "logloss": 0.47},  # best peer on AUC
        "fuxictr_dcnv2": {"auc": 0.79, "logloss": 0.46},
        "platform_logreg": {"auc": 0.99, "logloss": 0.01},  # the platform's: never a peer
    }
    out = quality.summarise("ds", results)
    assert out["auc_best_platform_minus_best_peer_ds"] == pytest.approx(0.80 - 0.81)
    assert out["logloss_best_platform_minus_best_peer_ds"] == pytest.approx(0.45 - 0.44)
    with pytest.raises(ValueError, match="at least one peer"):
        quality.summarise("ds", {"platform_best": {"auc": 0.8, "logloss": 0.4}})


def test_small_data_is_measured_on_several_random_splits(criteo, movielens, criteo_file):
    seeds = quality.outer_split_seeds(criteo)
    # The shared split first, then the next seeds; MovieLens (time order) keeps its one split.
    assert seeds[0] is None and len(seeds) == quality.OUTER_SPLITS
    assert seeds[1:] == [quality.CRITEO_SPLIT_SEED + k for k in range(1, quality.OUTER_SPLITS)]
    assert quality.outer_split_seeds(movielens) == [None]
    other = quality.load_criteo(criteo_file, seed=seeds[1])
    y = other.frame[quality.LABEL].to_numpy()
    split = other.frame["split"].to_numpy()
    assert not np.array_equal(split, criteo.frame["split"].to_numpy())
    assert np.array_equal(y, criteo.frame[quality.LABEL].to_numpy())  # the same rows, re-cut
    for cls in (0, 1):
        n = int((y == cls).sum())
        assert int(((split == "validation") & (y == cls)).sum()) == round(0.1 * n)


def test_splits_combine_into_means_spreads_and_a_summary_of_the_means():
    def found(best_auc, best_ll, lr_auc, lr_ll):
        out = {"tuning_s_ds": 10.0}
        for model, auc, ll in (
            ("platform_best", best_auc, best_ll),
            ("platform_top", best_auc, best_ll),
            ("lr", lr_auc, lr_ll),
        ):
            out.update({f"auc_{model}_ds": auc, f"logloss_{model}_ds": ll, f"ece_{model}_ds": 0.1})
            out.update({f"auc_{model}_ds_sd": 0.02, f"logloss_{model}_ds_sd": 0.04})
            out[f"ece_{model}_ds_sd"] = 0.0
        out.update(
            quality.summarise(
                "ds",
                {
                    "platform_best": {"auc": best_auc, "logloss": best_ll},
                    "lr": {"auc": lr_auc, "logloss": lr_ll},
                },
            )
        )
        return out

    # Split 1 the platform loses on both, split 2 it wins on both by more.
    out = quality.combine_splits(
        "ds", [found(0.60, 0.55, 0.62, 0.54), found(0.80, 0.40, 0.70, 0.48)]
    )
    assert out["auc_platform_best_ds"] == pytest.approx(0.70)
    assert out["auc_platform_best_ds_sd"] == pytest.approx(np.std([0.60, 0.80], ddof=1))
    assert out["auc_platform_best_ds_seed_sd"] == pytest.approx(0.02)
    assert out["logloss_lr_ds"] == pytest.approx(0.51)
    assert out["auc_best_platform_minus_best_peer_ds"] == pytest.approx(0.70 - 0.66)
    assert out["logloss_best_platform_minus_best_peer_ds"] == pytest.approx(0.475 - 0.51)
    assert out["logloss_top_platform_minus_best_peer_ds"] == pytest.approx(0.475 - 0.51)
    assert "tuning_s_ds" not in out  # the caller sums it


def test_mean_sd_is_the_sample_spread():
    assert quality.mean_sd([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert quality.mean_sd([0.5]) == (0.5, 0.0)


def test_settings_from_the_environment():
    assert quality.Settings.from_env({}).seeds == (0, 1, 2)
    quick = quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_QUICK": "1"})
    assert quick.seeds == (0,) and quick.tuning_budget_s < quality.TUNING_BUDGET_S
    only = quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_DATASETS": "criteo"})
    assert only.datasets == ("criteo",)
    with pytest.raises(BenchError, match="unknown quality datasets"):
        quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_DATASETS": "avazu"})
    with pytest.raises(BenchError, match="GENRES"):
        quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_GENRES": "bits"})
    assert quality.Settings.from_env({}).final == "cv"
    assert quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_FINAL": "members"}).final == "members"
    with pytest.raises(BenchError, match="FINAL"):
        quality.Settings.from_env({"RANKOPS_BENCH_QUALITY_FINAL": "refit"})


def test_final_models_are_cross_fitted_or_averaged_members():
    cv, members = quality.Settings(), quality.Settings(final="members")
    tuned = {"lr": 0.01, "seed": 0}
    for template in quality.TEMPLATES:  # every template of the bench cross-fits
        assert quality.final_params(template, tuned, cv) == {**tuned, "cv_folds": 5}
    assert quality.final_params("deepfm", tuned, members) == {**tuned, "members": 3}
    assert quality.final_params("logreg", tuned, members) == tuned  # no members param
    small = {**tuned, "cv_folds": 5}  # tuned cross-fitted (the Criteo sample): kept as tuned
    assert quality.final_params("deepfm", small, members) == small
    assert quality.final_params("deepfm", small, cv) == small
    assert tuned == {"lr": 0.01, "seed": 0}  # not changed in place


def test_fuxictr_gets_the_published_bars_config_and_the_right_columns(movielens, criteo, tmp_path):
    settings = quality.Settings()
    ml = quality.fuxictr_config(movielens, tmp_path / "m.parquet", "DCNv2", tmp_path, settings)
    assert ml["params"]["num_cross_layers"] == 5 and ml["params"]["embedding_regularizer"] == 0.01
    assert "age" in ml["categorical"] and ml["bucketed"] == []
    cr = quality.fuxictr_config(criteo, tmp_path / "c.parquet", "DeepFM", tmp_path, settings)
    assert cr["params"]["hidden_units"] == [400, 400, 400] and cr["batch_size"] == 4096
    assert cr["bucketed"] == [f"I{i}" for i in range(1, 14)]
    assert sorted(quality.fuxictr_requirements())[0].startswith("fuxictr==2.3.10")


def test_the_platform_choice_reads_validation_only_and_the_ensemble_competes(criteo):
    """Made-up predictions on the sample's rows: ``platform_best`` is the template with the best
    cross-fitted validation log loss whatever the test rows say, ``platform_top`` also weighs
    the ensemble, and the ensemble blends the templates seed by seed."""
    rng = np.random.default_rng(0)
    y_val, y_test = criteo.labels("validation"), criteo.labels("test")

    def runs(val_signal: float, test_signal: float) -> dict:
        def prob(y, signal):
            return 1 / (1 + np.exp(-(signal * (2 * y - 1) + rng.normal(0, 1, len(y)))))

        return {
            "runs": [
                {"validation": prob(y_val, val_signal), "test": prob(y_test, test_signal)}
                for _ in range(2)
            ]
        }

    models = {
        "platform_logreg": runs(1.5, 0.0),  # good on validation, useless on test
        "platform_deepfm": runs(0.5, 2.0),
        "lr": runs(1.0, 1.0),
    }
    blended = quality.platform_ensemble(models, y_val)
    assert blended is not None and len(blended["runs"]) == 2
    for blend in blended["params"]["blends"]:
        assert set(blend["weights"]) == {"platform_logreg", "platform_deepfm"}
        assert sum(blend["weights"].values()) == pytest.approx(1.0)
    models[quality.ENSEMBLE] = blended
    measures, details = quality.dataset_measures(criteo, models)
    assert details["platform_best"] == "logreg"  # chosen on validation, though worse on test
    assert details["platform_top"] in {"logreg", "ensemble"}
    assert measures["auc_platform_best_criteo"] == measures["auc_platform_logreg_criteo"]
    for key in (
        "auc_top_platform_minus_best_peer_criteo",
        "logloss_best_platform_minus_best_peer_criteo",
    ):
        assert key in measures
    honest = details["platform_logreg"]["validation_crossfit_logloss"]
    assert np.isfinite(honest) and honest != details["platform_logreg"]["validation_logloss"]
    # The ensemble is judged by its own cross-fitted value (its weights saw the rows too).
    own = [run["crossfit_logloss"] for run in blended["runs"]]
    assert details["platform_ensemble"]["validation_crossfit_logloss"] == pytest.approx(
        np.mean(own)
    )
    assert quality.platform_ensemble({"platform_logreg": models["platform_logreg"]}, y_val) is None


def test_cross_fitted_templates_are_chosen_on_their_out_of_fold_rows(criteo):
    """With every run cross-fitted, the choice reads the pooled out-of-fold rows, not the
    validation predictions (which the folds' average trained on)."""
    rng = np.random.default_rng(1)
    y_val, y_test = criteo.labels("validation"), criteo.labels("test")
    y_pool = criteo.frame.loc[criteo.frame["split"] != "test", quality.LABEL].to_numpy(float)

    def prob(y, signal):
        return 1 / (1 + np.exp(-(signal * (2 * y - 1) + rng.normal(0, 1, len(y)))))

    def runs(val_signal: float, oof_signal: float) -> dict:
        return {
            "runs": [
                {
                    "validation": prob(y_val, val_signal),
                    "test": prob(y_test, 1.0),
                    "out_of_fold": {"label": y_pool, "prob": prob(y_pool, oof_signal)},
                }
                for _ in range(2)
            ]
        }

    models = {
        "platform_logreg": runs(0.2, 2.0),  # poor on validation, good out of fold
        "platform_deepfm": runs(3.0, 0.2),  # memorised the validation rows
        "lr": runs(1.0, 1.0),
    }
    assert quality.choose_template(y_val, {m: models[m] for m in models if m != "lr"}) == (
        "platform_logreg"
    )
    blended = quality.platform_ensemble(models, y_val)
    assert blended is not None
    assert all(b["weights"]["platform_logreg"] > 0.5 for b in blended["params"]["blends"])
    # Without out-of-fold rows on every run, the validation rows decide.
    del models["platform_logreg"]["runs"][0]["out_of_fold"]
    assert quality.choose_template(y_val, {m: models[m] for m in models if m != "lr"}) == (
        "platform_deepfm"
    )
