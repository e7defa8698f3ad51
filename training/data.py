"""The data side of a training run: the job spec the agent hands the child, and the loader.

No Django here: the training child (``python -m training.runner``) imports only this module, the
bundle contract and the templates, so it starts fast and never touches the database.

The loader reads the dataset's Parquet file once with pyarrow, orders it by event time and splits
it train | validation | test: the test rows (``holdout``) are the newest ``holdout_fraction`` of
rows (a time-ordered split, so evaluation never sees the past through the future), and the
validation rows the newest ``validation_fraction`` of what precedes them (early stopping and
calibration read them; nothing but the final evaluation reads the test rows). A
``split_column`` whose values are ``train``/``validation``/``test`` assigns the rows instead of
the fractions. The loader fits the encoding on the train part only (the numeric features'
mean/std, the categorical features' vocabularies, a list feature's slots; see
``training.bundle``), and encodes everything once through ``FeatureEncoder`` (the same transform
serving uses). Batches
are then index slices of in-memory tensors, in an order fixed by ``seed`` and the epoch number,
so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from training.bundle import (
    CATEGORICAL_LIST,
    HASHED,
    LOG_TRANSFORM,
    BundleSpec,
    FeatureEncoder,
    FeatureSpec,
    build_vocab,
    hash_bucket,
    numeric_values,
)
from training.params import COMMON

TIME_COLUMN = "event_time"
MIN_BUCKETS = 16
COLLISION_FREE_MAX = 20_000
COLLISION_TRIES = 500
SPLIT_VALUES = ("train", "validation", "test")


class DataError(ValueError):
    """The dataset does not fit the job (e.g. a split column it lacks): the message says why."""


@dataclass
class JobSpec:
    """What the agent tells the training child (written as ``spec.json`` in the job's folder)."""

    job_id: int
    template: str
    dataset_path: str
    features: list[dict[str, Any]]  # FeatureSpec fields without the fitted stats
    work_dir: str
    label: str = "clicked"
    entity_keys: dict[str, list[str]] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    base_model_path: str = ""
    entry_point: str = ""  # "module.path" or a path to a .py file (user code)
    slice_column: str = ""
    workers: int = 1  # data-parallel ranks (training.distributed), on every node together
    # Of a job spread over several nodes: the ranks on rank 0's node (0: all ``workers``), and
    # the address the other nodes' ranks reach its rendezvous store at.
    local_ranks: int = 0
    rendezvous_host: str = "127.0.0.1"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data = json.loads(text)
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def checkpoint_file(self) -> Path:
        return Path(self.work_dir) / "checkpoint.pt"

    @property
    def model_dir(self) -> Path:
        return Path(self.work_dir) / "model"

    def param(self, name: str, default: Any) -> Any:
        value = self.params.get(name, default)
        return default if value is None else value


@dataclass
class Split:
    dense: Any  # torch.FloatTensor [n, d]
    cat: Any  # torch.LongTensor [n, k]
    label: Any  # torch.FloatTensor [n]
    slices: np.ndarray | None = None  # raw values of the slice column (held-out part)

    @property
    def n(self) -> int:
        return int(self.label.shape[0])


@dataclass
class TrainData:
    """The encoded splits; ``holdout`` is the test split. ``rows`` holds each split's row
    positions in the time-ordered dataset (``train``, ``validation``, ``test``)."""

    spec: BundleSpec
    train: Split
    holdout: Split
    validation: Split | None = None
    rows: dict[str, np.ndarray] = field(default_factory=dict)


def _to_label(column) -> np.ndarray:
    """0/1 floats from a bool/int/float label column; a null label counts as no click."""
    import pyarrow.compute as pc

    values = pc.fill_null(pc.cast(column, "float64"), 0.0).to_numpy(zero_copy_only=False)
    return (
        np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0).clip(0, 1).astype(np.float32)
    )


def read_table(path: str | Path, columns: list[str]):
    """The dataset's needed columns, ordered by event time (stable)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # A dataset is a folder of Parquet parts (in row order by name) or, built before
    # partitioned samples, one file; a folder's schema is its first part's.
    parts = sorted(Path(path).glob("part-*.parquet")) if Path(path).is_dir() else [Path(path)]
    schema = pq.read_schema(parts[0])
    present = [c for c in columns if c in schema.names]
    if TIME_COLUMN in schema.names and TIME_COLUMN not in present:
        present.append(TIME_COLUMN)
    table = pq.read_table(path, columns=present)
    if TIME_COLUMN in table.column_names and table.num_rows:
        order = pc.sort_indices(table, sort_keys=[(TIME_COLUMN, "ascending")])
        table = table.take(order)
    return table


def choose_buckets(values: list[Any]) -> int:
    """A hash space where the train part's distinct values do not collide (when small enough).

    A collision merges two categories into one embedding row (e.g. two ad categories with
    different user affinities), which costs accuracy for nothing when the vocabulary is small.
    """
    values = [v for v in values if v is not None]
    distinct = len(values)
    buckets = max(MIN_BUCKETS, 4 * distinct)
    if distinct > COLLISION_FREE_MAX:
        return buckets
    for candidate in range(buckets, buckets + COLLISION_TRIES):
        if len(np.unique(hash_bucket(values, candidate))) == distinct:
            return candidate
    return buckets


def fit_categorical(feature: FeatureSpec, values: list[Any], job: JobSpec) -> None:
    """A categorical feature's vocabulary (or, above ``max_vocab``, its hash buckets) from the
    train rows' ``values`` (a list feature's: every item of every row)."""
    vocab = build_vocab(
        values,
        min_count=int(job.param("vocab_min_count", COMMON["vocab_min_count"].default)),
        max_vocab=int(job.param("max_vocab", COMMON["max_vocab"].default)),
    )
    if vocab is None:
        feature.vocab = []
        feature.buckets = choose_buckets(list(dict.fromkeys(values)))
    else:
        feature.vocab = vocab
        feature.buckets = len(vocab) + 1  # the OOV index is the last one


def fit_bundle_spec(job: JobSpec, train_table) -> BundleSpec:
    """The bundle spec with the encoding fitted on the train rows only (mean/std,
    vocabularies or hash buckets, list slots)."""
    import pyarrow.compute as pc

    transform = str(job.param("numeric_transform", COMMON["numeric_transform"].default))
    fitted: list[FeatureSpec] = []
    for raw in job.features:
        feature = FeatureSpec.from_dict(raw)
        if feature.column not in train_table.column_names:
            if feature.dtype == CATEGORICAL_LIST:
                feature.dim = 1
            fitted.append(feature)
            continue
        column = train_table.column(feature.column)
        if feature.dtype == CATEGORICAL_LIST:
            rows = [r for r in column.to_pylist() if r is not None]
            longest = max((len(r) for r in rows), default=0)
            limit = int(job.param("max_list_length", COMMON["max_list_length"].default))
            feature.dim = max(1, min(longest, limit))
            if not feature.buckets:
                fit_categorical(feature, [item for r in rows for item in r], job)
        elif feature.dtype in HASHED:
            # A job that names its buckets keeps hashing into them.
            if not feature.buckets:
                fit_categorical(feature, column.to_pylist(), job)
        elif feature.dtype in {"float", "int", "bool"}:
            if feature.dtype != "bool" and transform == LOG_TRANSFORM:
                feature.transform = LOG_TRANSFORM
            values = numeric_values(
                pc.cast(column, "float64").to_numpy(zero_copy_only=False), feature.transform
            )
            values = values[~np.isnan(values)]
            if values.size:
                feature.mean = float(values.mean())
                std = float(values.std())
                feature.std = std if std > 1e-12 else 1.0
        fitted.append(feature)
    # Lists stay (fine_ranking's ``hidden`` layer widths); objects are options for the
    # platform (``scheduler``), not the model.
    hparams = {k: v for k, v in job.params.items() if not isinstance(v, dict)}
    return BundleSpec(
        template=job.template or "entry_point",
        features=fitted,
        hparams=hparams,
        label=job.label,
        entity_keys=dict(job.entity_keys),
        extra={"job_id": job.job_id},
    )


def encode_split(spec: BundleSpec, table, label: str, slice_column: str = "") -> Split:
    import torch

    n = table.num_rows
    columns = {name: table.column(name) for name in table.column_names}
    dense, cat = FeatureEncoder(spec).encode(columns, n)
    if label in table.column_names:
        y = _to_label(table.column(label))
    else:
        y = np.zeros(n, dtype=np.float32)
    slices = None
    if slice_column and slice_column in table.column_names:
        slices = np.asarray([str(v) for v in table.column(slice_column).to_pylist()], dtype=object)
    return Split(
        dense=torch.from_numpy(np.ascontiguousarray(dense)),
        cat=torch.from_numpy(np.ascontiguousarray(cat)),
        label=torch.from_numpy(y),
        slices=slices,
    )


def holdout_rows(n: int, fraction: float) -> int:
    if n < 2:
        return 0
    return min(n - 1, max(1, math.ceil(n * fraction)))


def validation_rows(n: int, fraction: float) -> int:
    """Validation rows carved from ``n`` training rows (at least one row stays for training)."""
    if n < 2 or fraction <= 0:
        return 0
    return min(n - 1, max(1, math.ceil(n * fraction)))


def split_rows(job: JobSpec, table) -> dict[str, np.ndarray]:
    """Row positions (in time order) of ``train``, ``validation`` and ``test``: from the job's
    ``split_column`` when it names one, else train | validation | test by the fractions (the
    test rows are the same as with ``holdout_fraction`` alone)."""
    n = table.num_rows
    column = str(job.param("split_column", ""))
    if column:
        if column not in table.column_names:
            raise DataError(f"the split column {column!r} is not a column of the dataset")
        values = np.asarray([str(v) for v in table.column(column).to_pylist()], dtype=object)
        unknown = sorted(set(values.tolist()) - set(SPLIT_VALUES))
        if unknown:
            raise DataError(
                f"the split column {column!r} holds {unknown[:5]}; each row's value must be "
                "one of: " + ", ".join(SPLIT_VALUES)
            )
        return cv_split(job, {name: np.flatnonzero(values == name) for name in SPLIT_VALUES})
    held = holdout_rows(n, float(job.param("holdout_fraction", 0.2)))
    rest = n - held
    val = validation_rows(rest, float(job.param("validation_fraction", 0.1)))
    return cv_split(
        job,
        {
            "train": np.arange(0, rest - val),
            "validation": np.arange(rest - val, rest),
            "test": np.arange(rest, n),
        },
    )


def cv_folds(job: JobSpec) -> int:
    """The job's ``cv_folds`` when it cross-fits (2 or more), else 0."""
    folds = int(job.param("cv_folds", 0) or 0)
    return folds if folds >= 2 else 0


def cv_pool(rows: Mapping[str, np.ndarray], folds: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows cross-fitting deals out (train and validation, in time order) and each one's
    fold: interleaved (the i-th pooled row in fold i mod ``folds``), so every fold spans the
    whole period and holds about the same share of each stretch of it."""
    pool = np.sort(np.concatenate([rows["train"], rows["validation"]]))
    return pool, cv_fold_of(len(pool), folds)


def cv_fold_of(n: int, folds: int) -> np.ndarray:
    """The fold of each of ``n`` pooled rows, in pool order (``cv_pool``)."""
    return np.arange(n) % folds


def stops_early(job: JobSpec) -> bool:
    """Whether training reads its validation rows to stop and keep its best epoch or round:
    boosted trees with ``early_stopping_rounds``, the minibatch loop with
    ``early_stopping_patience``; not the convex fit (``solver: lbfgs``, logreg's default),
    which solves to convergence on the training rows alone."""
    import training.templates  # noqa: F401  (registers the built-in templates and schemas)
    from training.bundle import TEMPLATE_PARAMS, template_kind

    schema = TEMPLATE_PARAMS.get(job.template, {})

    def param(name: str, fallback: Any) -> Any:
        default = schema[name].default if name in schema else fallback
        return job.param(name, default)

    if template_kind(job.template) == "gbdt":
        return int(param("early_stopping_rounds", 0) or 0) > 0
    if str(param("solver", "adam")) == "lbfgs":
        return False
    return int(job.param("early_stopping_patience", 2) or 0) > 0


def cv_split(job: JobSpec, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``rows`` as one fold of a ``cv_folds`` run sees them: a member (``cv_fold`` i, set by
    ``training.runner.train_members``) never trains on fold i, whose rows it alone predicts
    for the run's out-of-fold metrics; the run itself (no ``cv_fold``) has the whole pool as its
    train rows and no validation rows (its validation metrics are the members' out-of-fold
    ones). The test rows never move.

    A member that stops early (``stops_early``) stops on the next fold, i + 1, and trains on
    the remaining k - 2: stopped on fold i itself, it would keep the epoch or round that scored
    fold i best, and the out-of-fold metrics (what the tuner and the choice between templates
    read) would be chosen on the rows they score. Measured on the quality bench's Criteo
    sample (5 outer splits): boosted trees stopped on their own fold showed out-of-fold log
    losses 0.01-0.11 below their test log losses, and were chosen over better templates in 3 of
    the 5 splits. A member that does not stop early (the convex fit) trains on the k - 1 other
    folds, and so does every member of a 2-fold run (no third fold to stop on: it stops on its
    own, and its out-of-fold figures flatter it as before)."""
    folds = cv_folds(job)
    if not folds:
        return rows
    pool, which = cv_pool(rows, folds)
    fold = int(job.param("cv_fold", -1))
    if fold < 0:
        return {"train": pool, "validation": pool[:0], "test": rows["test"]}
    if folds > 2 and stops_early(job):
        stop_on = (fold + 1) % folds
        return {
            "train": pool[(which != fold) & (which != stop_on)],
            "validation": pool[which == stop_on],
            "test": rows["test"],
        }
    return {"train": pool[which != fold], "validation": pool[which == fold], "test": rows["test"]}


def load(job: JobSpec, *, spec: BundleSpec | None = None) -> TrainData:
    """Read, split (time-ordered), fit (train part only) and encode once.

    ``spec`` (e.g. from a checkpoint or the base model) keeps the earlier fitted stats, so a
    resumed or incremental run encodes exactly like the model it continues.
    """
    columns = [f["column"] for f in job.features] + [job.label]
    if job.slice_column:
        columns.append(job.slice_column)
    if job.param("split_column", ""):
        columns.append(str(job.param("split_column", "")))
    table = read_table(job.dataset_path, list(dict.fromkeys(columns)))
    rows = split_rows(job, table)
    parts = {name: table.take(positions) for name, positions in rows.items()}
    if spec is None:
        # A cross-fitted run's members all encode as the run does (one encoding for the model
        # that averages them): fitted on the pooled train and validation rows.
        if cv_folds(job):
            # The pool, whichever fold this member leaves out or stops on.
            whole = split_rows(replace(job, params={**job.params, "cv_fold": -1}), table)
            spec = fit_bundle_spec(job, table.take(whole["train"]))
        else:
            spec = fit_bundle_spec(job, parts["train"])
    return TrainData(
        spec=spec,
        train=encode_split(spec, parts["train"], job.label),
        validation=encode_split(spec, parts["validation"], job.label),
        holdout=encode_split(spec, parts["test"], job.label, job.slice_column),
        rows=rows,
    )


class BatchOrder:
    """Which rows make batch ``step``: a permutation per epoch fixed by (seed, epoch).

    The position in the data is therefore just the step number: a run resumed at step s reads
    exactly the batches an uninterrupted run reads from step s on.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n = n
        self.batch_size = max(1, min(batch_size, n)) if n else 1
        self.seed = seed
        self.steps_per_epoch = max(1, math.ceil(n / self.batch_size)) if n else 0
        self._epoch = -1
        self._perm = None

    def position(self, step: int) -> tuple[int, int]:
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int):
        import torch

        epoch, index = self.position(step)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.n, generator=generator)
            self._epoch = epoch
        return self._perm[index * self.batch_size : (index + 1) * self.batch_size]
