"""The ``lm_lora`` template: LoRA fine-tuning of a local causal language model on a record set
(``training.lm``), as an ordinary job: the API's checks, the scheduler, a real node agent and
its sandboxed child, checkpoints and an exact resume, lineage and MLflow tracking."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from curation.services import record_set_upload
from training import agent, bundle, lm, runner
from training.data import JobSpec
from training.models import JobMetric, JobState, TrainingJob
from training.tests.factories import make_demo_dataset
from training.tests.workers import node_worker, wait_for
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

OBJECTS = {
    "apple": "red",
    "sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "sun": "yellow",
    "blood": "red",
    "ocean": "blue",
    "lemon": "yellow",
    "plum": "purple",
}
PROMPT_WORDS = ["###", "Instruction:", "Input:", "Response:", "<|user|>", "<|assistant|>"]
# Adapt attention and the MLPs of the tiny GPT-2, fast on one CPU thread.
FAST_LM = {
    "epochs": 3,
    "batch_size": 16,
    "micro_batch_size": 8,
    "lr": 0.01,
    "threads": 1,
    "log_every_steps": 5,
    "checkpoint_every_steps": 10,
    "target_modules": "c_attn,c_proj,c_fc",
    "max_length": 64,
}


def instruction_rows(n: int = 200, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        thing = rng.choice(sorted(OBJECTS))
        rows.append(
            {
                "instruction": f"what color is the {thing} ?",
                "input": "",
                "output": f"the {thing} is {OBJECTS[thing]} .",
            }
        )
    return rows


def save_tiny_model(folder: Path, rows: list[dict[str, str]]) -> Path:
    """A 2-layer GPT-2 (random weights) and a word-level tokenizer of the rows' words, built
    offline and saved with ``save_pretrained``: a base model folder in Hugging Face format."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = sorted({w for row in rows for text in row.values() for w in text.split()})
    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "<eos>", *PROMPT_WORDS, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=128,
        vocab_size=len(vocab),
        bos_token_id=2,
        eos_token_id=2,
        pad_token_id=1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture
def lm_root(settings, tmp_path):
    """Artifacts and the allowed base model folder under ``tmp_path``, a tiny model in it."""
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.TRAINING_BASE_MODEL_ROOTS = [tmp_path / "base_models"]
    return save_tiny_model(tmp_path / "base_models" / "tiny-gpt2", instruction_rows())


def _jobs_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/training-jobs/"


def run_lm_job(workspace, client_for, lm_root, *, template: str, params: dict, prefix: str):
    """A ``template`` job on the colours record set, created through the API by a developer and
    run to its end by the scheduler and a node agent (``prefix`` names the node); it must
    succeed (the agent's log says why when it did not)."""
    record_set = record_set_upload(
        actor=None, workspace=workspace, name="colors", content=jsonl(instruction_rows()),
        fmt="jsonl",
    )  # fmt: skip
    client = client_for(make_member(workspace, Role.DEVELOPER))
    body = {
        "name": f"colors-{template.removeprefix('lm_')}",
        "template": template,
        "record_set": record_set.pk,
        "params": {**params, "base_model_path": str(lm_root)},
    }
    response = client.post(_jobs_url(workspace), body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["record_set"] == record_set.pk and response.json()["dataset"] is None
    job = TrainingJob.objects.for_workspace(workspace).get(pk=response.json()["id"])
    with node_worker(prefix):
        wait_for(
            lambda: TrainingJob.objects.unscoped().get(pk=job.pk).is_terminal,
            timeout=180,
            what=f"the {template} job",
            tick=True,  # the scheduler admits, places and dispatches it to the node's agent
        )
    job.refresh_from_db()
    log = (Path(lm_root).parents[1] / "artifacts").rglob(agent.LOG_FILE)
    assert job.state == JobState.SUCCEEDED, (job.state_reason, [p.read_text() for p in log])
    return job


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_an_lm_lora_job_fine_tunes_on_a_record_set_through_the_scheduler_and_an_agent(
    workspace, client_for, client, lm_root
):
    job = run_lm_job(
        workspace, client_for, lm_root, template="lm_lora", params=FAST_LM, prefix="lm"
    )
    holdout, base = job.metrics["holdout"], job.metrics["base_holdout"]
    assert holdout["rows"] == base["rows"] == 40
    # Fine-tuning helped: the held-out perplexity is well below the base model's.
    assert holdout["perplexity"] < 0.8 * job.metrics["base_perplexity"], job.metrics
    assert job.metrics["perplexity_delta"] < 0
    # Throughput in tokens: every step's rows, prompt and response, padding aside.
    assert job.metrics["train_tokens"] > 30 * 16 * 10  # 30 steps of 16 rows, over 10 tokens each
    assert job.metrics["train_tokens_per_s"] == pytest.approx(
        job.metrics["train_samples_per_s"] * job.metrics["train_tokens"] / (30 * 16), rel=1e-6
    )
    model_dir = agent.artifact_path(job.model_path)
    assert {"adapter_config.json", "adapter_model.safetensors", "spec.json"} <= {
        p.name for p in model_dir.iterdir()
    }
    config = json.loads((model_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(lm_root)
    names = set(JobMetric.objects.for_workspace(workspace).filter(job=job).values_list("name"))
    assert {("loss",), ("eval_loss",), ("perplexity",), ("base_eval_loss",)} <= names

    # The adapter loads on the base model and scores as the job reported.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lm_root, local_files_only=True), model_dir
    )
    rows = instruction_rows()
    _, held = lm.split_rows(len(rows), 0.2)
    examples = lm.encode(tokenizer, [rows[i] for i in held], 64)
    again = lm.evaluate(tuned, examples, pad_id=tokenizer.pad_token_id, device="cpu", rows=8)
    assert again["perplexity"] == pytest.approx(holdout["perplexity"], rel=1e-4)

    # The job's page and its API row show it like any job.
    client.force_login(make_member(workspace, Role.VIEWER))
    page = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/")
    assert page.status_code == 200 and "colors-lora" in page.content.decode()
    row = client_for(make_member(workspace, Role.VIEWER)).get(f"{_jobs_url(workspace)}{job.pk}/")
    assert row.status_code == 200 and row.json()["record_set"] == job.record_set_id

    # Lineage: the record set is the job's input.
    for verb in ("training.job.created", "training.job.succeeded"):
        event = Event.objects.for_workspace(workspace).get(verb=verb)
        inputs = set(event.refs.filter(role="input").values_list("kind", "object_id"))
        assert inputs == {("record_set", str(job.record_set_id))}, (verb, inputs)


def _spec(record_file: Path, base: Path, work: Path, **params) -> JobSpec:
    return JobSpec(
        job_id=1,
        template="lm_lora",
        dataset_path=str(record_file),
        features=[],
        work_dir=str(work),
        label="",
        params={**FAST_LM, "base_model_path": str(base), **params},
    )


def _adapter(work: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(work / "model" / "adapter_model.safetensors"))


def test_a_stopped_run_resumes_from_its_checkpoint_to_the_same_adapter(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = instruction_rows(120, seed=1)
    base = save_tiny_model(tmp_path / "base", rows)
    record_file = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows), record_file)
    params = {"lora_dropout": 0.1, "epochs": 2, "batch_size": 8, "checkpoint_every_steps": 4}

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

    second: list[dict] = []
    assert runner.train(cut, emit=runner.Emitter(sink=second.append)) == 0
    assert {"type": "log", "message": f"resumed from checkpoint at step {stopped_at}"} in second
    done = next(e for e in second if e["type"] == "done")
    assert done["step"] == done_ref["step"] == 24  # 96 training rows / 8 a step, 2 epochs
    ours, theirs = _adapter(tmp_path / "cut"), _adapter(tmp_path / "whole")
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
    assert done["metrics"]["holdout"]["eval_loss"] == pytest.approx(
        done_ref["metrics"]["holdout"]["eval_loss"], rel=1e-5
    )
    assert done["metrics"]["base_perplexity"] == done_ref["metrics"]["base_perplexity"]


def test_chat_rows_train_on_the_assistant_messages_only(tmp_path):
    from transformers import AutoTokenizer

    rows = instruction_rows(4)
    base = save_tiny_model(tmp_path / "base", rows)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    chat = {
        "messages": [
            {"role": "user", "content": "what color is the sky ?"},
            {"role": "assistant", "content": "the sky is blue ."},
        ]
    }
    [(ids, labels)] = lm.encode(tokenizer, [chat], 64)
    counted = [t for t in labels if t != lm.IGNORE_INDEX]
    expected = tokenizer("the sky is blue .", add_special_tokens=False)["input_ids"]
    # the assistant's words (its newline is no token here) and the end-of-sequence token
    assert counted == [*expected, tokenizer.eos_token_id] and len(ids) == len(labels)


@pytest.mark.django_db
def test_an_lm_lora_job_is_checked_for_its_record_set_and_base_model(
    workspace, other_workspace, client_for, lm_root, tmp_path
):
    client = client_for(make_member(workspace, Role.DEVELOPER))
    rows = jsonl(instruction_rows(20))
    record_set = record_set_upload(
        actor=None, workspace=workspace, name="colors", content=rows, fmt="jsonl"
    )
    theirs = record_set_upload(
        actor=None, workspace=other_workspace, name="colors", content=rows, fmt="jsonl"
    )
    dataset = make_demo_dataset(workspace, scale=0.01)
    params = {"base_model_path": str(lm_root)}

    def submit(**fields):
        body = {"name": "lora", "template": "lm_lora", "params": params, **fields}
        return client.post(_jobs_url(workspace), body, format="json")

    missing = submit()
    assert missing.status_code == 400 and missing.json()["attr"] == "record_set", missing.content
    for ref in (theirs.pk, 999_999):
        unknown = submit(record_set=ref)
        assert unknown.status_code == 404 and unknown.json()["attr"] == "record_set"
    with_dataset = submit(record_set=record_set.pk, dataset=dataset.pk)
    assert with_dataset.status_code == 400 and with_dataset.json()["attr"] == "dataset"
    outside = submit(record_set=record_set.pk, params={"base_model_path": str(tmp_path)})
    assert outside.status_code == 400
    assert outside.json()["attr"] == "params.base_model_path"
    no_base = submit(record_set=record_set.pk, params={})
    assert no_base.status_code == 400 and no_base.json()["attr"] == "params.base_model_path"
    tabular = client.post(
        _jobs_url(workspace),
        {"name": "lr", "template": "logreg", "record_set": record_set.pk},
        format="json",
    )
    assert tabular.status_code == 400
    assert "record_set" in {e["attr"] for e in tabular.json().get("errors", [tabular.json()])}
    assert submit(record_set=record_set.pk).status_code == 201


@pytest.mark.django_db
def test_an_adapter_registers_with_its_tokenizer_and_a_broken_one_is_refused(
    workspace, settings, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from serving.models import ModelVersion
    from serving.registry import model_version_register
    from workspaces.exceptions import ValidationError

    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    rows = instruction_rows(40, seed=2)
    base = save_tiny_model(tmp_path / "base", rows)
    record_file = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows), record_file)
    work = Path(settings.ARTIFACT_ROOT) / "jobs" / "1"
    spec = _spec(record_file, base, work, max_steps=2)
    assert runner.train(spec, emit=runner.Emitter(sink=lambda event: None)) == 0
    folder = work / "model"
    bundle.check_adapter(folder)

    version = model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    names = {f["name"] for f in version.artifacts}
    assert {"spec.json", "adapter_model.safetensors", "adapter_config.json"} <= names
    assert {"tokenizer_config.json"} <= names
    copied = Path(settings.ARTIFACT_ROOT) / version.artifact_path
    bundle.check_adapter(copied)  # the registered copy is a whole adapter

    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(ValidationError, match="LoRA adapter's config"):
        model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"not tensors")
    with pytest.raises(ValidationError, match="not a safetensors file"):
        model_version_register(actor=None, workspace=workspace, name="lm", bundle_path=folder)
    # nothing half-written: one version, and its folder only
    assert ModelVersion.objects.for_workspace(workspace).count() == 1
    assert sorted(p.name for p in copied.parent.iterdir()) == [str(version.version)]
    # the ranking gates do not apply: they say so instead of failing on a missing weights.pt
    from serving.gates import version_gates_run

    gated = version_gates_run(actor=None, workspace=workspace, version=version)
    assert {g["detail"].split(":")[0] for g in gated.gates.values()} == {"not applicable"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_a_sigkilled_lm_lora_child_is_requeued_and_resumes_to_the_same_adapter(
    workspace, lm_root, tmp_path
):
    """The node agent's child killed mid-run: the job goes back to the queue and its next run
    resumes from the last checkpoint to the adapter an uninterrupted run makes."""
    import os
    import signal

    from training.services import job_create, job_work_dir
    from training.tests.factories import make_node, place
    from training.tests.workers import execute_in_thread

    record_set = record_set_upload(
        actor=None, workspace=workspace, name="colors", content=jsonl(instruction_rows()),
        fmt="jsonl",
    )  # fmt: skip
    params = {
        **FAST_LM,
        "base_model_path": str(lm_root),
        "epochs": 2,
        "batch_size": 8,
        "lora_dropout": 0.1,
        "checkpoint_every_steps": 4,
        "step_sleep_s": 0.1,
    }
    job = job_create(
        actor=None, workspace=workspace, name="lora", dataset=None, template="lm_lora",
        record_set=record_set, params=params,
    )  # fmt: skip
    reference = agent.build_job_spec(job)
    reference.work_dir = str(tmp_path / "reference")
    reference.params = {**reference.params, "step_sleep_s": 0}
    assert runner.train(reference, emit=runner.Emitter(sink=lambda event: None)) == 0

    node = make_node()
    place(job, node)
    thread, result = execute_in_thread(job.pk)
    wait_for(
        lambda: TrainingJob.objects.unscoped().get(pk=job.pk).checkpoint_step >= 8,
        timeout=120,
        what="a checkpoint",
    )
    os.kill(int((job_work_dir(job) / agent.PID_FILE).read_text()), signal.SIGKILL)
    thread.join(60)
    assert result["state"] == JobState.PENDING
    job.refresh_from_db()
    killed_at = job.checkpoint_step
    assert job.attempts == 1 and 8 <= killed_at < job.total_steps == 40

    place(job, node)
    assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    job.refresh_from_db()
    log = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert f"resumed from checkpoint at step {killed_at}" in log
    assert job.attempts == 2 and job.step == 40
    ours = _adapter(agent.artifact_path(job.model_path).parent)
    theirs = _adapter(tmp_path / "reference")
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name
