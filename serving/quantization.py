"""Quantised variants (X5): a model version compiled to int8 becomes a version of its own.

- A ranking model whose model is a torch module (the built-in neural templates, an imported
  ``mlp``) is exported to ONNX (``torch.onnx.export``, the encoder's ``dense`` and ``cat``
  inputs, any batch size) and quantised by ONNX Runtime's dynamic int8
  (``quantize_dynamic``: int8 weights, activations quantised per call). The variant's bundle is
  the same spec (features, encoder, calibration) with template ``onnx-int8`` and the quantised
  graph (``serving.flavors.OnnxRankerModel`` runs it).
- A language model (``lm_lora``, ``lm_full``) keeps its files; its spec says
  ``extra.quantization.method = "torch_dynamic_int8"`` and ``serving.lm_inference`` applies
  ``torch.ao.quantization.quantize_dynamic`` to its ``Linear`` layers when it loads it (a LoRA
  adapter is merged into its base first). Dynamic int8 is computed from the float weights, so
  quantising at load gives the same model every time; the float files stay loadable elsewhere.

The variant is registered like any version (``model_version_register``: the same job and
dataset, so its lineage runs through its source; an event names the source as input). Its
release gates are the ranking gates plus ``quantization``: the variant against its source on
the same held-out rows of the source's job (AUC and log loss for a ranker, perplexity for a
language model) within the workspace's ``quantization_gate`` policy, with both models' speed
measured beside each other (the performance gate's ``source`` figures for a ranker, tokens per
second for a language model).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from django.db import transaction

from serving import artifacts
from serving.models import GateStatus, ModelVersion, VersionSource
from workspaces.events import Actor, Ref, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace

ONNX_INT8 = "onnx_dynamic_int8"
TORCH_INT8 = "torch_dynamic_int8"
METHODS = (ONNX_INT8, TORCH_INT8)
# The bound on what int8 may cost a ranker (AUC), the same for log loss, and for a
# language model a relative perplexity rise (the quantization bench's tiny LM moved by under 1%).
DEFAULT_POLICY = {"max_auc_drop": 0.001, "max_logloss_rise": 0.001, "max_perplexity_rise": 0.02}


def quantization_of(version: ModelVersion) -> dict[str, Any]:
    """What the variant records of its quantisation (empty for a version that is not one)."""
    extra = (version.spec or {}).get("extra") or {}
    value = extra.get("quantization") if isinstance(extra, dict) else None
    return value if isinstance(value, dict) else {}


def is_quantized(version: ModelVersion) -> bool:
    return version.source == VersionSource.QUANTIZED and bool(quantization_of(version))


def quantization_policy(workspace: Workspace) -> dict[str, float]:
    from serving.quality import workspace_policy

    return workspace_policy(workspace, "quantization_gate", DEFAULT_POLICY)


def method_for(version: ModelVersion) -> str:
    """The int8 method a version takes, or 409 naming why it takes none."""
    from serving.flavors import TEMPLATE_ONNX_INT8
    from training.bundle import is_language_model, template_kind

    template = str((version.spec or {}).get("template") or "")
    if version.source == VersionSource.QUANTIZED or template == TEMPLATE_ONNX_INT8:
        raise ConflictError(f"{version} is already a quantised variant", attr="version")
    if is_language_model(template):
        return TORCH_INT8
    if template_kind(template) == "torch":
        return ONNX_INT8
    raise ConflictError(
        f"{version} ({template or 'no template'}) is not a torch model: int8 quantisation "
        "takes a neural ranking template (logreg, fine_ranking, deepfm, two_tower, an imported "
        "mlp) or a language model (lm_lora, lm_full)",
        attr="version",
    )


def existing_variant(version: ModelVersion) -> ModelVersion | None:
    return (
        ModelVersion.objects.for_workspace(version.workspace_id)
        .filter(model_id=version.model_id, source=VersionSource.QUANTIZED)
        .filter(spec__extra__quantization__source_version_id=version.pk)
        .order_by("version")
        .first()
    )


def _refuse_a_second_variant(version: ModelVersion) -> None:
    """409 naming the variant ``version`` already has."""
    found = existing_variant(version)
    if found is not None:
        raise ConflictError(
            f"{found} is already the int8 variant of {version}",
            attr="version",
            variant=found.version,
        )


def export_ranker_onnx(bundle: Any, path: Path, *, rows: int = 8) -> Path:
    """Write ``bundle``'s torch model to ``path`` as ONNX: inputs ``dense`` (float32, n x
    dense width) and ``cat`` (int64, n x slots), output ``logit`` (n), n free."""
    import torch

    from serving.model_server import synthetic_columns

    dense, cat = bundle.encoder.encode(synthetic_columns(bundle.spec, rows), rows)
    model = bundle.model.eval()
    with torch.inference_mode():
        torch.onnx.export(
            model,
            (torch.from_numpy(dense), torch.from_numpy(cat)),
            str(path),
            input_names=["dense", "cat"],
            output_names=["logit"],
            dynamic_axes={"dense": {0: "n"}, "cat": {0: "n"}, "logit": {0: "n"}},
            dynamo=False,
        )
    return path


def quantize_onnx(fp32: Path, int8: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantisation of the graph at ``fp32`` into ``int8``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return int8


def _ranker_bundle(version: ModelVersion, folder: Path, record: dict[str, Any]) -> None:
    from serving.flavors import FILES, TEMPLATE_ONNX_INT8
    from serving.registry import load_version

    bundle = load_version(version)
    fp32 = export_ranker_onnx(bundle, folder / "fp32.onnx")
    quantize_onnx(fp32, folder / FILES[TEMPLATE_ONNX_INT8])
    record["fp32_bytes"] = fp32.stat().st_size
    record["int8_bytes"] = (folder / FILES[TEMPLATE_ONNX_INT8]).stat().st_size
    fp32.unlink()
    spec = dict(version.spec)
    spec["hparams"] = {"source_template": spec.get("template", "")}
    spec["template"] = TEMPLATE_ONNX_INT8
    spec["extra"] = {**(spec.get("extra") or {}), "quantization": record}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))


def _language_bundle(version: ModelVersion, folder: Path, record: dict[str, Any]) -> None:
    source = artifacts.resolve_artifact(version.artifact_path, attr="artifact_path")
    for name in artifacts.bundle_files(source):
        shutil.copyfile(source / name, folder / name)
    spec = dict(version.spec)
    spec["extra"] = {**(spec.get("extra") or {}), "quantization": record}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))


def model_version_quantize(
    *, actor: Actor, workspace: Workspace, version: ModelVersion, method: str = ""
) -> ModelVersion:
    """Register ``version``'s int8 variant as the model's next version (201), once: a second
    request answers 409 naming the variant. The variant's release gates run on a worker."""
    from django.core.exceptions import ValidationError

    from serving.gates import version_gates_request
    from serving.registry import model_version_register

    expected = method_for(version)
    if method and method != expected:
        raise ValidationError(
            {"method": f"{version} takes {expected} (allowed values: {', '.join(METHODS)})"}
        )
    _refuse_a_second_variant(version)
    record = {
        "method": expected,
        "source_version": version.version,
        "source_version_id": version.pk,
        "source_template": str((version.spec or {}).get("template") or ""),
    }
    folder = artifacts.resolve_artifact(
        f"{workspace.pk}/models/{version.model.name}/.quantize-{uuid.uuid4().hex}"
    )
    folder.mkdir(parents=True)
    try:
        began = time.perf_counter()
        if expected == ONNX_INT8:
            _ranker_bundle(version, folder, record)
        else:
            _language_bundle(version, folder, record)
        record["seconds"] = round(time.perf_counter() - began, 3)
        spec = json.loads((folder / "spec.json").read_text())
        spec["extra"]["quantization"] = record
        (folder / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))
        with transaction.atomic():
            # One variant per source: the source's row lock orders two requests at once, and
            # the second finds the first's variant.
            ModelVersion.objects.for_workspace(workspace).select_for_update().get(pk=version.pk)
            _refuse_a_second_variant(version)
            variant = model_version_register(
                actor=actor,
                workspace=workspace,
                name=version.model.name,
                job=version.job,
                bundle_path=folder,
                source=VersionSource.QUANTIZED,
                # Its own held-out figures come from its quantization gate, not its source's.
                metrics={},
                evaluation={},
                importance=dict(version.importance or {}),
                dataset=version.dataset,
                description=f"int8 ({expected}) variant of v{version.version}",
            )
            event_record(
                actor=actor,
                workspace=workspace,
                verb="serving.model_version.quantized",
                refs=[Ref.to(version, role="input"), Ref.to(variant, role="output")],
                payload=record,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return version_gates_request(actor=actor, workspace=workspace, version=variant)


def _failed(detail: str, **extra: Any) -> dict[str, Any]:
    return {"status": GateStatus.FAILED, "detail": detail, **extra}


def quantization_check(version: ModelVersion) -> dict[str, Any]:
    """The variant against its source on the same held-out rows, within the policy."""
    record = quantization_of(version)
    source = (
        ModelVersion.objects.for_workspace(version.workspace_id)
        .filter(pk=record.get("source_version_id"))
        .first()
    )
    policy = quantization_policy(version.workspace)
    if source is None:
        return _failed("the source version is gone: nothing to compare with", policy=policy)
    if version.job_id is None:
        return _failed(
            f"{source} has no training job: no held-out rows to compare the two on",
            policy=policy,
        )
    if record.get("method") == TORCH_INT8:
        return _language_check(version, source, policy)
    return _ranker_check(version, source, policy)


def _ranker_check(version: ModelVersion, source: ModelVersion, policy: dict) -> dict[str, Any]:
    from serving.quality import holdout_scores

    variant, base = holdout_scores(version.job, [version.artifact_path, source.artifact_path])
    _keep_holdout(version, variant)
    failures = []
    auc_drop = float(base["auc"]) - float(variant["auc"])
    logloss_rise = float(variant["logloss"]) - float(base["logloss"])
    if auc_drop > policy["max_auc_drop"]:
        failures.append(
            f"held-out AUC {variant['auc']:.4f} is {auc_drop:.4f} below the source's "
            f"{base['auc']:.4f} (allowed {policy['max_auc_drop']:g})"
        )
    if logloss_rise > policy["max_logloss_rise"]:
        failures.append(
            f"held-out log loss {variant['logloss']:.4f} is {logloss_rise:.4f} above the "
            f"source's {base['logloss']:.4f} (allowed {policy['max_logloss_rise']:g})"
        )
    keys = ("auc", "logloss", "rows")
    return {
        "status": GateStatus.FAILED if failures else GateStatus.PASSED,
        "source_version": source.version,
        "variant": {k: variant.get(k) for k in keys},
        "source": {k: base.get(k) for k in keys},
        "auc_drop": auc_drop,
        "logloss_rise": logloss_rise,
        "policy": policy,
        "detail": "; ".join(failures),
    }


def _language_check(version: ModelVersion, source: ModelVersion, policy: dict) -> dict[str, Any]:
    from serving import lm_inference
    from serving.quality import held_out_records

    rows = held_out_records(version.job)
    if not rows:
        return _failed("the source's job held out no records to compare on", policy=policy)
    figures = {}
    for name, which in (("variant", version), ("source", source)):
        lm_inference.load(which)  # loading (and quantising) is not part of the timing
        began = time.perf_counter()
        scored = lm_inference.perplexity(which, rows)
        seconds = time.perf_counter() - began
        figures[name] = {
            "perplexity": scored["perplexity"],
            "eval_loss": scored["eval_loss"],
            "tokens": scored.get("tokens"),
            "tokens_per_s": (scored.get("tokens") or 0) / seconds if seconds > 0 else None,
            "rows": len(rows),
        }
    variant, base = figures["variant"], figures["source"]
    _keep_holdout(version, {k: variant[k] for k in ("perplexity", "eval_loss", "rows")})
    rise = variant["perplexity"] / base["perplexity"] - 1 if base["perplexity"] else 0.0
    ok = rise <= policy["max_perplexity_rise"]
    return {
        "status": GateStatus.PASSED if ok else GateStatus.FAILED,
        "source_version": source.version,
        "variant": variant,
        "source": base,
        "perplexity_rise": rise,
        "policy": policy,
        "detail": ""
        if ok
        else f"held-out perplexity {variant['perplexity']:.4g} is {rise:.1%} above the "
        f"source's {base['perplexity']:.4g} (allowed {policy['max_perplexity_rise']:.0%})",
    }


def _keep_holdout(version: ModelVersion, holdout: dict[str, Any]) -> None:
    """The variant's own held-out figures, shown on its page as a trained version's are."""
    version.metrics = {**(version.metrics or {}), "holdout": holdout}
    ModelVersion.objects.for_workspace(version.workspace_id).filter(pk=version.pk).update(
        metrics=version.metrics
    )
