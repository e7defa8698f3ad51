"""LightGBM: gradient-boosted decision trees, the strong tabular baseline.

Pick it first on a new tabular CTR dataset (a few dense and categorical fields, up to millions of
rows): it needs no feature scaling, handles categorical codes natively, trains in seconds on CPU
and is the baseline a neural template (``deepfm``, ``fine_ranking``) has to beat. It does not
learn embeddings of high-cardinality ids the way the neural templates do, and has no recall
(two-tower) mode.

Inputs are the encoded features every template sees (``FeatureEncoder``): the dense block (numbers
standardised, embeddings as one column per component) followed by the hashed categorical codes
(``0`` is null), one LightGBM column each. With ``categorical`` the codes are LightGBM
categorical features (a split groups codes), otherwise plain ordinal numbers.

Training is not the torch loop: ``training.gbdt`` runs it (boosting rounds, early stopping on the
validation rows, checkpoints of the booster's text model). So the shared torch params (``epochs``,
``max_steps``, ``batch_size``, ``lr``, ``weight_decay``, ``early_stopping_patience``,
``device``, ``step_sleep_s``, ``epoch_eval``) do not apply; ``num_boost_round``,
``learning_rate`` and ``early_stopping_rounds`` are their counterparts. The shared ``seed``,
``threads``, ``early_stopping_metric``, ``calibration``, the split params, ``log_every_steps``,
``checkpoint_every_steps``/``_s`` and ``importance`` apply as for every template.

The bundle stores the booster as LightGBM's own text model (``model.txt``; no pickle), and
``LightGBMModel`` puts it behind the torch templates' interface (``model(dense, cat)`` -> one raw
score, a logit, per row, ``.eval()``), so evaluation, the bundle's ``predict`` and serving score
it unchanged. A ``cv_folds`` run's model is one booster too: the folds' trees, each leaf
scaled by 1 / k (``averaged``), so its raw score is the mean of theirs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.bundle import BundleSpec
from training.templates.schemas import LIGHTGBM_PARAMS, with_defaults


def hparams(spec_or_params: BundleSpec | dict[str, Any]) -> dict[str, Any]:
    given = spec_or_params.hparams if isinstance(spec_or_params, BundleSpec) else spec_or_params
    return with_defaults(LIGHTGBM_PARAMS, given)


def feature_layout(spec: BundleSpec) -> tuple[list[str], list[int]]:
    """LightGBM's column names (from the dataset columns; LightGBM refuses JSON punctuation in
    names) and the indices of the categorical columns, in ``feature_matrix``'s order."""
    names: list[str] = []
    for feature in spec.dense_features:
        base = re.sub(r"[^A-Za-z0-9_]", "_", feature.column) or "f"
        if feature.dtype == "embedding":
            names.extend(f"{base}_{i}" for i in range(feature.dim))
        else:
            names.append(base)
    first_cat = len(names)
    for feature in spec.categorical_features:
        base = re.sub(r"[^A-Za-z0-9_]", "_", feature.column) or "f"
        # A list of categories fills ``slots`` columns (its items, padded with 0).
        slots = int(getattr(feature, "slots", 1) or 1)
        names.extend([base] if slots == 1 else [f"{base}_{i}" for i in range(slots)])
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if not count else f"{name}_{count}")
    return unique, list(range(first_cat, len(unique)))


def feature_matrix(dense: Any, cat: Any) -> np.ndarray:
    """One float64 matrix ``[dense | cat]`` from the encoder's arrays (numpy or torch)."""
    d = np.asarray(dense.cpu().numpy() if hasattr(dense, "cpu") else dense, dtype=np.float64)
    c = np.asarray(cat.cpu().numpy() if hasattr(cat, "cpu") else cat, dtype=np.float64)
    d, c = (a if a.ndim == 2 else a.reshape(len(a), -1) for a in (d, c))
    return np.ascontiguousarray(np.concatenate([d, c], axis=1))


class LightGBMModel:
    """A booster behind the torch templates' interface: ``model(dense, cat)`` gives the raw
    score (the logit) of each row as a float64 tensor. ``train``/``eval``/``to`` exist for the
    callers that switch a torch module's mode or device and change nothing. Prediction uses
    ``torch.get_num_threads()`` threads, so the model server's one-thread rule holds for it."""

    training = False

    def __init__(self, spec: BundleSpec, booster: Any = None) -> None:
        self.spec = spec
        self.booster = booster

    def eval(self) -> LightGBMModel:
        return self

    def train(self, mode: bool = True) -> LightGBMModel:
        return self

    def to(self, *_args: Any, **_kwargs: Any) -> LightGBMModel:
        return self

    def __call__(self, dense: Any, cat: Any):
        return self.forward(dense, cat)

    def forward(self, dense: Any, cat: Any):
        import torch

        if self.booster is None:
            raise RuntimeError("this LightGBM model has no booster (train or load one first)")
        x = feature_matrix(dense, cat)
        if not len(x):
            return torch.zeros(0, dtype=torch.float64)
        raw = self.booster.predict(x, raw_score=True, num_threads=torch.get_num_threads())
        return torch.from_numpy(np.asarray(raw, dtype=np.float64).reshape(-1))

    @property
    def num_trees(self) -> int:
        return int(self.booster.num_trees()) if self.booster is not None else 0

    def save(self, path: Path) -> None:
        """The booster as LightGBM's text model (every tree it holds)."""
        Path(path).write_text(self.booster.model_to_string(num_iteration=-1))

    def load(self, path: Path) -> LightGBMModel:
        """Parse LightGBM's text model (text only: nothing is unpickled)."""
        import lightgbm as lgb

        self.booster = lgb.Booster(model_str=Path(path).read_text())
        return self


def average_model_text(texts: Sequence[str]) -> str:
    """One LightGBM text model whose raw score is the mean of the given models' (same features,
    binary objective): all their trees, renumbered, every leaf value divided by their count;
    the header (features, objective) and the parameters are the first model's.

    Written by hand because LightGBM has no API to merge boosters (``Booster`` can add trees only
    by training). The text format is LightGBM's documented model file: the header lines, one
    ``Tree=<i>`` block per tree, ``end of trees``. ``tree_sizes`` (an index of the blocks' byte
    lengths, for parallel parsing) is dropped, and LightGBM parses the blocks in order without
    it. Measured (``training/tests/test_cv_folds.py``): the merged raw score equals the mean of
    the models' to 1e-12."""
    count = len(texts)
    if not count:
        raise ValueError("no models to average")
    head = texts[0][: texts[0].index("\nTree=")]
    head = "\n".join(line for line in head.split("\n") if not line.startswith("tree_sizes="))
    tail = texts[0][texts[0].index("end of trees") :]
    trees: list[str] = []
    for text in texts:
        body = text[text.index("\nTree=") + 1 : text.index("end of trees")]
        for block in re.split(r"\n(?=Tree=\d+\n)", body.strip("\n")):
            lines = block.strip("\n").split("\n")
            lines[0] = f"Tree={len(trees)}"
            for i, line in enumerate(lines):
                if line.startswith("leaf_value="):
                    values = (float(v) / count for v in line.removeprefix("leaf_value=").split())
                    lines[i] = "leaf_value=" + " ".join(repr(v) for v in values)
            trees.append("\n".join(lines))
    return head.rstrip("\n") + "\n\n" + "\n\n\n".join(trees) + "\n\n\n" + tail


def averaged(models: Sequence[LightGBMModel], spec: BundleSpec) -> LightGBMModel:
    """The model whose raw score is the mean of ``models``' (``average_model_text``)."""
    import lightgbm as lgb

    text = average_model_text([m.booster.model_to_string(num_iteration=-1) for m in models])
    return LightGBMModel(spec, lgb.Booster(model_str=text))


def build(spec: BundleSpec) -> LightGBMModel:
    """An empty model: ``training.gbdt`` trains its booster, ``load_bundle`` reads it."""
    return LightGBMModel(spec)
