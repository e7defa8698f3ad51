"""MLflow models in and out of the registry: a stock-client model becomes a platform bundle, and a
platform version carries an ``MLmodel`` so ``mlflow.pyfunc.load_model`` opens it.

In: ``stage_flavor_bundle`` reads the logged model's ``MLmodel`` (YAML, safe loader), picks the
flavor ``serving.flavors`` loads without pickle, and writes a bundle whose spec declares the
*input mapping*: each input of the model's signature (a column name, or a position of its one
tensor) -> a feature ref ``group:feature`` (looked up online at serving, compared with the
declared dataset's column by the consistency gate) or a plain name (the request's context
supplies it as is). Out: ``write_pyfunc_mlmodel`` next to the bundle files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from serving import flavors
from training.bundle import WEIGHTS_FILE, BundleSpec, FeatureSpec, build_model, save_bundle

MLMODEL = "MLmodel"
PICKLE_FILES = ("model.pkl", "model.pth", "python_model.pkl", "model.cloudpickle")
NUMERIC_DTYPES = ("float", "int", "bool")


def refuse(message: str, attr: str = "source") -> ValidationError:
    return ValidationError({attr: message})


def pickle_refusal(what: str) -> ValidationError:
    return refuse(
        f"{what} is a pickle, which is never loaded; log the model in a safe flavor: "
        f"{flavors.SAFE_FLAVORS_TEXT}"
    )


def read_mlmodel(folder: Path) -> dict[str, Any] | None:
    file = folder / MLMODEL
    if not file.is_file():
        return None
    if file.is_symlink():
        raise refuse("MLmodel is a symlink; refused")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise refuse(f"MLmodel is not valid YAML: {str(exc)[:200]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("flavors"), dict):
        raise refuse("MLmodel names no flavors")
    return data


def signature_inputs(mlmodel: dict[str, Any]) -> tuple[list[str] | None, int | None]:
    """(column names, None) for a column signature, (None, width) for one 2-D tensor, (None,
    None) when the model has no signature."""
    raw = (mlmodel.get("signature") or {}).get("inputs")
    if not raw:
        return None, None
    try:
        inputs = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise refuse("the MLmodel signature is not JSON") from exc
    if inputs and all(i.get("type") == "tensor" for i in inputs):
        shape = (inputs[0].get("tensor-spec") or {}).get("shape") or []
        if len(inputs) != 1 or len(shape) != 2:
            raise refuse("a tensor signature must be one 2-D tensor (rows, inputs)")
        return None, int(shape[1]) if int(shape[1]) > 0 else None
    names = [str(i.get("name") or "") for i in inputs]
    if not all(names):
        raise refuse("the MLmodel signature has unnamed columns")
    return names, None


def choose_flavor(folder: Path, mlmodel: dict[str, Any]) -> tuple[str, Path, dict[str, Any]]:
    """(template, model file, hparams) of the first safe flavor the MLmodel offers; 400 naming
    the safe flavors for a pickle-only model."""
    offered = mlmodel["flavors"]

    def data_file(conf: dict, default: str) -> Path:
        name = str(conf.get("model_data") or conf.get("data") or default)
        file = (folder / name).resolve()
        if folder.resolve() not in file.parents or file.is_symlink() or not file.is_file():
            raise refuse(f"the flavor's model file {name} is missing or outside the model")
        return file

    if "onnx" in offered:
        conf = offered["onnx"]
        return flavors.TEMPLATE_ONNX, data_file(conf, "model.onnx"), {}
    if "sklearn" in offered:
        conf = offered["sklearn"]
        if conf.get("serialization_format") != "skops":
            raise pickle_refusal(
                f"this sklearn model ({conf.get('serialization_format') or 'pickle'} format)"
            )
        return flavors.TEMPLATE_SKLEARN, data_file(conf, "model.skops"), {}
    if "lightgbm" in offered:
        conf = offered["lightgbm"]
        file = data_file(conf, "model.lgb")
        if not str(conf.get("model_class", "")).endswith("Booster") or file.suffix != ".lgb":
            raise pickle_refusal("this LightGBM model (its scikit-learn API is pickled)")
        return flavors.TEMPLATE_LIGHTGBM, file, {}
    if "xgboost" in offered:
        file = data_file(offered["xgboost"], "model.ubj")
        if file.suffix not in flavors.XGBOOST_FORMATS:
            raise refuse(
                f"this XGBoost model is saved as {file.suffix or 'a file with no extension'}; "
                f"log it as {' or '.join(flavors.XGBOOST_FORMATS)} "
                "(mlflow.xgboost.log_model(..., model_format='ubj'))"
            )
        return flavors.TEMPLATE_XGBOOST, file, {}
    if "pytorch" in offered:
        if offered["pytorch"].get("serialization_format") == "pt2":
            raise refuse(
                "a pt2 exported program is not imported; log the state dict "
                "(mlflow.pytorch.log_state_dict) and declare its architecture, or use "
                f"{flavors.SAFE_FLAVORS_TEXT}"
            )
        raise pickle_refusal("the pytorch flavor's model.pth (a whole pickled module)")
    raise pickle_refusal(f"a model in flavor(s) {', '.join(sorted(offered))}")


def input_features(
    *, workspace, inputs: Any, names: list[str] | None, width: int | None, dataset
) -> tuple[list[FeatureSpec], dict[str, str]]:
    """The bundle's features from the declared mapping; 400 naming ``inputs`` or ``dataset``."""
    if names is not None:
        if not isinstance(inputs, dict):
            raise refuse(
                f"map each signature column to a feature ref or a plain name: {', '.join(names)}",
                "inputs",
            )
        missing = [n for n in names if n not in inputs]
        unknown = [k for k in inputs if k not in names]
        if missing or unknown:
            raise refuse(
                (f"unmapped columns {', '.join(missing)}; " if missing else "")
                + (f"not in the signature: {', '.join(unknown)}; " if unknown else "")
                + f"the signature's columns are {', '.join(names)}",
                "inputs",
            )
        pairs = [(n, inputs[n]) for n in names]
    else:
        if not isinstance(inputs, list) or not inputs:
            raise refuse(
                "give the model's inputs in order: a list of feature refs (group:feature) or "
                "plain names",
                "inputs",
            )
        if width is not None and len(inputs) != width:
            raise refuse(f"the model takes {width} inputs, {len(inputs)} given", "inputs")
        pairs = [(str(i), ref) for i, ref in enumerate(inputs)]
    allowed = list(dataset.feature_refs) if dataset is not None else []
    dtypes = _dtypes(workspace, [r for _, r in pairs if isinstance(r, str) and ":" in r])
    features, mapping = [], {}
    for column, ref in pairs:
        if not isinstance(ref, str) or not ref.strip() or len(ref) > 200:
            raise refuse(f"input {column}: give a feature ref (group:feature) or a name", "inputs")
        if ":" in ref:
            if dataset is None:
                raise refuse(
                    "inputs map to features: name the training dataset they come from", "dataset"
                )
            if ref not in allowed:
                raise refuse(
                    f"input {column}: {ref} is not a feature of dataset {dataset}; its features "
                    f"are {', '.join(allowed)}",
                    "inputs",
                )
            if dtypes.get(ref) not in NUMERIC_DTYPES:
                raise refuse(
                    f"input {column}: {ref} is {dtypes.get(ref)}; an imported model takes "
                    f"numeric features ({', '.join(NUMERIC_DTYPES)})",
                    "inputs",
                )
            group, _, name = ref.partition(":")
            feature_column = f"{group.split('@')[0]}__{name}"
        else:
            feature_column = ref
        features.append(FeatureSpec(ref=ref, column=feature_column, dtype="float"))
        mapping[column] = ref
    return features, mapping


def _dtypes(workspace, refs: list[str]) -> dict[str, str]:
    """Each ``group:feature`` ref's dtype in the workspace ('' for an unknown feature)."""
    from features.models import Feature

    def pair(ref: str) -> tuple[str, str]:
        group, _, name = ref.partition(":")
        return group.split("@")[0], name

    found = (
        Feature.objects.for_workspace(workspace)
        .filter(group__name__in={pair(r)[0] for r in refs})
        .select_related("group")
    )
    by_pair = {(f.group.name, f.name): f.dtype for f in found}
    return {ref: by_pair.get(pair(ref), "") for ref in refs}


def stage_flavor_bundle(
    *,
    workspace,
    local: Path,
    staging: Path,
    inputs: Any,
    dataset,
    architecture: dict[str, Any] | None,
    output: str,
) -> BundleSpec:
    """Write the bundle of the model in ``local`` to ``staging``: its MLmodel's safe flavor, or
    a bare state dict (``mlflow.pytorch.log_state_dict``) with the declared architecture."""
    import torch

    if output not in flavors.OUTPUTS:
        raise refuse(f"use one of {', '.join(flavors.OUTPUTS)}", "output")
    mlmodel = read_mlmodel(local)
    state_file = next(
        (local / n for n in ("state_dict.pth", WEIGHTS_FILE) if (local / n).is_file()), None
    )
    if mlmodel is None and state_file is None:
        pickles = [n for n in PICKLE_FILES if any(local.rglob(n))]
        if pickles:
            raise pickle_refusal(pickles[0])
        raise refuse(
            "no MLmodel, spec.json or state dict in the source; log the model in a safe "
            f"flavor: {flavors.SAFE_FLAVORS_TEXT}"
        )
    # The flavor first: a pickle is refused whatever the mapping says.
    chosen = choose_flavor(local, mlmodel) if mlmodel is not None else None
    names, width = signature_inputs(mlmodel) if mlmodel is not None else (None, None)
    features, mapping = input_features(
        workspace=workspace, inputs=inputs, names=names, width=width, dataset=dataset
    )
    extra = {"input_mapping": mapping, "imported_from": "mlflow"}
    if mlmodel is None:  # a state dict: the declared architecture gives the module
        arch = architecture if isinstance(architecture, dict) else {}
        if arch.get("kind") != "mlp":
            raise refuse(
                'a state dict needs its architecture: {"kind": "mlp", "activation": '
                f"one of {', '.join(flavors.ACTIVATIONS)}}}",
                "architecture",
            )
        if (arch.get("activation") or "relu") not in flavors.ACTIVATIONS:
            raise refuse(f"activation: use one of {', '.join(flavors.ACTIVATIONS)}", "architecture")
        if (arch.get("output") or "logit") not in flavors.OUTPUTS:
            raise refuse(f"output: use one of {', '.join(flavors.OUTPUTS)}", "architecture")
        assert state_file is not None
        try:
            state = torch.load(state_file, map_location="cpu", weights_only=True)
            layers = flavors.mlp_layers(state)
        except Exception as exc:
            raise refuse(
                f"state dict refused (tensors only): {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc
        if layers[0] != len(features):
            raise refuse(
                f"the state dict takes {layers[0]} inputs, {len(features)} mapped", "inputs"
            )
        spec = BundleSpec(
            template=flavors.TEMPLATE_MLP,
            features=features,
            hparams={
                "layers": layers,
                "activation": arch.get("activation") or "relu",
                "output": arch.get("output") or "logit",
            },
            extra={**extra, "flavor": "pytorch"},
        )
        model = build_model(spec)
        model.load_state_dict(state)
        save_bundle(staging, model, spec)
        return spec
    assert chosen is not None
    template, file, hparams = chosen
    spec = BundleSpec(
        template=template,
        features=features,
        hparams={**hparams, "output": output},
        extra={**extra, "flavor": template.removeprefix("mlflow-")},
    )
    model = build_model(spec)
    try:
        model.load(file)
        model(torch.zeros((2, len(features)), dtype=torch.float32), torch.zeros((2, 0)))
    except Exception as exc:
        raise refuse(f"model refused: {type(exc).__name__}: {str(exc)[:200]}") from exc
    save_bundle(staging, model, spec)
    return spec


def write_pyfunc_mlmodel(folder: Path, spec: dict[str, Any]) -> None:
    """An ``MLmodel`` beside a version's bundle: the ``python_function`` flavor loads it with
    ``serving.mlflow_pyfunc`` (tensors-only, as the platform does), and ``rankops`` names it."""
    import platform as host

    import mlflow

    flavor_conf = {
        "loader_module": "serving.mlflow_pyfunc",
        "data": ".",
        "python_version": host.python_version(),
    }
    document = {
        "artifact_path": "model",
        "flavors": {
            "python_function": flavor_conf,
            "rankops": {"format": spec.get("format"), "template": spec.get("template")},
        },
        "mlflow_version": mlflow.__version__,
    }  # fmt: skip
    (folder / MLMODEL).write_text(yaml.safe_dump(document, sort_keys=False))


def copy_tree_files(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and not file.is_symlink():
            shutil.copyfile(file, target / file.name)
