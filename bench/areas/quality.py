"""Quality: the platform's tuned templates against FuxiCTR, LightGBM and scikit-learn LR.

Two datasets from ``../shared/data`` (``BENCH_DATA_DIR`` overrides the folder,
``BENCH_MOVIELENS_DIR`` / ``BENCH_CRITEO_FILE`` each dataset; nothing is copied into the repo).
Variants of the rows: ``BENCH_SPLIT_SEED`` another seed for the random splits,
``BENCH_MOVIELENS_SPLIT=random`` MovieLens split at random (stratified) instead of by time:

- ``movielens``: MovieLens 100K, a rating >= 4 is a click; user id, age, gender, occupation,
  item id, release year and the 19 genre flags. **Time-ordered split**: the ratings sorted by
  time (stable), the oldest 70% train, the next 10% validation, the newest 20% test - nobody
  learns from the future it is scored on.
- ``criteo``: the 200-row Criteo sample (label, I1-I13, C1-C26). It has no time column, so the
  split is **seeded random and stratified by the label**, 70/10/20 within each class: with so few
  rows an unstratified draw can leave the 20 validation rows (early stopping, calibration, the
  choice of C) with almost no clicks. The seed is fixed (``SPLIT_SEED``), so every run and every
  model gets the same rows. **Outer splits:** 40 test rows (10 clicks) give a log-loss standard
  error of about 0.08, wider than the differences between the models, so small data (fewer than
  ``CV_BELOW_VALIDATION_ROWS`` validation rows, split at random) is measured on
  ``OUTER_SPLITS`` (5; ``BENCH_OUTER_SPLITS``) stratified splits, the shared one and the next
  seeds: every model is trained, tuned and scored on each (the platform's tuning budget for the
  dataset shared between them), the platform's choice made per split on its own validation rows,
  and each measure is the mean over the splits of the per-split means over the seeds, its
  ``_sd`` the spread of the per-split means and ``_seed_sd`` the mean spread over the seeds
  within a split (``combine_splits``; per-split summaries in ``parameters``).

The split is made once per run (``shared_split``) and written with the rows as one Parquet file
per dataset (its digest goes to ``parameters``); every model reads exactly those train /
validation / test rows. Training seeds ``SEEDS`` (0, 1, 2) vary only initialisation, batch order
and bagging, never the rows.

Models, each trained on the train rows, tuned or early-stopped on the validation rows only, and
scored on the test rows:

- ``platform_<template>`` (``logreg``, ``fine_ranking``, ``deepfm``, and ``lightgbm`` where the
  template exists): the platform's training child in-process (``training.runner.train``) on the
  dataset laid out as the platform reads it (``<group>__<feature>`` columns, ``event_time``, the
  label, ``split_column`` naming the shared split). With ``training.tuner`` present each template
  is tuned by ``tuner.optimise`` (validation log loss) within ``TUNING_BUDGET_S`` per dataset for
  all templates together (``tuning_s_<dataset>`` is the measured time); the best params are then
  trained over the seeds.
  **The final models are cross-fitted** (``final_params``): the tuned params with
  ``cv_folds`` = ``CV_FOLDS`` (5), a setting any job can give. The train and validation rows
  are pooled and cut into five folds; fold i's model never sees fold i (it trains on the other
  four, or on three where it stops early, stopping on fold i + 1); the calibration is fitted
  on the out-of-fold predictions; the model is the five folds' average. So the final model
  has learnt from the validation period too (the most recent rows before the test period, on
  MovieLens' time split), while the test
  rows still choose nothing. The peers keep their own protocols (trained on the train rows,
  stopped or tuned on the validation rows): the same rows for everyone, used as each method
  uses them. ``RANKOPS_BENCH_QUALITY_FINAL=members`` gives the earlier protocol for
  comparison: the final model of a template with the ``members`` param (``fine_ranking``,
  ``deepfm``) averages ``FINAL_MEMBERS`` (3) networks trained on the train rows from the seeds
  s, s + 1, s + 2. Measured on MovieLens (deepfm, the tuned params, seeds 0-2, one run): the
  cross-fitted model's test log loss 0.6229 +- 0.0005 and AUC 0.710 against 0.6269 and 0.700
  with three members.
  Without the tuner the templates run their defaults (``parameters`` says which). Test
  predictions come from the saved bundle (``load_bundle().predict``), the path serving uses,
  calibration included: the platform ships calibrated models.
  ``platform_best`` is chosen on the *cross-fitted validation* log loss (the calibration
  refitted on one half of the validation rows scores the other half), per row and averaged over
  the seeds, by the one-standard-error rule (``choose_template``): the simplest template
  (``SIMPLEST_FIRST``) within one standard error of the lowest - on 10,000 validation rows
  that is the lowest unless two are within about 0.001, on 20 rows it is logistic regression
  unless another is clearly better. Chosen without looking at the test rows.
  **Small data** (fewer than ``CV_BELOW_VALIDATION_ROWS`` validation rows: the Criteo sample):
  every template is tuned and trained with ``cv_folds`` = ``CV_FOLDS`` (5), the platform's
  k-fold cross-fitting over the train and validation rows (``training.data.cv_split``; the
  test rows stay out), so the tuner compares trials and the choice compares templates on the
  out-of-fold log loss of all 160 pooled rows instead of the 20 validation rows.
- ``platform_ensemble``: per seed, ``training.ensemble.fit_blend`` of the templates' calibrated
  validation probabilities, applied to their test probabilities (``platform_ensemble``).
  ``platform_top`` is the better of the templates and the ensemble by the same cross-fitted
  validation log loss. The issue's goal ("the best tuned template") is ``platform_best``;
  ``platform_top`` has its own goal line and ``*_top_platform_minus_best_peer_*`` measures.
- ``fuxictr_dcnv2`` / ``fuxictr_deepfm``: FuxiCTR 2.3.10 in its own venv (``quality_peer/``),
  with the published BARS hyperparameters (``BARS`` below, cited per dataset).
- ``lightgbm``: LightGBM 4.7.0 (the version the platform pins), categoricals native, early
  stopping on the validation log loss.
- ``lr``: scikit-learn ``LogisticRegression`` on one-hot categoricals and standardised numerics,
  C picked by validation log loss. Deterministic: its ``_sd`` is 0.

Peers are scored as they come (no calibration added). Every metric comes from the same code
(``score``): ``roc_auc_score`` and ``log_loss`` of scikit-learn (probabilities clipped to
[1e-7, 1 - 1e-7]) and ``ece``, 10 equal-width probability bins, sum over bins of
|clicks - sum of predicted| / rows.

Measures (means over the seeds, ``_sd`` the sample standard deviation): ``auc_<model>_<dataset>``,
``logloss_<model>_<dataset>``, ``ece_<model>_<dataset>``, ``tuning_s_<dataset>``, and
``auc_best_platform_minus_best_peer_<dataset>`` (> 0: the platform wins) and
``logloss_best_platform_minus_best_peer_<dataset>`` (< 0: the platform wins), the best peer being
the best of FuxiCTR, LightGBM and LR on that metric.

``RANKOPS_BENCH_QUALITY_QUICK=1``: one seed, few epochs, a 60 s tuning budget (development only).
``RANKOPS_BENCH_QUALITY_DATASETS=criteo`` runs a subset; ``RANKOPS_BENCH_QUALITY_GENRES=list``
gives MovieLens' genres to the platform as one ``categorical_list`` feature instead of 19 flags.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import REPO_ROOT, BenchError, Context, peer_venv


def _shared_data() -> Path:
    """``../shared/data`` beside the repository (or beside a folder above it: a git worktree
    under ``wt/`` finds the same one)."""
    for parent in REPO_ROOT.parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return REPO_ROOT.parent / "shared" / "data"


DATA_DIR = Path(os.environ.get("BENCH_DATA_DIR", _shared_data()))
MOVIELENS_DIR = Path(os.environ.get("BENCH_MOVIELENS_DIR", DATA_DIR / "movielens-100k"))
CRITEO_FILE = Path(
    os.environ.get("BENCH_CRITEO_FILE", DATA_DIR / "criteo-sample" / "criteo_sample.txt")
)
PEER_DIR = Path(__file__).resolve().parent / "quality_peer"

DATASETS = ("movielens", "criteo")
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)
SPLIT_SEED = 2026
# Variants of the rows (the goals must hold on data the templates were not tuned to): another
# seed for the random split, and MovieLens split at random instead of by time.
CRITEO_SPLIT_SEED = int(os.environ.get("BENCH_SPLIT_SEED", SPLIT_SEED))
MOVIELENS_SPLIT = os.environ.get("BENCH_MOVIELENS_SPLIT", "time")
SPLITS = ("train", "validation", "test")
SEEDS = (0, 1, 2)
# Two cores: the FuxiCTR peer trains in its own process on one while the platform, LightGBM
# and LR take the other (``run``), so the peers' long runs fit beside the platform's tuning.
THREADS = 1
TUNING_BUDGET_S = 600.0
TUNING_SHARE = 0.8
FINAL_MEMBERS = 3
# Small data: below this many validation rows every template is tuned and trained with
# ``cv_folds`` = CV_FOLDS (k-fold cross-fitting over the train and validation rows), and the
# choice reads the out-of-fold rows. 20 validation rows decide nothing; 160 pooled rows less so.
CV_BELOW_VALIDATION_ROWS = 200
CV_FOLDS = 5
# Outer splits of small data (``outer_split_seeds``): every model is measured on each, the
# tuning budget shared between them.
OUTER_SPLITS = int(os.environ.get("BENCH_OUTER_SPLITS", 5))
TEMPLATES = ("logreg", "fine_ranking", "deepfm", "lightgbm")
PEERS = ("fuxictr_dcnv2", "fuxictr_deepfm", "lightgbm", "lr")
ENSEMBLE = "platform_ensemble"
LABEL = "label"
PLATFORM_LABEL = "click"
EPS = 1e-7
ECE_BINS = 10
LR_C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)

GENRES = [
    "unknown", "action", "adventure", "animation", "children", "comedy", "crime", "documentary",
    "drama", "fantasy", "film_noir", "horror", "musical", "mystery", "romance", "sci_fi",
    "thriller", "war", "western",
]  # fmt: skip

# Published BARS configurations (FuxiCTR's benchmark), per dataset family: MovieLens ->
# MovielensLatest_x1, Criteo -> Criteo_x1. ``patience`` in the BARS logs is
# ``early_stop_patience``; every run monitors validation AUC and runs up to 100 epochs.
# https://github.com/reczoo/BARS/tree/main/ranking/ctr/DCNv2/DCNv2_movielenslatest_x1
# https://github.com/reczoo/BARS/tree/main/ranking/ctr/DCNv2/DCNv2_criteo_x1
# https://github.com/reczoo/BARS/tree/main/ranking/ctr/DeepFM/DeepFM_movielenslatest_x1
# https://github.com/reczoo/BARS/tree/main/ranking/ctr/DeepFM/DeepFM_criteo_x1
_BARS_COMMON = {
    "learning_rate": 1e-3,
    "embedding_dim": 10,
    "net_regularizer": 0.0,
    "monitor": "AUC",
    "monitor_mode": "max",
    "early_stop_patience": 2,
}
BARS: dict[str, dict[str, dict[str, Any]]] = {
    "movielens": {
        "DCNv2": {
            **_BARS_COMMON,
            "model_structure": "parallel",
            "num_cross_layers": 5,
            "parallel_dnn_hidden_units": [400, 400, 400],
            "stacked_dnn_hidden_units": [500, 500, 500],
            "dnn_activations": "relu",
            "net_dropout": 0.2,
            "batch_norm": True,
            "embedding_regularizer": 0.01,
        },
        "DeepFM": {
            **_BARS_COMMON,
            "hidden_units": [400, 400, 400],
            "hidden_activations": "relu",
            "net_dropout": 0.3,
            "batch_norm": True,
            "embedding_regularizer": 0.01,
        },
    },
    "criteo": {
        "DCNv2": {
            **_BARS_COMMON,
            "model_structure": "parallel",
            "num_cross_layers": 3,
            "parallel_dnn_hidden_units": [500, 500, 500],
            "stacked_dnn_hidden_units": [400, 400, 400],
            "dnn_activations": "relu",
            "net_dropout": 0.1,
            "batch_norm": False,
            "embedding_regularizer": 1e-5,
        },
        "DeepFM": {
            **_BARS_COMMON,
            "hidden_units": [400, 400, 400],
            "hidden_activations": "relu",
            "net_dropout": 0.1,
            "batch_norm": True,
            "embedding_regularizer": 1e-5,
        },
    },
}
BARS_BATCH_SIZE = 4096
BARS_EPOCHS = 100


@dataclass
class Settings:
    """How much a run does (the full bench, or the quick development run)."""

    seeds: tuple[int, ...] = SEEDS
    tuning_budget_s: float = TUNING_BUDGET_S
    platform_epochs: int = 30
    peer_epochs: int = BARS_EPOCHS
    lgbm_rounds: int = 5000
    # Enough for the 200-row sample (trials of a second each would otherwise fit the 20
    # validation rows); MovieLens' trials take about a minute, so its budget binds first.
    max_trials: int = 40
    # The final models of the templates with a ``members`` param average this many networks
    # (seed, seed + 1, ...); the tuning trials train one each, so the budget buys more trials.
    members: int = FINAL_MEMBERS
    # How the final models are made (``final_params``): "cv" or "members".
    final: str = "cv"
    threads: int = THREADS
    datasets: tuple[str, ...] = DATASETS
    genres: str = "flags"  # "flags": 19 int features; "list": one categorical_list feature

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        settings = cls()
        if env.get("RANKOPS_BENCH_QUALITY_QUICK", "") not in ("", "0"):
            settings = cls(
                seeds=(0,), tuning_budget_s=60.0, platform_epochs=3, peer_epochs=3, members=2
            )
        names = [n.strip() for n in env.get("RANKOPS_BENCH_QUALITY_DATASETS", "").split(",")]
        names = [n for n in names if n]
        unknown = sorted(set(names) - set(DATASETS))
        if unknown:
            raise BenchError(f"unknown quality datasets {unknown}; known: {', '.join(DATASETS)}")
        if names:
            settings.datasets = tuple(n for n in DATASETS if n in names)
        genres = env.get("RANKOPS_BENCH_QUALITY_GENRES", "flags")
        if genres not in ("flags", "list"):
            raise BenchError("RANKOPS_BENCH_QUALITY_GENRES must be 'flags' or 'list'")
        settings.genres = genres
        final = env.get("RANKOPS_BENCH_QUALITY_FINAL", "cv")
        if final not in ("cv", "members"):
            raise BenchError("RANKOPS_BENCH_QUALITY_FINAL must be 'cv' or 'members'")
        settings.final = final
        return settings


# --- metrics ------------------------------------------------------------------------------------


def ece(label: Sequence[float], prob: Sequence[float], bins: int = ECE_BINS) -> float:
    """Expected calibration error over ``bins`` equal-width probability bins: the sum over bins
    of |clicks in the bin - predicted clicks in the bin|, divided by the number of rows."""
    y = np.asarray(label, dtype=np.float64)
    p = np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    if not len(y):
        raise ValueError("ECE of no rows")
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    gap = np.abs(
        np.bincount(which, weights=y, minlength=bins)
        - np.bincount(which, weights=p, minlength=bins)
    )
    return float(gap.sum() / len(y))


def score(label: Sequence[float], prob: Sequence[float]) -> dict[str, float]:
    """AUC, log loss and ECE of click probabilities: the one metric code every model gets."""
    from sklearn.metrics import log_loss, roc_auc_score

    y = np.asarray(label, dtype=np.float64)
    p = np.clip(np.asarray(prob, dtype=np.float64), EPS, 1 - EPS)
    if len(y) != len(p):
        raise ValueError(f"{len(p)} predictions for {len(y)} rows")
    return {
        "auc": float(roc_auc_score(y, p)),
        "logloss": float(log_loss(y, p, labels=[0, 1])),
        "ece": ece(y, p),
    }


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def summarise(
    dataset: str, results: Mapping[str, Mapping[str, float]], peers: Sequence[str] = PEERS
) -> dict[str, float]:
    """The two summary measures of a dataset from its per-model mean metrics.

    ``results[model]`` holds ``auc`` and ``logloss``; ``platform_best`` is the platform's chosen
    template. The best peer is taken per metric (highest AUC, lowest log loss)."""
    present = [p for p in peers if p in results]
    if "platform_best" not in results or not present:
        raise ValueError(f"{dataset}: need platform_best and at least one peer")
    best_auc = max(results[p]["auc"] for p in present)
    best_logloss = min(results[p]["logloss"] for p in present)
    return {
        f"auc_best_platform_minus_best_peer_{dataset}": results["platform_best"]["auc"] - best_auc,
        f"logloss_best_platform_minus_best_peer_{dataset}": results["platform_best"]["logloss"]
        - best_logloss,
    }


def best_and_top_summaries(
    dataset: str, results: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """``summarise`` for ``platform_best`` (``*_best_platform_minus_best_peer_*``) and for
    ``platform_top`` (``*_top_platform_minus_best_peer_*``)."""
    top = summarise(dataset, {**results, "platform_best": results["platform_top"]})
    return {
        **summarise(dataset, results),
        **{k.replace("best_platform", "top_platform"): v for k, v in top.items()},
    }


# --- datasets and the shared split --------------------------------------------------------------


@dataclass
class Dataset:
    """One dataset's rows in a fixed order, with the shared split in ``frame["split"]``.

    ``categorical`` / ``numeric`` are raw columns of ``frame``; ``groups`` maps each raw column to
    the platform's ``(group, feature)``; ``bucketed`` are the numeric columns FuxiCTR buckets the
    way its Criteo recipe does (the other numerics are categories for it, as in its MovieLens
    configs)."""

    name: str
    frame: Any  # pandas.DataFrame
    categorical: list[str]
    numeric: list[str]
    groups: dict[str, tuple[str, str]]
    entity: dict[str, str] = field(default_factory=dict)
    bucketed: list[str] = field(default_factory=list)

    def rows(self, split: str):
        return self.frame.loc[self.frame["split"] == split]

    def labels(self, split: str) -> np.ndarray:
        return self.rows(split)[LABEL].to_numpy(dtype=np.float64)


def time_ordered_split(n: int, fractions: Sequence[float] = SPLIT_FRACTIONS) -> np.ndarray:
    """train | validation | test over rows already in time order."""
    n_train = math.floor(n * fractions[0])
    n_val = math.floor(n * fractions[1])
    out = np.empty(n, dtype=object)
    out[:n_train] = "train"
    out[n_train : n_train + n_val] = "validation"
    out[n_train + n_val :] = "test"
    return out


def stratified_split(
    labels: Sequence[float], seed: int = SPLIT_SEED, fractions: Sequence[float] = SPLIT_FRACTIONS
) -> np.ndarray:
    """A seeded random train/validation/test assignment, the fractions kept within each class."""
    y = np.asarray(labels) > 0.5
    rng = np.random.default_rng(seed)
    out = np.empty(len(y), dtype=object)
    for cls in (False, True):
        index = np.flatnonzero(y == cls)
        rng.shuffle(index)
        n_train = round(len(index) * fractions[0])
        n_val = round(len(index) * fractions[1])
        out[index[:n_train]] = "train"
        out[index[n_train : n_train + n_val]] = "validation"
        out[index[n_train + n_val :]] = "test"
    return out


def split_digest(split: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(map(str, split)).encode()).hexdigest()[:16]


def load_movielens(directory: Path = MOVIELENS_DIR) -> Dataset:
    import pandas as pd

    users = pd.read_csv(
        directory / "u.user", sep="|", header=None, names=["user_id", "age", "gender", "occ", "z"]
    )
    items = pd.read_csv(directory / "u.item", sep="|", header=None, encoding="latin-1")
    items = items.rename(columns={0: "item_id", 2: "release"})
    genre_cols = [f"genre_{g}" for g in GENRES]
    items = items.rename(columns={5 + i: c for i, c in enumerate(genre_cols)})
    items["year"] = pd.to_datetime(items["release"], format="%d-%b-%Y", errors="coerce").dt.year
    ratings = pd.read_csv(
        directory / "u.data", sep="\t", header=None, names=["user_id", "item_id", "rating", "ts"]
    )
    ratings = ratings.sort_values("ts", kind="stable").reset_index(drop=True)
    frame = ratings.merge(users, on="user_id", how="left").merge(
        items[["item_id", "year", *genre_cols]], on="item_id", how="left"
    )
    frame = pd.DataFrame(
        {
            "user_id": frame["user_id"].astype(str),
            "item_id": frame["item_id"].astype(str),
            "gender": frame["gender"].astype(str),
            "occupation": frame["occ"].astype(str),
            "age": frame["age"].astype("float64"),
            "year": frame["year"].astype("float64"),
            **{c: frame[c].astype("int64") for c in genre_cols},
            LABEL: (frame["rating"] >= 4).astype("int64"),
            "event_time": pd.to_datetime(frame["ts"], unit="s", utc=True),
        }
    )
    if MOVIELENS_SPLIT == "random":  # a variant: most test users are seen in training
        frame["split"] = stratified_split(frame[LABEL].to_numpy(), seed=CRITEO_SPLIT_SEED)
    else:
        frame["split"] = time_ordered_split(len(frame))
    groups = {
        "user_id": ("ml_user", "id"),
        "age": ("ml_user", "age"),
        "gender": ("ml_user", "gender"),
        "occupation": ("ml_user", "occupation"),
        "item_id": ("ml_item", "id"),
        "year": ("ml_item", "year"),
        **{c: ("ml_item", f"is_{c.removeprefix('genre_')}") for c in genre_cols},
    }
    entity = {c: ("user" if g == "ml_user" else "item") for c, (g, _) in groups.items()}
    return Dataset(
        name="movielens",
        frame=frame,
        categorical=["user_id", "item_id", "gender", "occupation"],
        numeric=["age", "year", *genre_cols],
        groups=groups,
        entity=entity,
    )


def load_criteo(path: Path = CRITEO_FILE, seed: int | None = None) -> Dataset:
    import pandas as pd

    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    numeric = [f"I{i}" for i in range(1, 14)]
    categorical = [f"C{i}" for i in range(1, 27)]
    missing = [c for c in [LABEL, *numeric, *categorical] if c not in raw.columns]
    if missing:
        raise BenchError(f"{path}: no columns {missing} (a CSV with a header is expected)")
    frame = pd.DataFrame(
        {
            **{c: pd.to_numeric(raw[c].replace("", None), errors="coerce") for c in numeric},
            **{c: raw[c].where(raw[c] != "", None) for c in categorical},
            LABEL: raw[LABEL].astype("int64"),
            # No time in the sample: the file order stands in for it (the split ignores it).
            "event_time": pd.Timestamp("2026-01-01", tz="UTC")
            + pd.to_timedelta(np.arange(len(raw)), unit="s"),
        }
    )
    frame["split"] = stratified_split(
        frame[LABEL].to_numpy(), seed=CRITEO_SPLIT_SEED if seed is None else seed
    )
    groups = {c: ("criteo", c.lower()) for c in [*numeric, *categorical]}
    return Dataset(
        name="criteo",
        frame=frame,
        categorical=categorical,
        numeric=numeric,
        groups=groups,
        entity=dict.fromkeys(groups, "context"),
        bucketed=numeric,
    )


LOADERS: dict[str, Callable[[], Dataset]] = {"movielens": load_movielens, "criteo": load_criteo}
# Datasets whose split is drawn at random, by the seed they take (``outer_split_seeds``).
SEEDED_LOADERS: dict[str, Callable[[int], Dataset]] = {
    "criteo": lambda seed: load_criteo(seed=seed)
}


def shared_split(name: str, seed: int | None = None) -> Dataset:
    """The dataset with its split (the same rows every call: time order, or a fixed seed);
    ``seed`` draws another random split of a dataset in ``SEEDED_LOADERS``."""
    return LOADERS[name]() if seed is None else SEEDED_LOADERS[name](seed)


def outer_split_seeds(dataset: Dataset) -> list[int | None]:
    """The splits a dataset is measured on: its one split, or for small data drawn at random
    (fewer than ``CV_BELOW_VALIDATION_ROWS`` validation rows: the Criteo sample's 40 test rows
    give a log-loss standard error of about 0.08, wider than the differences between the
    models) ``OUTER_SPLITS`` splits, the shared one first and then the next seeds, every model
    measured on each. None stands for the dataset's own split."""
    small = len(dataset.labels("validation")) < CV_BELOW_VALIDATION_ROWS
    if not small or dataset.name not in SEEDED_LOADERS or OUTER_SPLITS < 2:
        return [None]
    return [None, *(CRITEO_SPLIT_SEED + k for k in range(1, OUTER_SPLITS))]


def combine_splits(name: str, founds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One dataset's measures over its outer splits: each model's metric the mean over the
    splits of its per-split means (each over the seeds); ``_sd`` the standard deviation of those
    per-split means (the spread that matters on small data) and ``_seed_sd`` the mean of the
    per-split seed deviations; ``tuning_s`` summed; the summaries recomputed from the means
    (the best peer is the best peer over the splits, as on one split)."""
    keys = [
        k for k in founds[0]
        if not k.endswith("_sd") and "_minus_best_peer_" not in k and not k.startswith("tuning_s")
    ]  # fmt: skip
    out: dict[str, float] = {}
    for key in keys:
        values = [found[key] for found in founds]
        out[key], out[f"{key}_sd"] = mean_sd(values)
        out[f"{key}_seed_sd"] = float(np.mean([found[f"{key}_sd"] for found in founds]))
    suffix = f"_{name}"
    means: dict[str, dict[str, float]] = {}
    for key, value in out.items():
        metric, _, rest = key.partition("_")
        if rest.endswith(suffix) and metric in ("auc", "logloss"):
            means.setdefault(rest.removesuffix(suffix), {})[metric] = value
    out.update(best_and_top_summaries(name, means))
    return out


def write_shared(dataset: Dataset, directory: Path) -> Path:
    """The rows, raw, with their split: the one file the peers read."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{dataset.name}.parquet"
    dataset.frame.to_parquet(path, index=False)
    return path


# --- the platform -------------------------------------------------------------------------------


def platform_features(dataset: Dataset, genres: str = "flags") -> list[dict[str, Any]]:
    features = []
    genre_cols = [c for c in dataset.numeric if c.startswith("genre_")]
    for column, (group, name) in dataset.groups.items():
        if genres == "list" and column in genre_cols:
            continue
        if column in dataset.categorical:
            dtype = "categorical"
        elif dataset.frame[column].dtype.kind in "iub":
            dtype = "int"
        else:
            dtype = "float"
        features.append(
            {
                "ref": f"{group}:{name}",
                "column": f"{group}__{name}",
                "dtype": dtype,
                "entity": dataset.entity.get(column, ""),
            }
        )
    if genres == "list" and genre_cols:
        features.append(
            {
                "ref": "ml_item:genres",
                "column": "ml_item__genres",
                "dtype": "categorical_list",
                "entity": "item",
            }
        )
    return features


def platform_table(dataset: Dataset, genres: str = "flags"):
    """The dataset as the training child reads it: ``<group>__<feature>`` columns, the label,
    ``event_time`` and the split column."""
    import pyarrow as pa

    frame = dataset.frame
    columns: dict[str, Any] = {}
    genre_cols = [c for c in dataset.numeric if c.startswith("genre_")]
    for column, (group, name) in dataset.groups.items():
        if genres == "list" and column in genre_cols:
            continue
        values = frame[column]
        if column in dataset.categorical:
            columns[f"{group}__{name}"] = pa.array(
                [None if v is None or v != v else str(v) for v in values], pa.string()
            )
        elif values.dtype.kind in "iub":
            columns[f"{group}__{name}"] = pa.array(values.to_numpy(), pa.int64())
        else:
            columns[f"{group}__{name}"] = pa.array(
                values.to_numpy(), pa.float64(), from_pandas=True
            )
    if genres == "list" and genre_cols:
        flags = frame[genre_cols].to_numpy()
        columns["ml_item__genres"] = pa.array(
            [[GENRES[j] for j in np.flatnonzero(row)] for row in flags], pa.list_(pa.string())
        )
    columns["event_time"] = pa.Array.from_pandas(frame["event_time"]).cast(
        pa.timestamp("us", "UTC")
    )
    columns[PLATFORM_LABEL] = pa.array(frame[LABEL].to_numpy(), pa.int64())
    columns["split"] = pa.array(frame["split"].astype(str).to_numpy(), pa.string())
    return pa.table(columns)


def cv_folds_for(dataset: Dataset) -> int:
    """``CV_FOLDS`` for a dataset with fewer than ``CV_BELOW_VALIDATION_ROWS`` validation rows,
    else 0 (one train / validation split)."""
    return CV_FOLDS if len(dataset.rows("validation")) < CV_BELOW_VALIDATION_ROWS else 0


def platform_base_params(dataset: Dataset, settings: Settings) -> dict[str, Any]:
    """The params every platform job of the bench gets (the tuner varies the rest)."""
    folds = cv_folds_for(dataset)
    return {
        **({"cv_folds": folds} if folds else {}),
        "split_column": "split",
        "epochs": settings.platform_epochs,
        # A few hundred rows (Criteo's sample) need small batches to take enough steps.
        "batch_size": 512 if len(dataset.frame) > 10_000 else 16,
        "early_stopping_patience": 2,
        "seed": 0,
        "threads": settings.threads,
        "importance": False,
        "epoch_eval": False,
        "checkpoint_every_steps": 100_000,
        "checkpoint_every_s": 3600.0,
    }


def job_spec(path: Path, dataset: Dataset, template: str, work: Path, params: Mapping, genres):
    from training.data import JobSpec

    return JobSpec(
        job_id=0,
        template=template,
        dataset_path=str(path),
        features=platform_features(dataset, genres),
        work_dir=str(work),
        label=PLATFORM_LABEL,
        params=dict(params),
    )


def train_platform(spec) -> str:
    """Run the training child in-process; the model directory it wrote."""
    from training import runner

    events: list[dict] = []
    try:
        code = runner.train(spec, emit=runner.Emitter(sink=events.append))
    except Exception as exc:  # as the child would report it: the job failed
        raise BenchError(f"platform {spec.template} failed: {type(exc).__name__}: {exc}") from exc
    if code != 0:
        tail = [e for e in events if e["type"] in ("error", "log")][-3:]
        raise BenchError(f"platform {spec.template} exited with {code}: {tail}")
    return str(spec.model_dir)


def bundle_predict(model_dir: str, table, positions: np.ndarray) -> np.ndarray:
    """Click probabilities of the bundle for the given rows of the platform table."""
    from training.bundle import load_bundle

    bundle = load_bundle(model_dir)
    part = table.take(positions)
    columns = {name: part.column(name) for name in part.column_names}
    return bundle.predict(columns, part.num_rows)


def available_templates() -> list[str]:
    import training.templates  # noqa: F401  (registers the built-in templates)
    from training.bundle import TEMPLATES as REGISTERED

    return [t for t in TEMPLATES if t in REGISTERED]


def tuner_module():
    if importlib.util.find_spec("training.tuner") is None:
        return None
    import training.tuner as tuner

    return tuner if hasattr(tuner, "optimise") else None


def tune_templates(ctx, dataset, path, templates, settings) -> tuple[dict[str, dict], float, dict]:
    """Best params per template within the dataset's tuning budget (all templates together),
    or the template defaults without the tuner. Returns (params, seconds, notes); a template's
    notes carry the best trial's model folder (``model_dir``: trained with seed 0, so it is the
    seed-0 run of the final evaluation)."""
    base = platform_base_params(dataset, settings)
    tuner = tuner_module()
    if tuner is None:
        ctx.log(f"{dataset.name}: no training.tuner - the templates run their defaults")
        return {t: dict(base) for t in templates}, 0.0, {"tuner": "absent"}
    chosen: dict[str, dict] = {}
    notes: dict[str, Any] = {"tuner": "training.tuner.optimise", "templates": {}}
    started = time.perf_counter()
    for index, template in enumerate(templates):
        left = settings.tuning_budget_s - (time.perf_counter() - started)
        # No trial starts after the timeout, but the last one may run past it: keep a margin so
        # the dataset's total stays within the budget.
        share = TUNING_SHARE * left / (len(templates) - index)
        if share < 5:
            chosen[template] = dict(base)
            notes["templates"][template] = {"skipped": "no budget left"}
            continue
        spec = job_spec(
            path, dataset, template, ctx.workdir / f"tune-{dataset.name}-{template}", base,
            settings.genres,
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            result = tuner.optimise(
                spec,
                n_trials=settings.max_trials,
                timeout_s=share,
                metric="logloss",
                seed=0,
                work_root=str(ctx.workdir / f"trials-{dataset.name}-{template}"),
                threads=settings.threads,
            )
        except Exception as exc:  # noqa: BLE001 - a trial raised; the final runs say it again
            chosen[template] = dict(base)
            notes["templates"][template] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
            ctx.log(f"{dataset.name}/{template}: tuning failed: {type(exc).__name__}: {exc}")
            continue
        best = tuner.derived_params(template, result.best_params)
        chosen[template] = {**base, **best}
        states: dict[str, int] = {}
        for trial in result.trials:
            states[trial.state] = states.get(trial.state, 0) + 1
        notes["templates"][template] = {
            "best_params": best,
            "best_validation_logloss": result.best_value,
            "trials": states,
            "seconds": round(time.perf_counter() - t0, 1),
            "model_dir": result.best_model_dir,
        }
        ctx.log(
            f"{dataset.name}/{template}: {states} trials in {time.perf_counter() - t0:.0f}s, "
            f"best validation log loss {result.best_value} with {best}"
        )
    return chosen, time.perf_counter() - started, notes


def final_params(template: str, tuned: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The params of ``template``'s final models: the tuned ones, and then by
    ``settings.final``: ``"cv"`` cross-fits them (``cv_folds`` = ``CV_FOLDS`` over the train
    and validation rows pooled, fold i's model neither trained nor stopped on fold i, the
    calibration fitted out of fold, the model the folds' average); ``"members"`` averages
    ``settings.members`` networks trained on the train rows (templates with ``members``)."""
    from training.bundle import TEMPLATE_PARAMS

    available_templates()
    schema = TEMPLATE_PARAMS.get(template, {})
    if settings.final == "cv" and "cv_folds" in schema:
        return {**tuned, "cv_folds": CV_FOLDS}
    if int(tuned.get("cv_folds") or 0) < 2 and "members" in schema and settings.members > 1:
        return {**tuned, "members": settings.members}
    return dict(tuned)


def out_of_fold(model_dir: str, dataset: Dataset) -> dict[str, np.ndarray] | None:
    """A cross-fitted run's out-of-fold rows (``training.runner.OUT_OF_FOLD_FILE`` beside its
    model): positions, labels, and probabilities through the bundle's own calibration (as
    its validation and test predictions are); None for a run that was not cross-fitted."""
    from training.bundle import apply_calibration, load_bundle
    from training.runner import OUT_OF_FOLD_FILE

    path = Path(model_dir).parent / OUT_OF_FOLD_FILE
    if not path.exists():
        return None
    saved = np.load(path)
    calibration = load_bundle(model_dir).spec.extra.get("calibration")
    positions = np.asarray(saved["positions"])
    label = np.asarray(saved["label"], dtype=np.float64)
    if not np.array_equal(label, dataset.frame[LABEL].to_numpy(dtype=np.float64)[positions]):
        raise BenchError(f"{path}: its rows are not the dataset's (labels differ)")
    return {
        "positions": positions,
        "label": label,
        "prob": apply_calibration(np.asarray(saved["logit"]), calibration),
    }


def run_platform(ctx, dataset, settings) -> tuple[dict[str, dict], float, dict]:
    """Per template and seed: validation and test predictions of the (tuned) template."""
    import pyarrow.parquet as pq

    table = platform_table(dataset, settings.genres)
    path = ctx.workdir / f"platform-{dataset.name}.parquet"
    pq.write_table(table, path)
    positions = {s: np.flatnonzero(dataset.frame["split"].to_numpy() == s) for s in SPLITS}
    templates = available_templates()
    params, tuning_s, notes = tune_templates(ctx, dataset, path, templates, settings)
    out: dict[str, dict] = {}
    for template in templates:
        runs = []
        trial_params = params[template]
        params[template] = final_params(template, trial_params, settings)
        try:
            for seed in settings.seeds:
                work = ctx.workdir / f"final-{dataset.name}-{template}-{seed}"
                spec = job_spec(
                    path, dataset, template, work, {**params[template], "seed": seed},
                    settings.genres,
                )  # fmt: skip
                t0 = time.perf_counter()
                tuned = notes.get("templates", {}).get(template, {}).get("model_dir", "")
                # seed 0: the best trial's own model where the final params are the trial's
                # (seed 0, the same rows); else (cross-fitted or several members) trained anew
                reuse = seed == 0 and tuned and params[template] == trial_params
                model_dir = tuned if reuse else train_platform(spec)
                run = {
                    "validation": bundle_predict(model_dir, table, positions["validation"]),
                    "test": bundle_predict(model_dir, table, positions["test"]),
                    "fit_s": time.perf_counter() - t0,
                }
                oof = out_of_fold(model_dir, dataset)
                if oof is not None:
                    run["out_of_fold"] = oof
                runs.append(run)
        except BenchError as exc:
            # A template that cannot train these features is left out, and said so; the others
            # still count (the best is chosen among the ones that ran).
            notes.setdefault("failed", {})[template] = str(exc)[:500]
            ctx.log(f"{dataset.name}/platform_{template}: FAILED, left out: {str(exc)[:300]}")
            continue
        out[f"platform_{template}"] = {"runs": runs, "params": params[template]}
        ctx.log(f"{dataset.name}/platform_{template}: {len(runs)} seeds")
    if not out:
        raise BenchError(f"{dataset.name}: no platform template trained: {notes.get('failed')}")
    return out, tuning_s, notes


# --- peers --------------------------------------------------------------------------------------


def run_lr(dataset: Dataset, settings: Settings) -> dict:
    """One-hot categoricals + standardised numerics, C chosen on validation log loss."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    def fit(c: float):
        features = ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()),
                 dataset.numeric),
                ("cat", make_pipeline(
                    SimpleImputer(strategy="constant", fill_value="__missing__"),
                    OneHotEncoder(handle_unknown="ignore"),
                ), dataset.categorical),
            ]
        )  # fmt: skip
        model = Pipeline([("x", features), ("lr", LogisticRegression(C=c, max_iter=2000))])
        train = dataset.rows("train")
        model.fit(_sk_frame(train, dataset), train[LABEL].to_numpy())
        return model

    val = dataset.rows("validation")
    best = None
    for c in LR_C_GRID:
        model = fit(c)
        loss = score(val[LABEL], model.predict_proba(_sk_frame(val, dataset))[:, 1])["logloss"]
        if best is None or loss < best[0]:
            best = (loss, c, model)
    _, c, model = best
    preds = {
        s: model.predict_proba(_sk_frame(dataset.rows(s), dataset))[:, 1]
        for s in ("validation", "test")
    }
    # Deterministic (lbfgs): every seed gives the same model.
    return {"runs": [dict(preds) for _ in settings.seeds], "params": {"C": c}}


def _sk_frame(rows, dataset: Dataset):
    frame = rows[dataset.numeric + dataset.categorical].copy()
    for c in dataset.categorical:
        frame[c] = frame[c].astype(object).where(frame[c].notna(), None)
    return frame


def _lgb_frame(rows, dataset: Dataset, categories: Mapping[str, Any]):
    import pandas as pd

    frame = rows[dataset.numeric + dataset.categorical].copy()
    for c in dataset.categorical:
        frame[c] = pd.Categorical(frame[c], categories=categories[c])
    return frame


def run_lightgbm(dataset: Dataset, settings: Settings) -> dict:
    import lightgbm as lgb

    train = dataset.rows("train")
    categories = {c: sorted(train[c].dropna().unique().tolist()) for c in dataset.categorical}
    x = {s: _lgb_frame(dataset.rows(s), dataset, categories) for s in SPLITS}
    y = {s: dataset.labels(s) for s in SPLITS}
    runs = []
    for seed in settings.seeds:
        model = lgb.LGBMClassifier(
            n_estimators=settings.lgbm_rounds,
            learning_rate=0.05,
            num_leaves=31,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
            random_state=seed,
            n_jobs=settings.threads,
            verbose=-1,
        )
        t0 = time.perf_counter()
        model.fit(
            x["train"],
            y["train"],
            eval_X=(x["validation"],),
            eval_y=(y["validation"],),
            eval_metric="binary_logloss",
            callbacks=[lgb.early_stopping(50, verbose=False)],
        )
        runs.append(
            {
                "validation": model.predict_proba(x["validation"])[:, 1],
                "test": model.predict_proba(x["test"])[:, 1],
                "fit_s": time.perf_counter() - t0,
                "best_iteration": int(model.best_iteration_ or settings.lgbm_rounds),
            }
        )
    return {"runs": runs, "params": {"learning_rate": 0.05, "num_leaves": 31, "stopping": 50}}


def fuxictr_requirements() -> list[str]:
    lines = (PEER_DIR / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def fuxictr_config(dataset: Dataset, data_path: Path, model: str, out: Path, settings) -> dict:
    categorical = list(dataset.categorical)
    # MovieLens' numerics (age, year, genre flags) are categories to FuxiCTR, as in its own
    # MovieLens configs; Criteo's counts are bucketed by the package's Criteo recipe.
    categorical += [c for c in dataset.numeric if c not in dataset.bucketed]
    return {
        "data": str(data_path),
        "dataset_id": f"{dataset.name}_bench",
        "label": LABEL,
        "categorical": categorical,
        "bucketed": list(dataset.bucketed),
        "model": model,
        "params": BARS[dataset.name][model],
        "batch_size": BARS_BATCH_SIZE,
        "epochs": settings.peer_epochs,
        "seeds": list(settings.seeds),
        "threads": settings.threads,
        "out": str(out),
    }


def run_fuxictr(ctx, dataset: Dataset, data_path: Path, settings: Settings) -> dict[str, dict]:
    python = peer_venv("fuxictr", fuxictr_requirements())
    out: dict[str, dict] = {}
    for model in ("DCNv2", "DeepFM"):
        folder = ctx.workdir / f"fuxictr-{dataset.name}-{model}"
        config = fuxictr_config(dataset, data_path, model, folder, settings)
        config_path = ctx.workdir / f"fuxictr-{dataset.name}-{model}.json"
        config_path.write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PYTHONPATH"))}
        env.update(OMP_NUM_THREADS=str(settings.threads), CUDA_VISIBLE_DEVICES="")
        t0 = time.perf_counter()
        done = subprocess.run(
            [str(python), str(PEER_DIR / "driver.py"), str(config_path)],
            cwd=str(ctx.workdir),
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if done.returncode != 0:
            raise BenchError(f"FuxiCTR {model} on {dataset.name} failed:\n{done.stderr[-3000:]}")
        report = json.loads((folder / f"{model}.json").read_text())
        runs = []
        for run in report["runs"]:
            seed = run["seed"]
            runs.append(
                {
                    "validation": np.load(folder / f"{model}_seed{seed}_validation.npy"),
                    "test": np.load(folder / f"{model}_seed{seed}_test.npy"),
                    "fit_s": run["fit_s"],
                    "epochs": run["epochs"],
                }
            )
        out[f"fuxictr_{model.lower()}"] = {"runs": runs, "params": config["params"]}
        ctx.log(
            f"{dataset.name}/fuxictr_{model.lower()}: {time.perf_counter() - t0:.0f}s, "
            f"epochs {[r['epochs'] for r in runs]}"
        )
    return out


# --- the run ------------------------------------------------------------------------------------


def dataset_measures(dataset: Dataset, models: Mapping[str, Mapping]) -> tuple[dict, dict]:
    """Means and spreads over the seeds of every model's test metrics, the platform's best
    template (by mean validation log loss), and the summary. Returns (measures, details)."""
    name = dataset.name
    y_val, y_test = dataset.labels("validation"), dataset.labels("test")
    means: dict[str, dict[str, float]] = {}
    measures: dict[str, float] = {}
    details: dict[str, Any] = {}
    for model, result in models.items():
        tests = [score(y_test, run["test"]) for run in result["runs"]]
        vals = [score(y_val, run["validation"]) for run in result["runs"]]
        means[model] = {}
        for metric in ("auc", "logloss", "ece"):
            mean, sd = mean_sd([t[metric] for t in tests])
            means[model][metric] = mean
            measures[f"{metric}_{model}_{name}"] = mean
            measures[f"{metric}_{model}_{name}_sd"] = sd
        means[model]["validation_logloss"] = mean_sd([v["logloss"] for v in vals])[0]
        details[model] = {
            "params": result.get("params"),
            "validation_logloss": means[model]["validation_logloss"],
            "validation_auc": mean_sd([v["auc"] for v in vals])[0],
            "test_per_seed": tests,
            **{
                k: [run[k] for run in result["runs"]]
                for k in ("fit_s", "epochs", "best_iteration")
                if all(k in run for run in result["runs"])
            },
        }
    for model, result in models.items():
        if model.startswith("platform_"):
            # The ensemble's own cross-fitted value where it has one (its weights were fitted
            # on these rows too, not only a temperature).
            honest = [
                run["crossfit_logloss"]
                if run.get("crossfit_logloss") is not None
                else crossfit_validation_logloss(*selection_rows(run, y_val))
                for run in result["runs"]
            ]
            means[model]["validation_crossfit_logloss"] = mean_sd(honest)[0]
            details[model]["validation_crossfit_logloss"] = means[model][
                "validation_crossfit_logloss"
            ]
    # The choice reads the cross-fitted validation log loss: calibration (and the ensemble's
    # weights) never scored the rows it was fitted on.
    templates = [m for m in models if m.startswith("platform_") and m != ENSEMBLE]
    candidates = {"platform_best": templates, "platform_top": [*templates, ENSEMBLE]}
    for label, among in candidates.items():
        among = [m for m in among if m in models]
        if label == "platform_best":
            best = choose_template(y_val, {m: models[m] for m in among})
        else:
            best = min(among, key=lambda m: means[m]["validation_crossfit_logloss"])
        means[label] = means[best]
        for metric in ("auc", "logloss", "ece"):
            measures[f"{metric}_{label}_{name}"] = measures[f"{metric}_{best}_{name}"]
            measures[f"{metric}_{label}_{name}_sd"] = measures[f"{metric}_{best}_{name}_sd"]
        details[label] = best.removeprefix("platform_")
    measures.update(best_and_top_summaries(name, means))
    return measures, details


# The templates from the simplest (a convex linear fit) to the most flexible, for the
# one-standard-error rule of ``choose_template``.
SIMPLEST_FIRST = tuple(f"platform_{t}" for t in ("logreg", "lightgbm", "fine_ranking", "deepfm"))


def selection_rows(run: Mapping[str, Any], y_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities) a run is judged on: its out-of-fold rows where it was
    cross-fitted (its predictions on the validation rows are then of a model that trained on
    them), else the validation rows."""
    oof = run.get("out_of_fold")
    return (oof["label"], oof["prob"]) if oof is not None else (y_val, run["validation"])


def choose_template(y_val: np.ndarray, models: Mapping[str, Mapping]) -> str:
    """``platform_best``: the simplest template whose cross-fitted log loss (per row, averaged
    over the seeds) is within one standard error of the lowest
    (``training.evaluation.simplest_within_one_se``), on the rows every candidate scored
    without training on them: the out-of-fold rows (train and validation, pooled) where all
    were cross-fitted, else the validation rows. Never the test rows."""
    from training.ensemble import logit
    from training.evaluation import crossfit_probabilities, row_logloss, simplest_within_one_se

    runs = [run for result in models.values() for run in result["runs"]]
    pooled = all(run.get("out_of_fold") is not None for run in runs)
    losses = {}
    for name, result in models.items():
        rows = []
        for run in result["runs"]:
            label, given = selection_rows(run, y_val) if pooled else (y_val, run["validation"])
            prob = crossfit_probabilities("temperature", label, logit(given))
            rows.append(row_logloss(label, given if prob is None else prob))
        losses[name] = np.mean(rows, axis=0)
    return simplest_within_one_se(losses, SIMPLEST_FIRST)


def crossfit_validation_logloss(label: np.ndarray, prob: np.ndarray) -> float:
    """The validation log loss of calibrated probabilities with the temperature cross-fitted
    (``training.evaluation.crossfit_logloss`` on their logits; a temperature refitted on
    calibrated logits composes with the first one); the in-sample value when folds cannot be
    fitted."""
    from training.ensemble import logit
    from training.evaluation import crossfit_logloss

    value = crossfit_logloss("temperature", label, logit(prob))
    return float(value) if value is not None else score(label, prob)["logloss"]


def platform_ensemble(models: Mapping[str, Mapping], y_val: np.ndarray) -> dict | None:
    """Per seed, ``training.ensemble.fit_blend`` of that seed's platform templates on their
    validation probabilities (their out-of-fold ones where all were cross-fitted), applied to
    their test probabilities; None with fewer than two."""
    from training.ensemble import fit_blend

    members = [m for m in models if m.startswith("platform_") and m != ENSEMBLE]
    if len(members) < 2:
        return None
    runs, blends = [], []
    for i in range(len(models[members[0]]["runs"])):
        seed_runs = {m: models[m]["runs"][i] for m in members}
        pooled = all(run.get("out_of_fold") is not None for run in seed_runs.values())
        chosen = {m: selection_rows(run, y_val) for m, run in seed_runs.items()}
        label = next(iter(chosen.values()))[0] if pooled else y_val
        fit_on = {m: rows[1] for m, rows in chosen.items()} if pooled else {
            m: run["validation"] for m, run in seed_runs.items()
        }  # fmt: skip
        blend = fit_blend(label, fit_on)
        blends.append(blend.to_json())
        val = {m: run["validation"] for m, run in seed_runs.items()}
        runs.append(
            {
                "validation": blend.predict(val),
                "test": blend.predict({m: models[m]["runs"][i]["test"] for m in members}),
                "crossfit_logloss": blend.crossfit_logloss,
            }
        )
    return {"runs": runs, "params": {"blends": blends}}


def run_split(ctx: Context, dataset: Dataset, settings: Settings) -> tuple[dict, dict]:
    """Every model trained and scored on one split of one dataset: (measures, notes)."""
    name = dataset.name
    path = write_shared(dataset, ctx.workdir / "shared")
    split = dataset.frame["split"].to_numpy()
    info: dict[str, Any] = {
        "rows": {s: int((split == s).sum()) for s in SPLITS},
        "clicks": {s: int(dataset.labels(s).sum()) for s in SPLITS},
        "split_digest": split_digest(split),
    }
    ctx.log(f"{name}: {info['rows']} rows, clicks {info['clicks']}")
    models: dict[str, dict] = {}
    started = time.perf_counter()
    found: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        # FuxiCTR's process runs beside the platform's training (one core each).
        fuxictr = pool.submit(run_fuxictr, ctx, dataset, path, settings)
        try:
            platform, tuning_s, notes = run_platform(ctx, dataset, settings)
            models.update(platform)
            info["tuning"] = notes
            found[f"tuning_s_{name}"] = tuning_s
            models["lightgbm"] = run_lightgbm(dataset, settings)
            models["lr"] = run_lr(dataset, settings)
        finally:
            peer = fuxictr.result()
    models.update(peer)
    blended = platform_ensemble(models, dataset.labels("validation"))
    if blended is not None:
        models[ENSEMBLE] = blended
    scored, details = dataset_measures(dataset, models)
    found.update(scored)
    info["models"] = details
    info["seconds"] = round(time.perf_counter() - started, 1)
    return found, info


def run(ctx: Context) -> dict[str, float]:
    settings = Settings.from_env()
    measures: dict[str, float] = {}
    params: dict[str, Any] = {
        "seeds": list(settings.seeds),
        "threads": settings.threads,
        "tuning_budget_s": settings.tuning_budget_s,
        "platform_epochs": settings.platform_epochs,
        "peer_epochs": settings.peer_epochs,
        "genres": settings.genres,
        "split": {
            "fractions": list(SPLIT_FRACTIONS),
            "seed": CRITEO_SPLIT_SEED,
            "movielens": MOVIELENS_SPLIT,
            "outer_splits_of_small_data": OUTER_SPLITS,
        },
        "metrics": "sklearn roc_auc_score / log_loss (p clipped to 1e-7), ECE 10 equal-width bins",
        "datasets": {},
        "goals": {},
    }
    ctx.parameters.update(params)
    for name in settings.datasets:
        first = shared_split(name)
        seeds = outer_split_seeds(first)
        founds, infos = [], []
        for k, seed in enumerate(seeds):
            dataset = first if seed is None else shared_split(name, seed)
            if len(seeds) == 1:
                found, info = run_split(ctx, dataset, settings)
            else:
                # Each split in its own folder, with its share of the dataset's tuning budget.
                (ctx.workdir / f"split-{k}").mkdir(parents=True, exist_ok=True)
                found, info = run_split(
                    replace(ctx, workdir=ctx.workdir / f"split-{k}"),
                    dataset,
                    replace(settings, tuning_budget_s=settings.tuning_budget_s / len(seeds)),
                )
                info["split_seed"] = CRITEO_SPLIT_SEED if seed is None else seed
                ctx.log(
                    f"{name} split {k + 1}/{len(seeds)}: platform best = "
                    f"{info['models']['platform_best']}, AUC - best peer "
                    f"{found[f'auc_best_platform_minus_best_peer_{name}']:+.4f}, log loss - best "
                    f"peer {found[f'logloss_best_platform_minus_best_peer_{name}']:+.4f}"
                )
            founds.append(found)
            infos.append(info)
        if len(seeds) == 1:
            found = founds[0]
            ctx.parameters["datasets"][name] = infos[0]
        else:
            found = combine_splits(name, founds)
            found[f"tuning_s_{name}"] = sum(f[f"tuning_s_{name}"] for f in founds)
            ctx.parameters["datasets"][name] = {
                "outer_splits": len(seeds),
                "splits": infos,
                "per_split": [
                    {k: v for k, v in f.items() if "_minus_best_peer_" in k} for f in founds
                ],
            }
        measures.update(found)
        goal = (
            found[f"auc_best_platform_minus_best_peer_{name}"] > 0
            and found[f"logloss_best_platform_minus_best_peer_{name}"] < 0
        )
        ctx.parameters["goals"][f"{name}: platform best beats every peer on AUC and log loss"] = (
            goal
        )
        top_goal = (
            found[f"auc_top_platform_minus_best_peer_{name}"] > 0
            and found[f"logloss_top_platform_minus_best_peer_{name}"] < 0
        )
        ctx.parameters["goals"][
            f"{name}: platform top (templates or ensemble) beats every peer on AUC and log loss"
        ] = top_goal
        ctx.log(
            f"{name}: platform best = "
            f"{', '.join(str(i['models']['platform_best']) for i in infos)}"
            f" (top {', '.join(str(i['models']['platform_top']) for i in infos)}); "
            f"top: AUC {found[f'auc_top_platform_minus_best_peer_{name}']:+.4f}, log loss "
            f"{found[f'logloss_top_platform_minus_best_peer_{name}']:+.4f}; "
            f"best: AUC - best peer {found[f'auc_best_platform_minus_best_peer_{name}']:+.4f}, "
            f"log loss - best peer {found[f'logloss_best_platform_minus_best_peer_{name}']:+.4f}"
            f" -> goal {'met' if goal else 'NOT met'}"
        )
    return measures
