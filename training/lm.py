"""The language-model path of the training child (template ``lm_lora``): LoRA fine-tuning of a
local Hugging Face causal language model on a record set (``curation``), with ``peft``.

``runner.train`` hands a job here when its template is a language model
(``bundle.template_kind`` ``"lm"``). The contract is the other loops': the same events
(``start``, ``progress``, ``metric``, ``checkpoint``, ``stopped``, ``done``, ``error``), the same
exit codes and the same checkpoint file, so the agent, the scheduler and MLflow tracking need
not know which kind ran.

- Data: the record set's Parquet file (staged by the agent as the job's ``dataset_path``), one
  example per row: instruction rows (string columns ``instruction``, ``output``, optionally
  ``input``) rendered as an Alpaca-style prompt and response, or chat rows (``messages``: a list
  of ``{role, content}``) rendered one message after another. The loss counts the response's
  tokens only (the assistant's messages in a chat), and an end-of-sequence token after it.
- Split: ``holdout_fraction`` of the rows, drawn by a permutation fixed once for all jobs (not
  by ``seed``, so jobs of different seeds are scored on the same rows), are held out; the
  held-out loss and perplexity are reported for the base model (adapter off) before training
  and for the fine-tuned model after it, and ``eval_loss`` after every epoch (``epoch_eval``).
- The base model is a local folder (``base_model_path``, copied into the sandbox by the agent),
  read with ``local_files_only``: nothing is downloaded. It trains in bf16 on a CUDA device
  that supports it, else in float32; the LoRA weights stay float32.
- Steps: ``batch_size`` rows per optimiser step (AdamW over the LoRA weights), in forward
  passes of ``micro_batch_size`` rows whose gradients are summed (the loss is the mean over the
  step's response tokens); the rows of each step come from ``data.BatchOrder`` (seed, epoch),
  so the position in the data is the step number.
- Checkpoints hold the LoRA weights, the optimiser state, the step, the torch RNG states and the
  base model's held-out figures; a resumed run continues from the same step with the same
  batches and dropout draws, and ends with the adapter an uninterrupted run ends with.
- The model output (``model/``): the adapter (peft's ``save_pretrained``: ``adapter_config.json``
  and ``adapter_model.safetensors``), the base model's tokenizer, and ``spec.json`` (the bundle
  spec: template, hyperparameters, the base model and the held-out figures).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

LM_CHECKPOINT_FORMAT = "rankops-lm-checkpoint/1"
IGNORE_INDEX = -100
# The permutation that picks the held-out rows: one for every job, whatever its seed.
SPLIT_SEED = 0


def build(spec: Any) -> Any:
    """The bundle loader's builder: an ``lm_lora`` model is an adapter for its base model."""
    raise ValueError(
        "an lm_lora model is a LoRA adapter for its base model: load it with peft "
        "(PeftModel.from_pretrained(base, <model folder>)), not as a ranking bundle"
    )


def segments(row: dict[str, Any]) -> list[tuple[str, bool]]:
    """A record's text in pieces, each marked whether the loss counts it (the response)."""
    messages = row.get("messages")
    if messages is not None:
        pieces: list[tuple[str, bool]] = []
        for message in messages or []:
            role = str((message or {}).get("role") or "user")
            content = str((message or {}).get("content") or "")
            pieces.append((f"<|{role}|>\n", False))
            pieces.append((content + "\n", role == "assistant"))
        return pieces
    instruction = str(row.get("instruction") or "")
    given = str(row.get("input") or "")
    prompt = f"### Instruction:\n{instruction}\n\n"
    if given:
        prompt += f"### Input:\n{given}\n\n"
    prompt += "### Response:\n"
    return [(prompt, False), (str(row.get("output") or ""), True)]


def encode(tokenizer: Any, rows: list[dict[str, Any]], max_length: int) -> list[tuple[list, list]]:
    """Each row as (token ids, labels): a label is the token where the loss counts it, else
    ``IGNORE_INDEX``; cut at ``max_length`` tokens. Rows left with nothing to learn are
    dropped."""
    eos = tokenizer.eos_token_id
    examples = []
    for row in rows:
        ids: list[int] = []
        labels: list[int] = []
        for text, counted in segments(row):
            if not text:
                continue
            tokens = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            ids += tokens
            labels += tokens if counted else [IGNORE_INDEX] * len(tokens)
        if eos is not None:
            ids.append(int(eos))
            labels.append(int(eos))
        ids, labels = ids[:max_length], labels[:max_length]
        if any(label != IGNORE_INDEX for label in labels[1:]):
            examples.append((ids, labels))
    return examples


def split_rows(n: int, holdout_fraction: float) -> tuple[list[int], list[int]]:
    """(train rows, held-out rows): a fixed permutation's first ``holdout_fraction`` held out
    (at least one row, and one row left to train, when the fraction is above 0)."""
    import numpy as np

    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    held = round(n * holdout_fraction)
    if holdout_fraction > 0 and n >= 2:
        held = max(1, min(held, n - 1))
    return sorted(int(i) for i in order[held:]), sorted(int(i) for i in order[:held])


def _batch(examples: list[tuple[list, list]], pad_id: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(examples):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
        mask[i, : len(row_ids)] = 1
    return ids.to(device), labels.to(device), mask.to(device)


def _token_loss(model: Any, ids: Any, labels: Any, mask: Any) -> tuple[Any, int]:
    """The summed next-token loss over the counted tokens, and how many there were."""
    from torch.nn import functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1, :].float()
    target = labels[:, 1:]
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return loss, int((target != IGNORE_INDEX).sum())


def evaluate(model: Any, examples: list, *, pad_id: int, device: Any, rows: int) -> dict:
    """The held-out mean token loss and perplexity (``exp`` of it) of ``model`` as it is."""
    import torch

    if not examples:
        return {}
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(examples), rows):
            ids, labels, mask = _batch(examples[start : start + rows], pad_id, device)
            loss, count = _token_loss(model, ids, labels, mask)
            total += float(loss)
            tokens += count
    if was_training:
        model.train()
    mean = total / max(tokens, 1)
    return {
        "eval_loss": mean,
        "perplexity": math.exp(min(mean, 700.0)),
        "tokens": tokens,
        "rows": len(examples),
    }


def _offline(work: Path) -> None:
    """Nothing downloads, nothing phones home; caches inside the job's own folder."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ.setdefault("HF_HOME", str(work / ".hf"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def train(job: Any, *, emit: Any, stop: Any) -> int:
    """Run (or resume) an ``lm_lora`` job (a ``data.JobSpec``). Returns an exit code."""
    from training.runner import EXIT_STOPPED, _atomic_save, _device

    work = Path(job.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    _offline(work)
    base_path = str(job.param("base_model_path", ""))
    if not base_path or not Path(base_path).is_dir():
        emit(
            "error",
            message="no base model folder: base_model_path must name a folder of the training "
            "node under its allowed base model folders (TRAINING_BASE_MODEL_ROOTS)",
        )
        return 2

    import pyarrow.parquet as pq
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training import data
    from training.bundle import SPEC_FILE, BundleSpec
    from training.params import params_resolved

    seed = int(job.param("seed", 0))
    threads = int(job.param("threads", 0))
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    device = _device(job)

    started = time.monotonic()
    table = pq.read_table(job.dataset_path)
    columns = set(table.column_names)
    if "messages" not in columns and not {"instruction", "output"} <= columns:
        emit("error", message="the record set needs instruction and output columns, or messages")
        return 2
    rows = table.to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(base_path, local_files_only=True)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    max_length = int(job.param("max_length", 512))
    train_rows, held_rows = split_rows(len(rows), float(job.param("holdout_fraction", 0.2)))
    train_set = encode(tokenizer, [rows[i] for i in train_rows], max_length)
    holdout = encode(tokenizer, [rows[i] for i in held_rows], max_length)
    emit(
        "log",
        message=f"data: {len(train_set)} train examples, {len(holdout)} held out "
        f"({time.monotonic() - started:.2f}s)",
    )
    if not train_set:
        emit("error", message="the record set has no training examples")
        return 2

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    base = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True, dtype=dtype)
    targets = [t.strip() for t in str(job.param("target_modules", "")).split(",") if t.strip()]
    config = LoraConfig(
        r=int(job.param("lora_r", 8)),
        lora_alpha=int(job.param("lora_alpha", 16)),
        lora_dropout=float(job.param("lora_dropout", 0.05)),
        target_modules=targets or None,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    model.to(device)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(
        list(trainable.values()),
        lr=float(job.param("lr", 0.01)),
        weight_decay=float(job.param("weight_decay", 0.0)),
    )
    batch_size = int(job.param("batch_size", 512))
    micro = max(1, int(job.param("micro_batch_size", 8)))
    order = data.BatchOrder(len(train_set), batch_size, seed)
    epochs = int(job.param("epochs", 2))
    total = int(job.param("max_steps", 0)) or epochs * order.steps_per_epoch

    step = 0
    base_metrics: dict[str, Any] = {}
    checkpoint = None
    if job.checkpoint_file.exists():
        checkpoint = torch.load(job.checkpoint_file, map_location="cpu", weights_only=True)
        if checkpoint.get("format") != LM_CHECKPOINT_FORMAT:
            checkpoint = None
    if checkpoint is not None:
        missing = set(trainable) - set(checkpoint["adapter"])
        if missing:
            emit("error", message=f"the checkpoint lacks LoRA weights: {sorted(missing)[:3]}")
            return 2
        with torch.no_grad():
            for name, param in trainable.items():
                param.copy_(checkpoint["adapter"][name].to(param.device, param.dtype))
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = int(checkpoint["step"])
        torch.set_rng_state(checkpoint["rng"])
        if device.type == "cuda" and checkpoint.get("cuda_rng"):
            torch.cuda.set_rng_state_all(list(checkpoint["cuda_rng"]))
        base_metrics = json.loads(checkpoint.get("base_metrics") or "{}")
        emit("log", message=f"resumed from checkpoint at step {step}")
    elif holdout:
        with model.disable_adapter():
            base_metrics = evaluate(model, holdout, pad_id=pad_id, device=device, rows=micro)
        emit("metric", step=0, name="base_eval_loss", value=base_metrics["eval_loss"])
        emit("log", message=f"base model: held-out perplexity {base_metrics['perplexity']:.4g}")

    hparams = params_resolved(job.template, job.params)
    spec = BundleSpec(template=job.template, features=[], hparams=hparams, label="")

    def save_checkpoint(at: int) -> None:
        _atomic_save(
            {
                "format": LM_CHECKPOINT_FORMAT,
                "adapter": {n: p.detach().cpu().clone() for n, p in trainable.items()},
                "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
                "step": at,
                "spec": json.dumps(spec.to_json()),
                "base_metrics": json.dumps(base_metrics),
            },
            job.checkpoint_file,
        )
        emit("checkpoint", step=at, path=str(job.checkpoint_file))

    emit(
        "start",
        total_steps=total,
        step=step,
        steps_per_epoch=order.steps_per_epoch,
        train_rows=len(train_set),
        validation_rows=0,
        holdout_rows=len(holdout),
        device=str(device),
        workers=1,
    )
    every_steps = int(job.param("checkpoint_every_steps", 200))
    every_s = float(job.param("checkpoint_every_s", 30.0))
    log_every = max(1, int(job.param("log_every_steps", 10)))
    step_sleep_s = float(job.param("step_sleep_s", 0.0))
    epoch_eval = bool(job.param("epoch_eval", True))
    model.train()
    first_step = step
    train_start = window_start = last_checkpoint = time.monotonic()
    window_rows = train_samples = 0
    running_loss, running_tokens = 0.0, 0
    eval_s = 0.0
    while step < total:
        if stop.requested:
            save_checkpoint(step)
            emit("stopped", step=step)
            return EXIT_STOPPED
        batch = [train_set[int(i)] for i in order.indices(step)]
        tokens = sum(sum(1 for t in labels[1:] if t != IGNORE_INDEX) for _, labels in batch)
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for start in range(0, len(batch), micro):
            ids, labels, mask = _batch(batch[start : start + micro], pad_id, device)
            loss, _ = _token_loss(model, ids, labels, mask)
            (loss / max(tokens, 1)).backward()
            step_loss += float(loss.detach())
        optimizer.step()
        step += 1
        if step_sleep_s:
            time.sleep(step_sleep_s)
        running_loss += step_loss
        running_tokens += tokens
        window_rows += len(batch)
        train_samples += len(batch)
        epoch, _ = order.position(step - 1)
        if step % log_every == 0 or step == total:
            now = time.monotonic()
            per_step = (now - train_start) / max(step - first_step, 1)
            emit(
                "progress",
                step=step,
                total_steps=total,
                epoch=epoch,
                loss=running_loss / max(running_tokens, 1),
                samples_per_s=window_rows / max(now - window_start, 1e-9),
                eta_s=(total - step) * per_step,
                gpu_memory_mb=(
                    torch.cuda.max_memory_allocated(device) // (1024 * 1024)
                    if device.type == "cuda"
                    else 0
                ),
            )
            window_start, window_rows = now, 0
            running_loss, running_tokens = 0.0, 0
        if step % order.steps_per_epoch == 0 and holdout and epoch_eval:
            eval_start = time.monotonic()
            held = evaluate(model, holdout, pad_id=pad_id, device=device, rows=micro)
            emit("metric", step=step, name="eval_loss", value=held["eval_loss"])
            emit("metric", step=step, name="perplexity", value=held["perplexity"])
            eval_s += time.monotonic() - eval_start
        if step < total and (
            step % every_steps == 0 or time.monotonic() - last_checkpoint >= every_s
        ):
            save_checkpoint(step)
            last_checkpoint = time.monotonic()
    elapsed = time.monotonic() - train_start - eval_s
    save_checkpoint(step)

    held = evaluate(model, holdout, pad_id=pad_id, device=device, rows=micro) if holdout else {}
    metrics: dict[str, Any] = {
        "steps": step,
        "train_samples_per_s": train_samples / elapsed if elapsed > 0 else 0.0,
        "epoch_eval_s": eval_s,
        "train_rows": len(train_set),
        "trainable_params": sum(p.numel() for p in trainable.values()),
        "total_params": sum(p.numel() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "holdout": held,
        "base_holdout": base_metrics,
        "base_perplexity": base_metrics.get("perplexity"),
    }
    if held and base_metrics:
        metrics["perplexity_delta"] = held["perplexity"] - base_metrics["perplexity"]
    source = str(job.param("base_model_source", "")) or base_path
    model.peft_config["default"].base_model_name_or_path = source
    out = Path(job.model_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    spec.extra = {
        "job_id": job.job_id,
        "base_model_path": source,
        "holdout": held,
        "base_holdout": base_metrics,
    }
    (out / SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=1, default=float))
    emit("done", step=step, metrics=metrics, model_path=str(out))
    return 0
