"""``lm_lora`` on a CUDA device in bf16 against the CPU: tokens/s, without Django.

Issue 23's device line: "On a GPU machine, when the task is lent one: ``lm_lora`` on CUDA in
bf16, tokens/s reported". One command for the lent machine, the repository and its pinned
packages being all it needs (nothing downloads: the base model is built here):

    python bench/lm_cuda_check.py --device cuda --out lm_cuda.json
    python bench/lm_cuda_check.py --device cpu --threads 16 --out lm_cpu.json

A GPT-2-architecture causal LM (``--layers`` x ``--width``, random weights, a word-level
tokenizer of the rows' words) is saved in the Hugging Face format as the base model, and
``--rows`` generated instruction rows ("what colour is the X ?" -> "the X is Y .", padded with
``--filler`` words so sequences are long enough to keep a GPU busy) are the record set. Each
of ``--rounds`` runs is a whole ``lm_lora`` job through ``training.lm.train`` (what the node
agent's training child runs: the same split, checkpoints, held-out evaluation, adapter save);
on CUDA the frozen base is held in bf16 (``training.lm._precision``). Reported per round: the
job's ``train_tokens_per_s`` (input tokens through forward and backward a second, evaluation
excluded), ``train_samples_per_s``, the weights' dtype, the held-out perplexity against the
base model's, and the device's name; the median, min and max of the tokens/s.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

COLOURS = ["red", "blue", "green", "yellow", "black", "white", "purple", "orange"]


def make_rows(count: int, filler: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    things = [f"thing{i}" for i in range(64)]
    colour = {t: rng.choice(COLOURS) for t in things}
    rows = []
    for _ in range(count):
        thing = rng.choice(things)
        words = " ".join(rng.choice(things) for _ in range(filler))
        rows.append(
            {
                "instruction": f"{words} what colour is the {thing} ?",
                "input": "",
                "output": f"the {thing} is {colour[thing]} .",
            }
        )
    return rows


def make_base(folder: Path, rows: list[dict[str, str]], layers: int, width: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    prompt_words = ["###", "Instruction:", "Input:", "Response:"]
    words = sorted({w for row in rows for text in row.values() for w in text.split()})
    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "<eos>", *prompt_words, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers,
        n_head=max(1, width // 64),
        n_embd=width,
        n_positions=512,
        vocab_size=len(vocab),
        bos_token_id=2,
        eos_token_id=2,
        pad_token_id=1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def one_round(args: argparse.Namespace, base: Path, records: Path, work: Path) -> dict[str, Any]:
    from training import lm, runner
    from training.data import JobSpec

    events: list[dict[str, Any]] = []
    job = JobSpec(
        job_id=1,
        template="lm_lora",
        dataset_path=str(records),
        features=[],
        work_dir=str(work),
        label="",
        params={
            "base_model_path": str(base),
            "device": args.device,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "micro_batch_size": args.batch_size,
            "lr": 1e-3,
            "threads": args.threads,
            "max_length": 512,
            "checkpoint_every_steps": 10_000,
            "checkpoint_every_s": 3600.0,
            "epoch_eval": False,
        },
    )
    code = lm.train(job, emit=runner.Emitter(sink=events.append), stop=runner.StopFlag())
    if code != 0:
        raise RuntimeError(f"lm_lora exited with {code}: {events[-3:]}")
    metrics = next(e for e in events if e["type"] == "done")["metrics"]
    return {
        "train_tokens_per_s": metrics["train_tokens_per_s"],
        "train_samples_per_s": metrics["train_samples_per_s"],
        "train_tokens": metrics["train_tokens"],
        "steps": metrics["steps"],
        "dtype": metrics["dtype"],
        "perplexity": (metrics.get("holdout") or {}).get("perplexity"),
        "base_perplexity": metrics.get("base_perplexity"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/lm_cuda_check.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--filler", type=int, default=48)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    rounds = []
    with tempfile.TemporaryDirectory(prefix="lm-cuda-check-") as tmp:
        root = Path(tmp)
        rows = make_rows(args.rows, args.filler, seed=0)
        make_base(root / "base", rows, args.layers, args.width)
        records = root / "records.parquet"
        pq.write_table(pa.Table.from_pylist(rows), records)
        for n in range(args.rounds):
            rounds.append(one_round(args, root / "base", records, root / f"job-{n}"))
            print(json.dumps(rounds[-1]), flush=True)
    rates = [r["train_tokens_per_s"] for r in rounds]
    device = torch.device(args.device)
    out = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "bf16": device.type == "cuda" and torch.cuda.is_bf16_supported(),
        "parameters": {k: v for k, v in vars(args).items() if k != "out"},
        "rounds": rounds,
        "train_tokens_per_s": {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
        },
    }
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
