"""The model bundle: what training writes and serving loads. No pickle, ever.

A bundle is a directory under ``ARTIFACT_ROOT``::

    spec.json    {"format": "rankops-bundle/1", "template": ..., "hparams": {...},
                  "features": [FeatureSpec...], "label": ..., "entity_keys": {...}, ...}
    weights.pt   the module's state_dict (tensors only; loaded with ``weights_only=True``)
    model.txt    instead of ``weights.pt`` for a template registered with its own model file
                 (``lightgbm``: the booster as LightGBM's text model); ``model_file`` names it

``extra["calibration"]`` (when present) is the post-hoc calibration fitted on the validation
rows: ``{"method": "temperature", "temperature": T}`` (probability ``sigmoid(logit / T)``) or
``{"method": "isotonic", "x": [...], "y": [...]}`` (the isotonic fit's thresholds, applied to
the raw probability by linear interpolation). ``apply_calibration`` is the one place that turns
logits into probabilities, so training's evaluation and serving score alike.

``FeatureEncoder`` is the one transform from raw feature values (dataset columns named
``<group>__<feature>``, or online-store values by ``group:feature`` ref) to model inputs; the
training path and the serving path both go through it, which is what the release gate's
consistency check verifies end to end. It encodes, as the reference CTR libraries (FuxiCTR's
``FeatureProcessor``, DeepCTR's preprocessing) do:

- a categorical or string field through its **vocabulary** (``FeatureSpec.vocab``, fitted on
  the train rows: the values seen at least ``vocab_min_count`` times, most frequent first): a
  value's index 1..V, ``V + 1`` for a value outside it (unseen in training, or too rare: the
  out-of-vocabulary row, which the rare train values teach), 0 for null. ``buckets`` is ``V + 1``,
  so a template's ``nn.Embedding(buckets + 1, dim)`` holds every index. A field without a
  vocabulary (an older bundle, or one whose vocabulary outgrew ``max_vocab``) hashes its values
  into 1..``buckets`` instead (``hash_bucket``), exactly as before vocabularies existed;
- a ``categorical_list`` field (a list of categories per row, e.g. a user's recent ad
  categories) the same way item by item, into ``dim`` columns of the categorical matrix: its first
  ``dim`` items' indices, padded with 0 (templates pool the non-padding slots, see
  ``training.templates.inputs``);
- a numeric field (float, int, bool; a bool is 0/1) as ``(t(x) - mean) / std`` with the train
  rows' mean/std of ``t(x)``, where ``t`` is the identity or, with ``transform == "log"``,
  ``log(1 + max(x, 0))`` (heavy-tailed counts, like Criteo's integer fields); a null becomes 0,
  i.e. the train mean;
- an embedding feature as its ``dim`` numbers (a null: zeros).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "rankops-bundle/1"
SPEC_FILE = "spec.json"
WEIGHTS_FILE = "weights.pt"
NUMERIC = {"float", "int", "bool"}
# A list of categories per row: its items share one vocabulary, in ``dim`` padded columns.
CATEGORICAL_LIST = "categorical_list"
# The categorical inputs (the ``cat`` matrix): a vocabulary index, or a hash bucket without one.
HASHED = {"categorical", "string", CATEGORICAL_LIST}
LOG_TRANSFORM = "log"


@dataclass
class FeatureSpec:
    """One model input: where it comes from and how it is encoded."""

    ref: str  # "group:feature" (online store / registry reference)
    column: str  # dataset column, "<group>__<feature>"
    dtype: str  # float | int | bool | categorical | string | categorical_list | embedding
    entity: str = ""  # user | item | context | ... (which request part supplies the key)
    dim: int = 1  # embedding dimension; a categorical_list's slots (list items kept)
    # Categorical: the index space's size without null (vocabulary: V + 1 with the OOV index;
    # hashing: the buckets). 0 -> not fitted.
    buckets: int = 0
    mean: float = 0.0
    std: float = 1.0
    # The vocabulary, most frequent first (index i + 1); empty: hash into ``buckets``.
    vocab: list[str] = field(default_factory=list)
    transform: str = ""  # numeric: "" (as is) | "log" (log(1 + max(x, 0))) before mean/std

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSpec:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def slots(self) -> int:
        """Columns of the categorical matrix this feature fills (a list: ``dim``; else 1)."""
        return max(1, int(self.dim)) if self.dtype == CATEGORICAL_LIST else 1

    @property
    def oov_index(self) -> int:
        """The out-of-vocabulary index (``len(vocab) + 1``); 0 without a vocabulary."""
        return len(self.vocab) + 1 if self.vocab else 0


@dataclass
class BundleSpec:
    template: str
    features: list[FeatureSpec]
    hparams: dict[str, Any] = field(default_factory=dict)
    label: str = "clicked"
    entity_keys: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BundleSpec:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} bundle spec")
        return cls(
            template=str(data["template"]),
            features=[FeatureSpec.from_dict(f) for f in data["features"]],
            hparams=dict(data.get("hparams") or {}),
            label=str(data.get("label") or "clicked"),
            entity_keys=dict(data.get("entity_keys") or {}),
            extra=dict(data.get("extra") or {}),
        )

    @property
    def dense_features(self) -> list[FeatureSpec]:
        return [f for f in self.features if f.dtype in NUMERIC or f.dtype == "embedding"]

    @property
    def categorical_features(self) -> list[FeatureSpec]:
        return [f for f in self.features if f.dtype in HASHED]

    @property
    def dense_dim(self) -> int:
        return sum(f.dim if f.dtype == "embedding" else 1 for f in self.dense_features)


def apply_calibration(logits: np.ndarray, calibration: Mapping[str, Any] | None) -> np.ndarray:
    """Click probabilities (float64) from raw logits, through the bundle's calibration."""
    z = np.asarray(logits, dtype=np.float64)
    method = (calibration or {}).get("method", "none")
    if method == "temperature":
        z = z / float(calibration["temperature"])
    prob = 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))
    if method == "isotonic":
        prob = np.interp(
            prob,
            np.asarray(calibration["x"], dtype=np.float64),
            np.asarray(calibration["y"], dtype=np.float64),
        )
    return prob


def category_text(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Values as the text their vocabulary and hash see (``str(v)``), and the null mask.

    The one normalisation both fitting and encoding apply, so ``5`` and ``"5"`` are one
    category in the train rows and at serving alike."""
    array = np.asarray([None if v is None else str(v) for v in values], dtype=object)
    nulls = np.fromiter((v is None for v in array), dtype=bool, count=len(array))
    return array, nulls


def hash_bucket(values: Sequence[Any], buckets: int) -> np.ndarray:
    """Stable hash of values into 1..buckets (0 is reserved for null). Same in every process."""
    import pandas as pd

    array, nulls = category_text(values)
    filled = np.where(nulls, "", array).astype(object)
    hashed = pd.util.hash_array(filled, categorize=True).astype(np.uint64)
    out = (hashed % np.uint64(buckets)).astype(np.int64) + 1
    out[nulls] = 0
    return out


def build_vocab(values: Sequence[Any], *, min_count: int, max_vocab: int) -> list[str] | None:
    """The vocabulary of ``values`` (train rows only): the texts seen at least ``min_count``
    times, by count descending then text (deterministic); None when more than ``max_vocab``
    texts are kept (the caller hashes instead). Nulls are not categories."""
    import pandas as pd

    array, nulls = category_text(values)
    counts = pd.Series(array[~nulls], dtype=object).value_counts(sort=False)
    kept = counts[counts >= max(1, int(min_count))]
    if len(kept) > max_vocab:
        return None
    return [text for text, _ in sorted(kept.items(), key=lambda item: (-int(item[1]), item[0]))]


def categorical_columns(spec: BundleSpec) -> list[tuple[FeatureSpec, int]]:
    """Each categorical feature with its first column in the ``cat`` matrix (a list feature
    fills ``slots`` columns from there)."""
    out = []
    offset = 0
    for feature in spec.categorical_features:
        out.append((feature, offset))
        offset += feature.slots
    return out


def _list_items(value: Any) -> Sequence[Any]:
    """One row of a list feature as its items (a bare value is a one-item list)."""
    if value is None:
        return ()
    if isinstance(value, str | bytes | int | float | np.generic):
        return (value,)
    return list(value)


class FeatureEncoder:
    """Raw columns -> (dense float32 [n, dense_dim], categorical int64 [n, cat columns])."""

    def __init__(self, spec: BundleSpec) -> None:
        self.spec = spec
        self._indexes: dict[str, tuple[list[str], Any]] = {}

    def encode(self, columns: Mapping[str, Sequence[Any]], n: int) -> tuple[np.ndarray, np.ndarray]:
        """``columns`` maps each feature's ``column`` (or its ``ref``) to ``n`` raw values."""
        dense_parts: list[np.ndarray] = []
        for feature in self.spec.dense_features:
            values = _lookup(columns, feature, n)
            if feature.dtype == "embedding":
                block = np.zeros((n, feature.dim), dtype=np.float32)
                for i, v in enumerate(values):
                    if v is not None:
                        block[i] = np.asarray(v, dtype=np.float32)
                dense_parts.append(block)
            else:
                arr = numeric_values(values, feature.transform)
                arr = (arr - feature.mean) / (feature.std or 1.0)
                arr = np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)
                dense_parts.append(arr.astype(np.float32).reshape(n, 1))
        dense = np.concatenate(dense_parts, axis=1) if dense_parts else np.zeros((n, 0), np.float32)
        cat_parts = []
        for feature in self.spec.categorical_features:
            if feature.dtype == CATEGORICAL_LIST:
                values = _lookup(columns, feature, n, arrow=True)
                cat_parts.append(self._encode_lists(feature, values, n))
            else:
                values = _lookup(columns, feature, n)
                cat_parts.append(self._indices(feature, values).reshape(n, 1))
        cat = np.concatenate(cat_parts, axis=1) if cat_parts else np.zeros((n, 0), np.int64)
        return dense, cat

    def _indices(self, feature: FeatureSpec, values: Sequence[Any]) -> np.ndarray:
        """Indices of single values: the vocabulary's (OOV for the rest), else hash buckets."""
        if not feature.vocab:
            return hash_bucket(values, feature.buckets)
        import pandas as pd

        # Serving encodes each request through one encoder: build each lookup index once.
        cached = self._indexes.get(feature.column)
        if cached is None or cached[0] is not feature.vocab:
            cached = self._indexes[feature.column] = (
                feature.vocab,
                pd.Index(feature.vocab, dtype=object),
            )
        index = cached[1]
        array, nulls = category_text(values)
        positions = index.get_indexer(array).astype(np.int64)
        out = np.where(positions >= 0, positions + 1, feature.oov_index)
        out[nulls] = 0
        return out

    def _encode_lists(self, feature: FeatureSpec, values: Any, n: int) -> np.ndarray:
        """``[n, slots]``: each row's first ``slots`` items' indices, then 0 (padding)."""
        slots = feature.slots
        out = np.zeros((n, slots), dtype=np.int64)
        if _is_arrow_list(values):
            # A dataset column: slice and flatten in Arrow, no Python object per row.
            import pyarrow.compute as pc

            sliced = pc.list_slice(values, 0, slots)
            lengths = np.asarray(
                pc.fill_null(pc.list_value_length(sliced), 0).to_numpy(zero_copy_only=False),
                dtype=np.int64,
            )
            flat = pc.list_flatten(sliced).cast("string").to_numpy(zero_copy_only=False)
        else:
            rows = [_list_items(v)[:slots] for v in values]
            lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=n)
            flat = [item for r in rows for item in r]
        if len(flat):
            starts = np.cumsum(lengths) - lengths
            row_of = np.repeat(np.arange(n), lengths)
            slot_of = np.arange(len(flat)) - np.repeat(starts, lengths)
            out[row_of, slot_of] = self._indices(feature, flat)
        return out


def _is_arrow_list(values: Any) -> bool:
    """An Arrow list column of strings or integers (what the Arrow path reads as
    ``category_text`` would: an integer's text is its digits)."""
    import pyarrow as pa

    if not isinstance(values, pa.Array | pa.ChunkedArray):
        return False
    kind = values.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return False
    item = kind.value_type
    return pa.types.is_string(item) or pa.types.is_large_string(item) or pa.types.is_integer(item)


def numeric_values(values: Sequence[Any], transform: str = "") -> np.ndarray:
    """Raw numeric values as float64 (null: NaN; a bool: 0/1), through ``transform``."""
    # NumPy reads None as NaN and a bool as 0/1 when it converts to float64.
    arr = np.asarray(values, dtype=np.float64)
    if transform == LOG_TRANSFORM:
        arr = np.log1p(np.maximum(arr, 0.0))
    return arr


def _lookup(
    columns: Mapping[str, Sequence[Any]], feature: FeatureSpec, n: int, *, arrow: bool = False
) -> Sequence[Any]:
    """A feature's ``n`` raw values, by column or by ref; Arrow columns become Python lists
    unless ``arrow`` (a list feature's Arrow column is encoded in Arrow)."""
    if feature.column in columns:
        values = columns[feature.column]
    elif feature.ref in columns:
        values = columns[feature.ref]
    else:
        return [None] * n
    if arrow and _is_arrow_list(values):
        return values
    if hasattr(values, "to_pylist"):
        values = values.to_pylist()
    return values


# Template registry: name -> builder(spec) -> torch.nn.Module whose forward(dense, cat) gives
# logits of shape [n]. Templates register themselves in ``training.templates``.
TEMPLATES: dict[str, Callable[[BundleSpec], Any]] = {}
# The built-in templates' own param schemas (``training.params.Param`` by name); a template
# registered without one (an entry point's user code) takes free-form params.
TEMPLATE_PARAMS: dict[str, Mapping[str, Any]] = {}
# Templates whose model is not a torch module (gradient-boosted trees): name -> the bundle's
# model file. Such a model has ``save(path)`` and ``load(path)`` (its own text format, never a
# pickle) and is trained by ``training.gbdt``, not the torch loop.
MODEL_FILES: dict[str, str] = {}


def register_template(
    name: str, *, params: Mapping[str, Any] | None = None, model_file: str = ""
) -> Callable:
    def decorate(builder: Callable[[BundleSpec], Any]) -> Callable[[BundleSpec], Any]:
        TEMPLATES[name] = builder
        if params is not None:
            TEMPLATE_PARAMS[name] = params
        if model_file:
            MODEL_FILES[name] = model_file
        return builder

    return decorate


def declare_template(
    name: str, *, params: Mapping[str, Any], builder: str, model_file: str = ""
) -> None:
    """Register a template by the path of its builder, ``"module:function"``, imported on its
    first build: the params (the API's and the forms' schema) are known without importing the
    module, so a built-in network's torch loads only where a model is built
    (``training.templates.schemas``)."""
    module_name, _, attr = builder.partition(":")

    def build(spec: BundleSpec) -> Any:
        return getattr(importlib.import_module(module_name), attr)(spec)

    build.__qualname__ = build.__name__ = f"build_{name}"
    register_template(name, params=params, model_file=model_file)(build)


def model_file(template: str) -> str:
    """The file that holds a ``template`` bundle's model: ``weights.pt`` (a torch state dict)
    unless the template registered its own."""
    import training.templates  # noqa: F401  (registers the built-in templates)

    return MODEL_FILES.get(template, WEIGHTS_FILE)


# The model files of the language-model templates (trained by ``training.lm``): the LoRA
# adapter ``lm_lora`` saves, and the whole model ``lm_full`` saves (one safetensors file).
LM_ADAPTER_FILE = "adapter_model.safetensors"
LM_FULL_MODEL_FILE = "model.safetensors"
LM_MODEL_FILES = frozenset({LM_ADAPTER_FILE, LM_FULL_MODEL_FILE})


def template_kind(template: str) -> str:
    """``"gbdt"`` for a template trained by ``training.gbdt`` (its own model file), ``"lm"``
    for a language model (``training.lm``: a LoRA adapter or a whole model), else ``"torch"``
    (the built-in neural templates and user entry points)."""
    name = model_file(template)
    if name in LM_MODEL_FILES:
        return "lm"
    return "torch" if name == WEIGHTS_FILE else "gbdt"


def is_language_model(template: str) -> bool:
    """Whether ``template`` makes a language model (``training.lm``), not a ranking bundle:
    the one answer the training agent, the registry's load check and the ranking gates use."""
    return template_kind(template) == "lm"


# What a language-model bundle keeps beside its model file: an adapter's config (required: PEFT
# loads nothing without it), or a whole model's config (required) and generation config (when
# saved), and the tokenizer's files, whichever of them the tokenizer saved.
LM_ADAPTER_CONFIG = "adapter_config.json"
LM_MODEL_CONFIG = "config.json"
LM_GENERATION_CONFIG = "generation_config.json"
LM_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def bundle_files(directory: str | os.PathLike) -> tuple[str, ...]:
    """The files of the bundle in ``directory``: the spec and the model file its template uses
    (read from ``spec.json``; ``ValueError`` when that is not a bundle spec), and for a
    language model its config (a LoRA adapter's, or a whole model's and its generation config
    when present) and the tokenizer files present."""
    spec = json.loads((Path(directory) / SPEC_FILE).read_text())
    if not isinstance(spec, dict) or not isinstance(spec.get("template"), str):
        raise ValueError("spec.json names no template")
    name = model_file(spec["template"])
    files = (SPEC_FILE, name)
    if not is_language_model(spec["template"]):
        return files
    if name == LM_ADAPTER_FILE:
        configs: tuple[str, ...] = (LM_ADAPTER_CONFIG,)
    else:
        configs = (LM_MODEL_CONFIG,)
        if (Path(directory) / LM_GENERATION_CONFIG).is_file():
            configs += (LM_GENERATION_CONFIG,)
    present = tuple(name for name in LM_TOKENIZER_FILES if (Path(directory) / name).is_file())
    return (*files, *configs, *present)


def check_adapter(directory: Path) -> None:
    """A LoRA adapter folder as ``training.lm`` saves it: a LoRA ``adapter_config.json`` and a
    safetensors file of LoRA tensors, both read without the base model (which may be large);
    ``ValueError`` naming what is wrong."""
    from safetensors import SafetensorError, safe_open

    try:
        config = json.loads((directory / LM_ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{LM_ADAPTER_CONFIG} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise ValueError(f"{LM_ADAPTER_CONFIG} is not a LoRA adapter's config")
    try:
        with safe_open(str(directory / LM_ADAPTER_FILE), framework="pt") as tensors:
            names = list(tensors.keys())
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{LM_ADAPTER_FILE} is not a safetensors file: {exc}") from exc
    if not names or not all("lora_" in name for name in names):
        raise ValueError(f"{LM_ADAPTER_FILE} holds no LoRA tensors")


# The tensor types a saved causal language model's weights may have.
_WEIGHT_DTYPES = frozenset({"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2"})


def check_full_model(directory: Path) -> None:
    """A whole causal language model's folder as ``training.lm`` saves it (``lm_full``): a
    ``config.json`` naming its model type and one safetensors file of floating-point weights,
    checked from the config and the safetensors header (names, types and shapes) without
    reading the weights (which may be large); ``ValueError`` naming what is wrong."""
    from safetensors import SafetensorError, safe_open

    try:
        config = json.loads((directory / LM_MODEL_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{LM_MODEL_CONFIG} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{LM_MODEL_CONFIG} is not a model's config (no model_type)")
    try:
        with safe_open(str(directory / LM_FULL_MODEL_FILE), framework="pt") as tensors:
            names = list(tensors.keys())
            dtypes = {tensors.get_slice(name).get_dtype() for name in names}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{LM_FULL_MODEL_FILE} is not a safetensors file: {exc}") from exc
    if not names:
        raise ValueError(f"{LM_FULL_MODEL_FILE} holds no tensors")
    if any("lora_" in name for name in names):
        raise ValueError(f"{LM_FULL_MODEL_FILE} holds LoRA tensors, not a whole model")
    if not dtypes & _WEIGHT_DTYPES:
        raise ValueError(f"{LM_FULL_MODEL_FILE} holds no floating-point weights")


def check_language_model(directory: Path, template: str) -> None:
    """The check of a language-model ``template``'s folder that reads no weights: a LoRA
    adapter's (``check_adapter``) or a whole model's (``check_full_model``)."""
    if model_file(template) == LM_ADAPTER_FILE:
        check_adapter(directory)
    else:
        check_full_model(directory)


def averaged_members(template: str, params: Mapping[str, Any]) -> int:
    """How many models a ``template`` run with ``params`` averages: its ``cv_folds`` (2 or more)
    or its ``members`` where the template has the param, else 1 (so for one fold's model,
    ``cv_fold`` set, which is a run of its own)."""
    import training.templates  # noqa: F401  (registers the built-in templates)

    if "cv_fold" in params:
        return 1
    schema = TEMPLATE_PARAMS.get(template, {})
    folds = int(params.get("cv_folds", 0) or 0) if "cv_folds" in schema else 0
    if folds >= 2:
        return folds
    return max(1, int(params.get("members", 1) or 1)) if "members" in schema else 1


def build_model(spec: BundleSpec):
    import training.templates  # noqa: F401  (registers the built-in templates)

    try:
        builder = TEMPLATES[spec.template]
    except KeyError:
        raise ValueError(f"unknown template {spec.template!r}") from None
    members = averaged_members(spec.template, spec.hparams)
    # A template with its own model file (lightgbm) saves an average as one model of its own.
    if members > 1 and model_file(spec.template) == WEIGHTS_FILE:
        from training.templates.inputs import Averaged

        # Built one after another from the generator the caller seeded: distinct, reproducible.
        return Averaged([builder(spec) for _ in range(members)])
    return builder(spec)


@dataclass
class Bundle:
    model: Any  # torch.nn.Module in eval mode, or a template's own (``LightGBMModel``)
    spec: BundleSpec
    encoder: FeatureEncoder
    device: str = "cpu"  # where a torch model's weights live (``to``)

    def to(self, device: str) -> str:
        """Move a torch model's weights to ``device`` ("cuda" when the machine has a GPU, else
        it stays on the CPU); the device it is on now."""
        import torch

        on_gpu = device == "cuda" and torch.cuda.is_available()
        if on_gpu and isinstance(self.model, torch.nn.Module):
            self.model.to("cuda")
            self.device = "cuda"
        return self.device

    def predict(self, columns: Mapping[str, Sequence[Any]], n: int) -> np.ndarray:
        """Click probabilities for ``n`` rows of raw feature values."""
        import torch

        dense, cat = self.encoder.encode(columns, n)
        with torch.inference_mode():
            logits = self.model(
                torch.from_numpy(dense).to(self.device), torch.from_numpy(cat).to(self.device)
            )
        return apply_calibration(logits.float().cpu().numpy(), self.spec.extra.get("calibration"))


def save_bundle(directory: str | os.PathLike, model, spec: BundleSpec) -> Path:
    """Write the bundle atomically: into a sibling temp dir, then rename into place."""
    import torch

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (tmp / SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=1, sort_keys=True))
        name = model_file(spec.template)
        if name == WEIGHTS_FILE:
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            torch.save(state, tmp / WEIGHTS_FILE)
        else:
            model.save(tmp / name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_bundle(directory: str | os.PathLike) -> Bundle:
    """Load a bundle the platform wrote: the spec as JSON, the weights as tensors only (or
    the template's own text model file)."""
    import torch

    path = Path(directory)
    spec = BundleSpec.from_json(json.loads((path / SPEC_FILE).read_text()))
    model = build_model(spec)
    name = model_file(spec.template)
    if name == WEIGHTS_FILE:
        state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    else:
        model.load(path / name)
    model.eval()
    return Bundle(model=model, spec=spec, encoder=FeatureEncoder(spec))
