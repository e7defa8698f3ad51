"""Models from the ecosystem: MLflow flavors imported without unpickling anything.

A model logged with the stock MLflow client becomes a platform bundle (``spec.json`` plus its
model file) whose template is one of the ``mlflow-*`` templates registered here:

=================  ==================  ===================================================
flavor             bundle model file   loaded with
=================  ==================  ===================================================
``sklearn``        ``model.skops``     ``skops.io.load`` with the types in ``SKOPS_TRUSTED``
``onnx``           ``model.onnx``      ``onnxruntime.InferenceSession``
``lightgbm``       ``model.lgb``       ``lightgbm.Booster(model_file=...)`` (its text format)
``xgboost``        ``model.ubj``       ``xgboost.Booster(model_file=...)`` (its JSON or UBJSON
                                       format; kept as UBJSON)
``pytorch``        ``weights.pt``      a state dict (``torch.load(weights_only=True)``) into
                                       the declared architecture (``mlp``: Linear layers
                                       whose sizes the state dict gives, one activation)
=================  ==================  ===================================================

A pickled model (sklearn's ``pickle``/``cloudpickle`` formats, the pytorch flavor's full
``model.pth``, a pyfunc ``python_model.pkl``) is refused and never opened. Each model takes the
bundle's dense matrix, i.e. the mapped inputs in signature order (raw values: mean 0, std 1), and
gives logits, so ``training.bundle.Bundle.predict`` turns them into probabilities as for every
other bundle.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from training.bundle import WEIGHTS_FILE, BundleSpec, register_template

SAFE_FLAVORS: tuple[str, ...] = (
    "sklearn (skops)",
    "onnx",
    "lightgbm (Booster text)",
    "xgboost (ubj or json)",
    "pytorch (state dict)",
)
SAFE_FLAVORS_TEXT = ", ".join(SAFE_FLAVORS)
# skops refuses to build any type outside ``trusted``. Beyond skops' own default-trusted types
# (sklearn's estimators, numpy arrays and scalars), only scikit-learn's own types are trusted
# (e.g. ``sklearn.tree._tree.Tree`` inside a forest); a file naming any other type (a builtin
# such as ``operator.neg`` or ``builtins.eval``, a user function) is refused, the type named.
SKOPS_TRUSTED = ("sklearn.",)
OUTPUTS = ("probability", "logit")
ACTIVATIONS = ("relu", "tanh", "sigmoid")

TEMPLATE_SKLEARN = "mlflow-sklearn"
TEMPLATE_ONNX = "mlflow-onnx"
TEMPLATE_LIGHTGBM = "mlflow-lightgbm"
TEMPLATE_XGBOOST = "mlflow-xgboost"
TEMPLATE_MLP = "mlflow-mlp"
# A platform ranking model compiled to ONNX and quantised to int8 by ONNX Runtime
# (``serving.quantization``): it takes the bundle's encoded (dense, categorical) inputs, as the
# torch model it came from did, and gives logits.
TEMPLATE_ONNX_INT8 = "onnx-int8"
FILES = {
    TEMPLATE_SKLEARN: "model.skops",
    TEMPLATE_ONNX: "model.onnx",
    TEMPLATE_LIGHTGBM: "model.lgb",
    TEMPLATE_XGBOOST: "model.ubj",
    TEMPLATE_ONNX_INT8: "model.int8.onnx",
}
XGBOOST_FORMATS = (".ubj", ".json")


def to_logits(scores: np.ndarray, output: str):
    """A model's scores as a float64 tensor of logits (probabilities are inverted)."""
    import torch

    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    if output == "probability":
        values = np.clip(values, 1e-12, 1 - 1e-12)
        values = np.log(values) - np.log1p(-values)
    return torch.from_numpy(values)


class FileModel:
    """A model read from its own file; ``save`` writes the same bytes back (the bundle keeps the
    file it was imported from, byte for byte)."""

    def __init__(self, spec: BundleSpec) -> None:
        self.spec = spec
        self.output = str(spec.hparams.get("output") or "probability")
        self.source: Path | None = None

    # Never trained here: the evaluation loop's ``model.training`` / ``model.train()`` see an
    # inference-only model.
    training = False

    def eval(self) -> FileModel:
        return self

    def train(self, mode: bool = True) -> FileModel:
        return self

    def load(self, path: Path) -> None:
        self.source = Path(path)
        self.open(self.source)

    def save(self, path: Path) -> None:
        assert self.source is not None
        shutil.copyfile(self.source, path)

    def open(self, path: Path) -> None:  # pragma: no cover (abstract)
        raise NotImplementedError

    def scores(self, dense: np.ndarray) -> np.ndarray:  # pragma: no cover (abstract)
        raise NotImplementedError

    def __call__(self, dense, cat):
        return to_logits(self.scores(dense.numpy()), self.output)


def skops_untrusted(path: Path) -> list[str]:
    """The types a skops file would build that ``SKOPS_TRUSTED`` does not allow."""
    import skops.io

    return [t for t in skops.io.get_untrusted_types(file=path) if not t.startswith(SKOPS_TRUSTED)]


class SkopsModel(FileModel):
    def open(self, path: Path) -> None:
        import skops.io

        refused = skops_untrusted(path)
        if refused:
            raise ValueError(f"untrusted types in the skops file: {', '.join(refused[:5])}")
        self.estimator = skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))

    def scores(self, dense: np.ndarray) -> np.ndarray:
        if hasattr(self.estimator, "predict_proba"):
            return self.estimator.predict_proba(dense)[:, -1]
        return self.estimator.predict(dense)


class OnnxModel(FileModel):
    def open(self, path: Path) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0]

    def scores(self, dense: np.ndarray) -> np.ndarray:
        kind = "float64" if "double" in self.input.type else "float32"
        out = self.session.run(None, {self.input.name: dense.astype(kind)})[0]
        out = np.asarray(out)
        return out[:, -1] if out.ndim == 2 else out


class OnnxRankerModel(FileModel):
    """A platform ranker in ONNX (``serving.quantization``): inputs ``dense`` (float32) and
    ``cat`` (int64) as the encoder gives them, output one logit per row; one intra-op thread,
    as the gateway's workers run every model."""

    def open(self, path: Path) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, dense, cat):
        import torch

        feed = {"dense": dense.numpy().astype(np.float32), "cat": cat.numpy().astype(np.int64)}
        out = self.session.run(None, {name: feed[name] for name in self.inputs})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(-1))


class LightGBMBoosterModel(FileModel):
    def open(self, path: Path) -> None:
        import lightgbm

        self.booster = lightgbm.Booster(model_file=str(path))

    def scores(self, dense: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(dense.astype(np.float64)))


class XGBoostBoosterModel(FileModel):
    """XGBoost's own model format (JSON or UBJSON, never a pickle; the sklearn wrapper's models
    are saved in it too), kept in the bundle as UBJSON whatever it came as."""

    def open(self, path: Path) -> None:
        import xgboost

        self.booster = xgboost.Booster(model_file=str(path))

    def save(self, path: Path) -> None:
        Path(path).write_bytes(bytes(self.booster.save_raw(raw_format="ubj")))

    def scores(self, dense: np.ndarray) -> np.ndarray:
        import xgboost

        # The booster's own column names (a DataFrame's, when it was trained on one): the
        # columns arrive in signature order, which is the order it was trained with.
        matrix = xgboost.DMatrix(dense.astype(np.float32), feature_names=self.booster.feature_names)
        return np.asarray(self.booster.predict(matrix))


def build_mlp(spec: BundleSpec):
    """The declared ``mlp``: ``nn.Sequential`` of Linear layers (sizes ``hparams["layers"]``,
    read from the state dict at import) with ``activation`` between them, one output."""
    import torch
    from torch import nn

    sizes = [int(s) for s in spec.hparams["layers"]]
    activation = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[
        spec.hparams.get("activation") or "relu"
    ]
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(activation())
    body = nn.Sequential(*layers)
    output = str(spec.hparams.get("output") or "logit")

    class DeclaredMLP(nn.Module):
        """The stock module's layers under its own keys (``0.weight``, ...)."""

        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def state_dict(self, *args, **kwargs):
            return self.body.state_dict(*args, **kwargs)

        def load_state_dict(self, state, strict: bool = True, assign: bool = False):
            return self.body.load_state_dict(state, strict=strict, assign=assign)

        def forward(self, dense, cat):
            out = self.body(dense.float()).reshape(-1)
            if output == "probability":
                out = torch.logit(out.clamp(1e-7, 1 - 1e-7))
            return out

    return DeclaredMLP()


def mlp_layers(state: dict[str, Any]) -> list[int]:
    """Layer sizes of a Sequential of Linear layers from its state dict (``N.weight``/``N.bias``
    only): ``[inputs, hidden..., 1]``; ValueError for anything else."""
    weights = sorted(
        (int(key.split(".")[0]), value)
        for key, value in state.items()
        if key.endswith(".weight") and key.split(".")[0].isdigit()
    )
    extra = [
        k
        for k in state
        if not (k.split(".")[0].isdigit() and k.split(".")[-1] in ("weight", "bias"))
    ]
    if not weights or extra:
        raise ValueError(
            "the mlp architecture takes a state dict of nn.Sequential Linear layers "
            "(keys 0.weight, 0.bias, 2.weight, ...)"
        )
    sizes = [int(weights[0][1].shape[1])]
    for _, tensor in weights:
        if tensor.ndim != 2 or int(tensor.shape[1]) != sizes[-1]:
            raise ValueError("the state dict's Linear layers do not chain")
        sizes.append(int(tensor.shape[0]))
    if sizes[-1] != 1:
        raise ValueError("the last Linear layer must have one output")
    return sizes


def _register() -> None:
    for template, model_class in (
        (TEMPLATE_SKLEARN, SkopsModel),
        (TEMPLATE_ONNX, OnnxModel),
        (TEMPLATE_LIGHTGBM, LightGBMBoosterModel),
        (TEMPLATE_XGBOOST, XGBoostBoosterModel),
        (TEMPLATE_ONNX_INT8, OnnxRankerModel),
    ):
        register_template(template, model_file=FILES[template])(model_class)
    # No param schema: these load imported models; they are not templates a job trains.
    register_template(TEMPLATE_MLP)(build_mlp)


_register()
assert WEIGHTS_FILE not in FILES.values()
