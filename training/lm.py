"""The language-model path of the training child (templates ``lm_lora`` and ``lm_full``):
fine-tuning of a local Hugging Face causal language model on a record set (``curation``), either
LoRA (``lm_lora``: low-rank adapters with ``peft``, the base weights frozen) or full
(``lm_full``: every weight of the model trains). One loop runs both; the template decides only
how the model and its trainable weights are built and what the model output is.

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
  held-out loss and perplexity are reported for the base model (adapter off, or the weights
  before the first step) before training and for the fine-tuned model after it, and
  ``eval_loss`` after every epoch (``epoch_eval``).
- The base model is a local folder (``base_model_path``, copied into the sandbox by the agent),
  read with ``local_files_only``: nothing is downloaded. ``lm_lora``: the base model is held in
  bf16 on a CUDA device that supports it, else in float32; the LoRA weights stay float32.
  ``lm_full``: the weights (and AdamW's state) are float32, and on a CUDA device that supports
  bf16 the forward and backward passes run under bf16 autocast (mixed precision: updates as
  small as a fine-tuning lr makes them are not lost to bf16 rounding); about 16 bytes a
  parameter (weights, gradients, two AdamW moments) plus the activations, which
  ``gradient_checkpointing`` trades for a second forward pass.
- Steps: ``batch_size`` rows per optimiser step (AdamW over the trainable weights), in forward
  passes of ``micro_batch_size`` rows whose gradients are summed (the loss is the mean over the
  step's response tokens); the rows of each step come from ``data.BatchOrder`` (seed, epoch),
  so the position in the data is the step number.
- Checkpoints hold the trainable weights (the LoRA weights, or all of the model's), the
  optimiser state, the step, the torch RNG states and the base model's held-out figures; a
  resumed run continues from the same step with the same batches and dropout draws, and ends
  with the weights an uninterrupted run ends with.
- The model output (``model/``): ``lm_lora``: the adapter (peft's ``save_pretrained``:
  ``adapter_config.json`` and ``adapter_model.safetensors``); ``lm_full``: the whole model
  (``save_pretrained``: ``config.json``, one ``model.safetensors``, ``generation_config.json``),
  loadable on its own with ``AutoModelForCausalLM.from_pretrained``. Both with the base model's
  tokenizer and ``spec.json`` (the bundle spec: template, hyperparameters, the base model and
  the held-out figures).
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


# The template that fine-tunes every weight of the model (the others train a LoRA adapter).
FULL_TEMPLATE = "lm_full"


def build(spec: Any) -> Any:
    """The bundle loader's builder: a language model is not a ranking bundle."""
    if getattr(spec, "template", "") == FULL_TEMPLATE:
        raise ValueError(
            "an lm_full model is a whole causal language model: load it with transformers "
            "(AutoModelForCausalLM.from_pretrained(<model folder>)), not as a ranking bundle"
        )
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


def _lora_model(base: Any, params: dict[str, Any]) -> Any:
    """``lm_lora``: the base model wrapped in peft's LoRA adapters (only they train)."""
    from peft import LoraConfig, get_peft_model

    targets = [t.strip() for t in str(params.get("target_modules") or "").split(",") if t.strip()]
    config = LoraConfig(
        r=int(params.get("lora_r", 8)),
        lora_alpha=int(params.get("lora_alpha", 16)),
        lora_dropout=float(params.get("lora_dropout", 0.05)),
        target_modules=targets or None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, config)


def _precision(device: Any, full: bool) -> tuple[Any, Any, str]:
    """(the dtype the weights load in, a context for the forward passes, the autocast dtype's
    name or ""): ``lm_lora`` holds the frozen base in bf16 where the CUDA device supports it;
    ``lm_full`` keeps float32 weights and runs the passes under bf16 autocast there. float32
    elsewhere."""
    import contextlib

    import torch

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if not bf16:
        return torch.float32, contextlib.nullcontext, ""
    if not full:
        return torch.bfloat16, contextlib.nullcontext, ""

    def autocast() -> Any:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)

    return torch.float32, autocast, "bfloat16"


def _activation_checkpointing(model: Any, *, on: bool) -> None:
    """Turn activation (gradient) checkpointing on or off: recomputed activations (the RNG
    state kept, so dropout draws are the same), and no key/value cache while it is on."""
    if on:
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers 5's name
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    else:
        disable = getattr(model, "activation_checkpointing_disable", None)
        (disable or model.gradient_checkpointing_disable)()
    if on:  # no key/value cache while training (restored as saved before the model is)
        model.config.use_cache = False


def train(job: Any, *, emit: Any, stop: Any) -> int:
    """Run (or resume) an ``lm_lora`` or ``lm_full`` job (a ``data.JobSpec``). Returns an exit
    code."""
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training import data
    from training.bundle import SPEC_FILE, BundleSpec
    from training.params import params_resolved

    full = job.template == FULL_TEMPLATE
    # The job's params over its template's defaults (``lm_full``'s own lr and batch_size).
    hparams = params_resolved(job.template, job.params)
    hp = {name: value for name, value in hparams.items() if value is not None}
    seed = int(hp.get("seed", 0))
    threads = int(hp.get("threads", 0))
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
    max_length = int(hp.get("max_length", 512))
    train_rows, held_rows = split_rows(len(rows), float(hp.get("holdout_fraction", 0.2)))
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

    dtype, precision, autocast = _precision(device, full)
    base = AutoModelForCausalLM.from_pretrained(base_path, local_files_only=True, dtype=dtype)
    model = base if full else _lora_model(base, hp)
    model.to(device)
    checkpointing = full and bool(hp.get("gradient_checkpointing", False))
    use_cache = getattr(model.config, "use_cache", None)
    if checkpointing:
        _activation_checkpointing(model, on=True)
    # Tied weights (an input embedding shared with the output layer) are one parameter here.
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(
        list(trainable.values()),
        lr=float(hp.get("lr", 0.01)),
        weight_decay=float(hp.get("weight_decay", 0.0)),
    )
    batch_size = int(hp.get("batch_size", 512))
    micro = max(1, int(hp.get("micro_batch_size", 8)))
    order = data.BatchOrder(len(train_set), batch_size, seed)
    epochs = int(hp.get("epochs", 2))
    total = int(hp.get("max_steps", 0)) or epochs * order.steps_per_epoch
    # What the checkpoint calls the trainable weights (``adapter``: as lm_lora always has).
    weights_key = "weights" if full else "adapter"

    def held_out() -> dict:
        with precision():
            return evaluate(model, holdout, pad_id=pad_id, device=device, rows=micro)

    step = 0
    base_metrics: dict[str, Any] = {}
    checkpoint = None
    if job.checkpoint_file.exists():
        checkpoint = torch.load(job.checkpoint_file, map_location="cpu", weights_only=True)
        if checkpoint.get("format") != LM_CHECKPOINT_FORMAT or weights_key not in checkpoint:
            checkpoint = None
    if checkpoint is not None:
        missing = set(trainable) - set(checkpoint[weights_key])
        if missing:
            what = "model weights" if full else "LoRA weights"
            emit("error", message=f"the checkpoint lacks {what}: {sorted(missing)[:3]}")
            return 2
        with torch.no_grad():
            for name, param in trainable.items():
                param.copy_(checkpoint[weights_key][name].to(param.device, param.dtype))
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = int(checkpoint["step"])
        torch.set_rng_state(checkpoint["rng"])
        if device.type == "cuda" and checkpoint.get("cuda_rng"):
            torch.cuda.set_rng_state_all(list(checkpoint["cuda_rng"]))
        base_metrics = json.loads(checkpoint.get("base_metrics") or "{}")
        emit("log", message=f"resumed from checkpoint at step {step}")
    elif holdout:
        if full:  # the weights before the first step are the base model's
            base_metrics = held_out()
        else:
            with model.disable_adapter():
                base_metrics = held_out()
        emit("metric", step=0, name="base_eval_loss", value=base_metrics["eval_loss"])
        emit("log", message=f"base model: held-out perplexity {base_metrics['perplexity']:.4g}")

    spec = BundleSpec(template=job.template, features=[], hparams=hparams, label="")

    def save_checkpoint(at: int) -> None:
        _atomic_save(
            {
                "format": LM_CHECKPOINT_FORMAT,
                weights_key: {n: p.detach().cpu().clone() for n, p in trainable.items()},
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
    every_steps = int(hp.get("checkpoint_every_steps", 200))
    every_s = float(hp.get("checkpoint_every_s", 30.0))
    log_every = max(1, int(hp.get("log_every_steps", 10)))
    step_sleep_s = float(hp.get("step_sleep_s", 0.0))
    epoch_eval = bool(hp.get("epoch_eval", True))
    model.train()
    first_step = step
    train_start = window_start = last_checkpoint = time.monotonic()
    window_rows = train_samples = train_tokens = 0
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
            with precision():
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
        train_tokens += sum(len(ids) for ids, _ in batch)  # the input tokens, padding aside
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
            held = held_out()
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

    held = held_out() if holdout else {}
    metrics: dict[str, Any] = {
        "steps": step,
        "train_samples_per_s": train_samples / elapsed if elapsed > 0 else 0.0,
        # Input tokens (prompt and response, padding aside) through forward and backward a
        # second, evaluation excluded: the figure fine-tuning tools report as tokens/s.
        "train_tokens_per_s": train_tokens / elapsed if elapsed > 0 else 0.0,
        "train_tokens": train_tokens,
        "epoch_eval_s": eval_s,
        "train_rows": len(train_set),
        "trainable_params": sum(p.numel() for p in trainable.values()),
        "total_params": sum(p.numel() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "holdout": held,
        "base_holdout": base_metrics,
        "base_perplexity": base_metrics.get("perplexity"),
    }
    if full:
        metrics["autocast"] = autocast
    if held and base_metrics:
        metrics["perplexity_delta"] = held["perplexity"] - base_metrics["perplexity"]
    source = str(hp.get("base_model_source", "")) or base_path
    out = Path(job.model_dir)
    out.mkdir(parents=True, exist_ok=True)
    if full:
        if checkpointing:
            _activation_checkpointing(model, on=False)
            model.config.use_cache = use_cache
        # One safetensors file (``bundle.LM_FULL_MODEL_FILE``), however large: no shards.
        model.save_pretrained(str(out), safe_serialization=True, max_shard_size="100000GB")
    else:
        model.peft_config["default"].base_model_name_or_path = source
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
