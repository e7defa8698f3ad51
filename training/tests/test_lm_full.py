"""The ``lm_full`` template: full fine-tuning (every weight trains) of a local causal language
model on a record set (``training.lm``, the loop ``lm_lora`` runs), as an ordinary job: the
API's checks, the scheduler, a real node agent, an exact resume, and its whole model registered
as a model version that serving loads and generates with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from curation.services import record_set_upload
from training import agent, bundle, lm, runner
from training.data import JobSpec
from training.tests.test_lm_lora import instruction_rows, jsonl, run_lm_job, save_tiny_model
from workspaces.models import Role
from workspaces.testing.factories import make_member

# Every weight of the tiny GPT-2 (random weights: a larger lr than a pretrained model takes),
# fast on one CPU thread.
FAST_FULL = {
    "epochs": 3,
    "batch_size": 16,
    "micro_batch_size": 8,
    "lr": 0.003,
    "threads": 1,
    "log_every_steps": 5,
    "checkpoint_every_steps": 10,
    "max_length": 64,
}


@pytest.fixture
def lm_root(settings, tmp_path):
    """Artifacts and the allowed base model folder under ``tmp_path``, a tiny model in it."""
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.TRAINING_BASE_MODEL_ROOTS = [tmp_path / "base_models"]
    return save_tiny_model(tmp_path / "base_models" / "tiny-gpt2", instruction_rows())


def _jobs_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/training-jobs/"


def _spec(record_file: Path, base: Path, work: Path, **params) -> JobSpec:
    return JobSpec(
        job_id=1,
        template="lm_full",
        dataset_path=str(record_file),
        features=[],
        work_dir=str(work),
        label="",
        params={**FAST_FULL, "base_model_path": str(base), **params},
    )


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / bundle.LM_FULL_MODEL_FILE))


def _record_file(tmp_path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    record_file = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows), record_file)
    return record_file


def test_lm_full_is_a_language_model_template_with_its_own_defaults():
    from training.params import params_defaults, params_schema

    assert bundle.template_kind("lm_full") == "lm" and bundle.is_language_model("lm_full")
    assert bundle.model_file("lm_full") == "model.safetensors"
    schema = params_schema("lm_full", policy=False)
    assert not {"lora_r", "lora_alpha", "lora_dropout", "target_modules"} & set(schema)
    assert {"base_model_path", "gradient_checkpointing", "max_length"} <= set(schema)
    assert params_defaults("lm_full")["lr"] == 5e-5 and params_defaults("lm_lora")["lr"] == 0.01
    assert params_defaults("lm_full")["batch_size"] == 16


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_an_lm_full_job_fine_tunes_through_the_scheduler_and_registers_a_loadable_model(
    workspace, client_for, lm_root
):
    from serving import lm_inference
    from serving.registry import model_version_register

    job = run_lm_job(
        workspace, client_for, lm_root, template="lm_full", params=FAST_FULL, prefix="lmfull"
    )
    assert job.step == job.total_steps == 30  # 160 training rows / 16 a step, 3 epochs
    metrics = job.metrics
    # every weight trained (the output layer is tied to the input embedding: one tensor)
    assert metrics["trainable_params"] == metrics["total_params"]
    assert metrics["dtype"] == "float32" and metrics["autocast"] == ""
    holdout, base = metrics["holdout"], metrics["base_holdout"]
    assert holdout["rows"] == base["rows"] == 40
    assert holdout["perplexity"] < 0.8 * metrics["base_perplexity"], metrics
    model_dir = agent.artifact_path(job.model_path)
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "spec.json", "tokenizer_config.json"} <= names
    assert "adapter_config.json" not in names
    spec = json.loads((model_dir / "spec.json").read_text())
    assert spec["template"] == "lm_full" and spec["extra"]["holdout"] == holdout
    assert spec["hparams"]["lr"] == FAST_FULL["lr"]
    bundle.check_full_model(model_dir)

    # The job's model becomes a model version: the whole model and its tokenizer are copied.
    version = model_version_register(actor=None, workspace=workspace, name="colors", job=job)
    copied = {f["name"] for f in version.artifacts}
    assert {"spec.json", "config.json", "model.safetensors", "tokenizer_config.json"} <= copied
    # Serving loads it on its own (no base model) and scores as the job reported.
    model, _tokenizer = lm_inference.load(version)
    assert type(model).__name__ == "GPT2LMHeadModel"
    rows = instruction_rows()
    again = lm_inference.perplexity(version, [rows[i] for i in lm.split_rows(200, 0.2)[1]])
    assert again["perplexity"] == pytest.approx(holdout["perplexity"], rel=1e-4)
    [text] = lm_inference.generate(version, [lm_inference.prompt_of(rows[0])], max_new_tokens=8)
    assert isinstance(text, str) and text.strip()


def test_a_stopped_lm_full_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path):
    rows = instruction_rows(120, seed=1)
    base = save_tiny_model(tmp_path / "base", rows)
    record_file = _record_file(tmp_path, rows)
    params = {"epochs": 2, "batch_size": 8, "checkpoint_every_steps": 4}

    whole: list[dict] = []
    reference = _spec(record_file, base, tmp_path / "whole", **params)
    assert runner.train(reference, emit=runner.Emitter(sink=whole.append)) == 0

    stop = runner.StopFlag()
    first: list[dict] = []

    def sink(event: dict) -> None:
        first.append(event)
        if event["type"] == "progress" and event["step"] >= 10:
            stop.set()

    cut = _spec(record_file, base, tmp_path / "cut", **params)
    assert runner.train(cut, emit=runner.Emitter(sink=sink), stop=stop) == runner.EXIT_STOPPED
    stopped_at = next(e for e in first if e["type"] == "stopped")["step"]
    done_ref = next(e for e in whole if e["type"] == "done")
    assert 10 <= stopped_at < done_ref["step"]
    assert not (tmp_path / "cut" / "model").exists()  # no model before the run ends

    second: list[dict] = []
    assert runner.train(cut, emit=runner.Emitter(sink=second.append)) == 0
    assert {"type": "log", "message": f"resumed from checkpoint at step {stopped_at}"} in second
    done = next(e for e in second if e["type"] == "done")
    assert done["step"] == done_ref["step"] == 24  # 96 training rows / 8 a step, 2 epochs
    ours, theirs = _weights(tmp_path / "cut" / "model"), _weights(tmp_path / "whole" / "model")
    assert sorted(ours) == sorted(theirs)
    initial = _weights(base)
    changed = [name for name in ours if not torch.equal(ours[name], initial[name])]
    assert len(changed) == len(ours)  # every weight trained
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    assert done["metrics"]["holdout"]["eval_loss"] == pytest.approx(
        done_ref["metrics"]["holdout"]["eval_loss"], rel=1e-5
    )
    assert done["metrics"]["base_perplexity"] == done_ref["metrics"]["base_perplexity"]


@pytest.mark.django_db
def test_an_lm_full_job_refuses_lora_params_and_needs_a_record_set(workspace, client_for, lm_root):
    client = client_for(make_member(workspace, Role.DEVELOPER))
    record_set = record_set_upload(
        actor=None, workspace=workspace, name="colors", content=jsonl(instruction_rows(20)),
        fmt="jsonl",
    )  # fmt: skip

    def submit(params, **fields):
        body = {"name": "full", "template": "lm_full", "params": params, **fields}
        return client.post(_jobs_url(workspace), body, format="json")

    lora = submit({"base_model_path": str(lm_root), "lora_r": 8}, record_set=record_set.pk)
    assert lora.status_code == 400, lora.content
    errors = {e["attr"]: e["detail"] for e in lora.json().get("errors") or [lora.json()]}
    assert list(errors) == ["params.lora_r"] and "Unknown param" in errors["params.lora_r"]
    allowed = errors["params.lora_r"].split("use one of: ")[1].split(", ")
    assert "gradient_checkpointing" in allowed and "lora_alpha" not in allowed
    missing = submit({"base_model_path": str(lm_root)})
    assert missing.status_code == 400 and missing.json()["attr"] == "record_set"
    no_base = submit({}, record_set=record_set.pk)
    assert no_base.status_code == 400 and no_base.json()["attr"] == "params.base_model_path"
    ok = submit(
        {"base_model_path": str(lm_root), "gradient_checkpointing": True}, record_set=record_set.pk
    )
    assert ok.status_code == 201, ok.content

    # the templates API shows lm_full with its own lr default
    row = client.get(f"/api/v1/workspaces/{workspace.slug}/training-templates/lm_full/").json()
    assert row["params"]["lr"]["default"] == 5e-5 and "lora_r" not in row["params"]


@pytest.mark.django_db
def test_a_full_model_registers_with_its_tokenizer_and_a_broken_one_is_refused(
    workspace, settings, tmp_path
):
    from serving.models import ModelVersion
    from serving.registry import model_version_register
    from workspaces.exceptions import ValidationError

    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    rows = instruction_rows(40, seed=2)
    base = save_tiny_model(tmp_path / "base", rows)
    work = Path(settings.ARTIFACT_ROOT) / "jobs" / "1"
    spec = _spec(_record_file(tmp_path, rows), base, work, max_steps=2, gradient_checkpointing=True)
    assert runner.train(spec, emit=runner.Emitter(sink=lambda event: None)) == 0
    folder = work / "model"
    assert bundle.bundle_files(folder)[:3] == ("spec.json", "model.safetensors", "config.json")

    version = model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    names = {f["name"] for f in version.artifacts}
    assert {"spec.json", "model.safetensors", "config.json", "tokenizer_config.json"} <= names
    assert "generation_config.json" in names  # GPT-2 saves one
    bundle.check_full_model(Path(settings.ARTIFACT_ROOT) / version.artifact_path)

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "model_type"})
    )
    with pytest.raises(ValidationError, match="no model_type"):
        model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"not tensors")
    with pytest.raises(ValidationError, match="not a safetensors file"):
        model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValidationError, match=r"bundle has no model\.safetensors"):
        model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    assert ModelVersion.objects.for_workspace(workspace).count() == 1
    # the ranking gates do not apply
    from serving.gates import version_gates_run

    gated = version_gates_run(actor=None, workspace=workspace, version=version)
    assert {g["detail"].split(":")[0] for g in gated.gates.values()} == {"not applicable"}
