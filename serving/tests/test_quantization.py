"""Quantised variants (``serving.quantization``): a neural ranker compiled to ONNX and quantised
to int8 by ONNX Runtime, and a language model in torch.ao int8, each registered as a version of
its own and gated like any other (the quantization gate on the same held-out rows, the sandbox
speed beside its source's), released and served through the gateway; the API's and the page's
answers to a second request, a variant of a variant, a bad method and a non-torch model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from serving import quality, registry
from serving.deployments import deployment_create
from serving.gates import version_gates_run
from serving.models import GateStatus, ModelVersion, VersionSource
from serving.quantization import ONNX_INT8, TORCH_INT8, model_version_quantize
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from serving.tests.helpers import predict_body
from training.bundle import load_bundle
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role


def _ranker(scene, actor, *, template: str = "fine_ranking", seed: int = 0) -> ModelVersion:
    spec = dataclasses.replace(make_spec(scene), template=template)
    job = make_job(scene, make_bundle(spec, seed=seed))
    version = registry.model_version_register(
        actor=actor, workspace=scene.workspace, name="ranker", job=job
    )
    return version_gates_run(actor=actor, workspace=scene.workspace, version=version)


@pytest.mark.django_db
def test_a_ranker_int8_variant_is_a_gated_version_that_serves(workspace, members, client_for):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor)
    source = _ranker(scene, actor)
    assert source.gate_status == GateStatus.PASSED, source.gates
    client = client_for(members[Role.DEVELOPER])
    api = f"/api/v1/workspaces/{workspace.slug}/model-versions/"

    response = client.post(f"{api}{source.pk}/quantize/", {}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["version"] == source.version + 1
    assert body["source"] == VersionSource.QUANTIZED
    variant = ModelVersion.objects.for_workspace(workspace).get(pk=body["id"])
    assert variant.spec["template"] == "onnx-int8"
    record = variant.spec["extra"]["quantization"]
    assert record["method"] == ONNX_INT8
    assert record["source_version_id"] == source.pk
    assert 0 < record["int8_bytes"] < record["fp32_bytes"]
    assert variant.job_id == source.job_id and variant.dataset_id == source.dataset_id
    assert variant.features == source.features
    assert {a["name"] for a in variant.artifacts} >= {"spec.json", "model.int8.onnx"}
    assert Event.objects.filter(
        workspace=workspace,
        verb="serving.model_version.quantized",
        refs__kind="model_version",
        refs__object_id=str(source.pk),
    ).exists()

    # The variant scores what its source scores, to int8's precision, through its own runtime.
    fp32 = load_bundle(registry.artifacts.resolve_artifact(source.artifact_path))
    int8 = load_bundle(registry.artifacts.resolve_artifact(variant.artifact_path))
    from serving.model_server import synthetic_columns

    columns = synthetic_columns(fp32.spec, 500, seed=7)
    a, b = fp32.predict(columns, 500), int8.predict(columns, 500)
    assert type(int8.model).__name__ == "OnnxRankerModel"
    # (random weights: larger logits than a trained model's, so int8's error shows more)
    assert 0 < np.mean(np.abs(a - b)) < 0.01
    assert np.corrcoef(a, b)[0, 1] > 0.995

    # Its gates: the ranking gates and the quantization gate, speed beside the source's. The
    # source's random weights make extreme logits, so int8 moves its log loss more than a
    # trained model's: first a policy that cannot be met, then one that can.
    def gated(policy: dict) -> ModelVersion:
        workspace.template = {**(workspace.template or {}), "quantization_gate": policy}
        workspace.save(update_fields=["template"])
        fresh = ModelVersion.objects.for_workspace(workspace).select_related("workspace")
        return version_gates_run(actor=actor, workspace=workspace, version=fresh.get(pk=variant.pk))

    failed = gated({"max_auc_drop": 0, "max_logloss_rise": 0})
    gate = failed.gates["quantization"]
    assert gate["status"] == GateStatus.FAILED
    assert failed.gate_status == GateStatus.FAILED
    assert gate["logloss_rise"] == pytest.approx(
        gate["variant"]["logloss"] - gate["source"]["logloss"]
    )
    assert "above the source's" in gate["detail"]
    refused = client_for(actor).post(
        f"/api/v1/workspaces/{workspace.slug}/deployments/",
        {"name": "main", "version_id": variant.pk},
        format="json",
    )
    assert refused.status_code == 409
    assert refused.json()["attr"] == "quantization"

    variant = gated({"max_auc_drop": 0.01, "max_logloss_rise": 0.05})
    gates = variant.gates
    assert set(gates) == {"consistency", "performance", "quantization"}
    assert gates["consistency"]["status"] == GateStatus.PASSED, gates["consistency"]
    performance = gates["performance"]
    assert performance["source"]["version"] == source.version
    assert performance["source"]["p99_ms"] > 0
    assert performance["speedup_p99"] == pytest.approx(
        performance["source"]["p99_ms"] / performance["p99_ms"]
    )
    gate = gates["quantization"]
    assert gate["status"] == GateStatus.PASSED, gate
    assert gate["variant"]["rows"] == gate["source"]["rows"] > 0
    assert gate["auc_drop"] == pytest.approx(gate["source"]["auc"] - gate["variant"]["auc"])
    assert variant.gate_status == GateStatus.PASSED
    # The variant's page shows its own held-out figures, not its source job's.
    assert variant.metrics["holdout"]["auc"] == gate["variant"]["auc"]
    assert variant.metrics["holdout"]["logloss"] == gate["variant"]["logloss"]

    # Released like any version, it serves through the gateway.
    dep = deployment_create(actor=actor, workspace=workspace, name="main", version=variant)
    assert dep.version_id == variant.pk
    served = client_for(actor).post(
        f"/api/v1/workspaces/{workspace.slug}/predict/",
        predict_body(scene, request_id="q-1"),
        format="json",
    )
    assert served.status_code == 200, served.content
    assert len(served.json()["scores"]) == len(scene.item_ids)

    # The quality gate against production scores the variant's own file, not the job's model.
    other = _ranker(scene, actor, seed=5)
    verdict = quality.version_verdict(source, dep, save=False)
    assert verdict["production_version_id"] == variant.pk
    assert verdict.get("message") != "the same model as production"
    assert verdict["production"]["auc"] == pytest.approx(gate["variant"]["auc"])
    assert other.version == variant.version + 1

    # Once: a second request names the variant; a variant of a variant and a bad method are
    # refused; nothing new is registered by any of them.
    again = client.post(f"{api}{source.pk}/quantize/", {}, format="json")
    assert again.status_code == 409
    assert f"v{variant.version} is already the int8 variant" in again.json()["detail"]
    twice = client.post(f"{api}{variant.pk}/quantize/", {}, format="json")
    assert twice.status_code == 409
    assert "already a quantised variant" in twice.json()["detail"]
    wrong = client.post(f"{api}{source.pk}/quantize/", {"method": "fp4"}, format="json")
    assert wrong.status_code == 400
    assert wrong.json()["attr"] == "method"
    assert ONNX_INT8 in wrong.json()["detail"] and TORCH_INT8 in wrong.json()["detail"]
    mismatch = client.post(f"{api}{other.pk}/quantize/", {"method": TORCH_INT8}, format="json")
    assert mismatch.status_code == 400
    assert mismatch.json()["attr"] == "method"
    assert f"takes {ONNX_INT8}" in mismatch.json()["detail"]
    assert ModelVersion.objects.for_workspace(workspace).count() == 3
    # A viewer may not make one.
    viewer = client_for(members[Role.VIEWER]).post(f"{api}{other.pk}/quantize/", {}, format="json")
    assert viewer.status_code == 403

    # The pages: the variant names its source and shows the gate; the source links its variant.
    page = client_for(actor)
    page.force_login(actor)
    html = page.get(f"/w/{workspace.slug}/models/ranker/v{variant.version}/").content.decode()
    assert 'data-testid="quantization-source"' in html
    assert f"v{source.version}" in html and ONNX_INT8 in html
    assert 'data-testid="quantization-gate"' in html
    assert 'data-testid="performance-source"' in html
    html = page.get(f"/w/{workspace.slug}/models/ranker/v{source.version}/").content.decode()
    assert 'data-testid="quantization-variant"' in html
    html = page.get(f"/w/{workspace.slug}/models/ranker/v{other.version}/").content.decode()
    assert 'data-testid="quantize-form"' in html


@pytest.mark.django_db
def test_the_page_makes_a_variant_and_a_tree_model_is_refused_by_name(
    workspace, members, client_for
):
    actor = members[Role.DEVELOPER]
    scene = make_scene(workspace, actor)
    source = _ranker(scene, actor, template="logreg")
    page = client_for(actor)
    page.force_login(actor)
    url = f"/w/{workspace.slug}/models/ranker/v{source.version}/quantize/"
    response = page.post(url)
    assert response.status_code == 302
    assert response["Location"].endswith(f"/models/ranker/v{source.version + 1}/")
    variant = ModelVersion.objects.for_workspace(workspace).get(version=source.version + 1)
    assert variant.source == VersionSource.QUANTIZED
    # The second press says so on the source's page and registers nothing.
    response = page.post(url, follow=True)
    assert f"v{variant.version} is already the int8 variant" in response.content.decode()
    assert ModelVersion.objects.for_workspace(workspace).count() == 2

    # A model that is not a torch module names the templates that do take int8.
    tree = ModelVersion.objects.for_workspace(workspace).get(pk=source.pk)
    tree.spec = {**tree.spec, "template": "lightgbm"}
    with pytest.raises(ConflictError, match="not a torch model"):
        model_version_quantize(actor=actor, workspace=workspace, version=tree)


@pytest.mark.django_db
def test_a_language_model_int8_variant_is_compared_on_the_jobs_held_out_records(
    workspace, members, settings, tmp_path
):
    from serving import lm_inference
    from serving.tests.test_review import make_lm_versions, upload_prompts
    from training.models import JobState, TrainingJob

    actor = members[Role.MAINTAINER]
    (source,) = make_lm_versions(workspace, settings, tmp_path, name="chat", count=1)
    records = upload_prompts(workspace, actor, name="chat_rows", rows=40)
    job = TrainingJob.objects.create(
        workspace=workspace,
        name="chat_lora",
        template="lm_lora",
        record_set=records,
        state=JobState.SUCCEEDED,
        params={
            "base_model_path": source.spec["extra"]["base_model_path"],
            "holdout_fraction": 0.25,
        },
    )
    ModelVersion.objects.for_workspace(workspace).filter(pk=source.pk).update(job=job)
    source.refresh_from_db()

    variant = model_version_quantize(actor=actor, workspace=workspace, version=source)
    assert variant.source == VersionSource.QUANTIZED
    assert variant.spec["template"] == "lm_lora"
    assert variant.spec["extra"]["quantization"]["method"] == TORCH_INT8
    model, _ = lm_inference.load(variant)
    import torch

    assert any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert lm_inference.generate(variant, ["### Instruction:\nname a colour\n\n### Response:\n"])

    variant = version_gates_run(actor=actor, workspace=workspace, version=variant)
    gate = variant.gates["quantization"]
    assert gate["variant"]["rows"] == gate["source"]["rows"] == 10
    assert gate["variant"]["perplexity"] > 1 and gate["source"]["perplexity"] > 1
    assert gate["perplexity_rise"] == pytest.approx(
        gate["variant"]["perplexity"] / gate["source"]["perplexity"] - 1
    )
    assert gate["status"] == (
        GateStatus.PASSED
        if gate["perplexity_rise"] <= gate["policy"]["max_perplexity_rise"]
        else GateStatus.FAILED
    )
    assert gate["variant"]["tokens_per_s"] > 0 and gate["source"]["tokens_per_s"] > 0
    # The ranking gates do not apply to a language model; they say so rather than run.
    assert "not applicable" in variant.gates["performance"]["detail"]
