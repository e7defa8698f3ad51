"""Quantised inference: the fine-ranking model in ONNX Runtime, fp32 against int8; an LM in int8.

The fine-ranking template's model compiled to ONNX and quantised to int8 by ONNX Runtime, and a
tiny causal language model quantised to int8 by ``torch.ao``.

Ranking (per seed of ``BENCH_QUANT_SEEDS``, default ``0,1,2``): the demo generator's dataset
(``training.synthetic``, ``BENCH_QUANT_SCALE`` = 1.0, 50,000 impressions) trains ``fine_ranking``
(DCN-v2, its default parameters) in-process; the test rows are the job's held-out rows (the
newest 20%, untouched by training). The model is exported and quantised by the platform's own
steps (``serving.quantization.export_ranker_onnx`` and ``quantize_onnx``: ``torch.onnx.export``,
then ``onnxruntime.quantization.quantize_dynamic``, int8 weights, activations quantised per
call, what a version's int8 variant is made with), and for comparison by ``quantize_static``
(QDQ, activations calibrated on 2,000 training rows).
Every runtime has one thread (the gateway's workers are single-threaded).

- ``p99_ms_fp32`` / ``p99_ms_int8`` / ``p99_ms_int8_static``: the 99th percentile of one batch of
  ``BENCH_QUANT_BATCH`` (100, a ranking request's candidates) encoded rows through ONNX Runtime,
  fp32 against int8 (1,000 timed batches after 100 warm-up); ``p99_ms_torch_fp32`` the same
  batches through PyTorch eager (how the gateway runs the model today).
- ``speedup_int8`` = ``p99_ms_fp32 / p99_ms_int8`` (the same runtime, only the precision
  differs); ``speedup_int8_vs_torch`` against PyTorch eager.
- ``auc_fp32``, ``auc_int8``, ``auc_int8_static`` on the test rows; ``auc_loss_int8``.
- ``gemm_share_fp32``: the share of ONNX Runtime's fp32 run time spent in its matrix products
  (``MatMul``/``Gemm`` nodes, from its profiler, batches of the same size). int8 can only speed
  those up, so by Amdahl's law no int8 kernel can make the whole call faster than
  ``1 / (1 - gemm_share_fp32)``: ``speedup_int8_bound``.
- The same at batch 1,000 (``_b1000``), where the products weigh more.

Language model (``lm_*``): a tiny Llama-architecture model (2 layers, width 128, vocabulary 512)
trained for 300 steps on sequences from a random first-order Markov chain (so it has something
to predict), then ``torch.ao.quantization.quantize_dynamic`` on its ``Linear`` layers (int8):

- ``lm_tokens_per_s_fp32`` / ``lm_tokens_per_s_int8``: forward tokens per second over batches of
  8 x 128 tokens; ``lm_decode_tokens_per_s_fp32`` / ``_int8``: greedy generation of 64 tokens
  (batch 1, with the KV cache);
- ``lm_perplexity_fp32`` / ``lm_perplexity_int8`` on 64 held-out sequences and
  ``lm_perplexity_change`` (int8 minus fp32).

Goals (from the issue): ``speedup_int8 >= 1.5`` with ``auc_loss_int8 <= 0.001``. "fp32" has two
readings, both reported: the same runtime in fp32 (``speedup_int8``, the precision alone; held
below 1.5 by the Amdahl bound above), and the fp32 version as the platform serves it, PyTorch
eager (``speedup_int8_vs_torch``: what releasing the int8 variant instead of its source gains,
the comparison its sandbox gate shows).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import Context, percentile

HOLDOUT = 0.2
WARMUP, TIMED = 100, 1000


def _train_ranker(ctx: Context, seed: int, scale: float) -> tuple[Any, dict, Path]:
    """(the bundle, the job's metrics, the dataset file) of a fine_ranking run on demo data."""
    from training import runner
    from training.bundle import load_bundle
    from training.data import JobSpec
    from training.synthetic import feature_dicts, write_demo_dataset

    path = write_demo_dataset(ctx.workdir / f"demo-{seed}.parquet", scale=scale, seed=seed)
    spec = JobSpec(
        job_id=0,
        template="fine_ranking",
        dataset_path=str(path),
        features=feature_dicts(),
        work_dir=str(ctx.workdir / f"ranker-{seed}"),
        label="click",
        params={"seed": seed, "holdout_fraction": HOLDOUT, "threads": 1},
    )
    events: list[dict] = []
    code = runner.train(spec, emit=runner.Emitter(sink=events.append))
    if code != 0:
        raise RuntimeError(f"fine_ranking exited with {code}: {events[-3:]}")
    metrics = next(e for e in events if e["type"] == "done")["metrics"]
    return load_bundle(Path(spec.work_dir) / "model"), metrics, path


def _split(bundle: Any, path: Path) -> dict[str, Any]:
    """The encoded train and test rows (test: the newest ``HOLDOUT`` share, as the job held
    out)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from training.data import holdout_rows

    table = pq.read_table(path)
    table = table.take(pc.sort_indices(table, [("event_time", "ascending")]))
    n = table.num_rows
    cut = n - holdout_rows(n, HOLDOUT)
    out: dict[str, Any] = {}
    for name, part in (("train", table.slice(0, cut)), ("test", table.slice(cut))):
        columns = part.to_pydict()
        dense, cat = bundle.encoder.encode(columns, part.num_rows)
        out[name] = (dense, cat, np.asarray(columns["click"], dtype=np.int64))
    return out


def _timed_batches(run, dense: np.ndarray, cat: np.ndarray, batch: int, seed: int) -> list[float]:
    starts = np.random.default_rng(seed).integers(0, len(dense) - batch, WARMUP + TIMED)
    seconds = []
    for k, i in enumerate(starts):
        d, c = dense[i : i + batch], cat[i : i + batch]
        began = time.perf_counter()
        run(d, c)
        if k >= WARMUP:
            seconds.append(time.perf_counter() - began)
    return seconds


def _gemm_share(model_path: Path, dense: np.ndarray, cat: np.ndarray, batch: int) -> float:
    """The share of ONNX Runtime's node time in matrix products, from its profiler."""
    import onnxruntime as ort

    options = _session_options()
    options.enable_profiling = True
    options.profile_file_prefix = str(model_path.with_suffix(""))
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    for i in range(0, min(len(dense) - batch, 300 * batch), batch):
        session.run(None, {"dense": dense[i : i + batch], "cat": cat[i : i + batch]})
    trace = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    total = sum(e["dur"] for e in nodes)
    products = sum(e["dur"] for e in nodes if e["args"].get("op_name") in ("MatMul", "Gemm"))
    runs = [e["dur"] for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"]
    # kernels are part of each run: the rest is the runtime's own overhead per call
    return products / max(sum(runs), total, 1)


def _session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def one_ranker(ctx: Context, seed: int, scale: float, batch: int) -> dict[str, float]:
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from sklearn.metrics import roc_auc_score

    from serving.quantization import export_ranker_onnx, quantize_onnx

    torch.set_num_threads(1)
    bundle, metrics, path = _train_ranker(ctx, seed, scale)
    rows = _split(bundle, path)
    dense, cat, clicks = rows["test"]
    model = bundle.model.eval()
    # The platform's own compile and quantise steps (what "make an int8 variant" runs).
    fp32 = export_ranker_onnx(bundle, ctx.workdir / f"ranker-{seed}.onnx")
    int8 = quantize_onnx(fp32, fp32.with_name(f"ranker-{seed}-int8.onnx"))
    train_dense, train_cat, _ = rows["train"]

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(
                {"dense": train_dense[i : i + batch], "cat": train_cat[i : i + batch]}
                for i in range(0, min(2000, len(train_dense)), batch)
            )

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    static = fp32.with_name(f"ranker-{seed}-int8-static.onnx")
    quantize_static(
        str(fp32),
        str(static),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    sessions = {
        name: ort.InferenceSession(str(p), _session_options(), providers=["CPUExecutionProvider"])
        for name, p in (("fp32", fp32), ("int8", int8), ("int8_static", static))
    }
    out: dict[str, float] = {"auc_job": metrics["holdout"]["auc"]}
    with torch.inference_mode():
        logits = model(torch.from_numpy(dense), torch.from_numpy(cat)).numpy()
    out["auc_torch_fp32"] = float(roc_auc_score(clicks, logits))
    for name, session in sessions.items():
        scored = session.run(None, {"dense": dense, "cat": cat})[0]
        out[f"auc_{name}"] = float(roc_auc_score(clicks, scored))
    out["auc_loss_int8"] = out["auc_fp32"] - out["auc_int8"]
    out["auc_loss_int8_static"] = out["auc_fp32"] - out["auc_int8_static"]

    def eager(d: np.ndarray, c: np.ndarray) -> None:
        with torch.inference_mode():
            model(torch.from_numpy(d), torch.from_numpy(c))

    for size, suffix in ((batch, ""), (10 * batch, f"_b{10 * batch}")):
        runners = {"torch_fp32": eager} | {
            name: (lambda s: lambda d, c: s.run(None, {"dense": d, "cat": c}))(session)
            for name, session in sessions.items()
        }
        for name, run in runners.items():
            seconds = _timed_batches(run, dense, cat, size, seed)
            out[f"p99_ms_{name}{suffix}"] = percentile(seconds, 99) * 1000
        out[f"speedup_int8{suffix}"] = out[f"p99_ms_fp32{suffix}"] / out[f"p99_ms_int8{suffix}"]
        out[f"speedup_int8_static{suffix}"] = (
            out[f"p99_ms_fp32{suffix}"] / out[f"p99_ms_int8_static{suffix}"]
        )
        out[f"speedup_int8_vs_torch{suffix}"] = (
            out[f"p99_ms_torch_fp32{suffix}"] / out[f"p99_ms_int8{suffix}"]
        )
        share = _gemm_share(fp32, dense, cat, size)
        out[f"gemm_share_fp32{suffix}"] = share
        out[f"speedup_int8_bound{suffix}"] = 1 / max(1 - share, 1e-9)
    ctx.log(
        f"ranker seed {seed}: AUC fp32 {out['auc_fp32']:.4f} int8 {out['auc_int8']:.4f}; "
        f"p99 ms torch {out['p99_ms_torch_fp32']:.3f} fp32 {out['p99_ms_fp32']:.3f} "
        f"int8 {out['p99_ms_int8']:.3f} static {out['p99_ms_int8_static']:.3f}; "
        f"matrix products {out['gemm_share_fp32']:.0%} of fp32 time"
    )
    return out


def markov_sequences(rng: np.random.Generator, vocab: int, count: int, length: int):
    """Sequences from a random first-order Markov chain whose next token is one of 4 likely
    successors (so a model can learn it)."""
    successors = rng.integers(0, vocab, (vocab, 4))
    out = np.empty((count, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, count)
    for t in range(1, length):
        pick = rng.integers(0, 4, count)
        noise = rng.random(count) < 0.1
        out[:, t] = np.where(noise, rng.integers(0, vocab, count), successors[out[:, t - 1], pick])
    return out


def _perplexity(model: Any, sequences: Any) -> float:
    import torch

    with torch.inference_mode():
        losses = [
            float(model(input_ids=sequences[i : i + 8], labels=sequences[i : i + 8]).loss)
            for i in range(0, len(sequences), 8)
        ]
    return float(np.exp(np.mean(losses)))


def one_lm(ctx: Context, seed: int) -> dict[str, float]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from serving.lm_inference import quantize_int8

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    vocab, length = 512, 128
    data = torch.from_numpy(markov_sequences(rng, vocab, 2048 + 64, length))
    train, held = data[:2048], data[2048:]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=length * 2,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(300):
        batch = train[(step * 16) % 2048 : (step * 16) % 2048 + 16]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    quantised = quantize_int8(model)  # what an int8 variant of a language model loads as
    out: dict[str, float] = {}
    for name, m in (("fp32", model), ("int8", quantised)):
        out[f"lm_perplexity_{name}"] = _perplexity(m, held)
        with torch.inference_mode():
            m(input_ids=held[:8])  # warm-up
            began = time.perf_counter()
            for i in range(0, 64, 8):
                m(input_ids=held[i : i + 8])
            out[f"lm_tokens_per_s_{name}"] = 64 * length / (time.perf_counter() - began)
            prompt = held[:1, :16]
            m.generate(prompt, max_new_tokens=8, do_sample=False)  # warm-up
            began = time.perf_counter()
            m.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
            out[f"lm_decode_tokens_per_s_{name}"] = 64 / (time.perf_counter() - began)
    out["lm_perplexity_change"] = out["lm_perplexity_int8"] - out["lm_perplexity_fp32"]
    out["lm_speedup_int8"] = out["lm_tokens_per_s_int8"] / out["lm_tokens_per_s_fp32"]
    ctx.log(
        f"lm seed {seed}: perplexity fp32 {out['lm_perplexity_fp32']:.3f} "
        f"int8 {out['lm_perplexity_int8']:.3f}; tokens/s fp32 {out['lm_tokens_per_s_fp32']:,.0f} "
        f"int8 {out['lm_tokens_per_s_int8']:,.0f}"
    )
    return out


def run(ctx: Context) -> dict[str, float]:
    seeds = [int(s) for s in os.environ.get("BENCH_QUANT_SEEDS", "0,1,2").split(",") if s.strip()]
    scale = float(os.environ.get("BENCH_QUANT_SCALE", "1.0"))
    batch = int(os.environ.get("BENCH_QUANT_BATCH", "100"))
    ctx.parameters.update(
        {"seeds": seeds, "scale": scale, "batch": batch, "threads": 1, "timed": TIMED}
    )
    runs = [one_ranker(ctx, seed, scale, batch) | one_lm(ctx, seed) for seed in seeds]
    ctx.parameters["per_seed"] = runs
    measures: dict[str, float] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        measures[key] = statistics.median(values)
        if len(values) > 1:
            measures[f"{key}_min"] = min(values)
            measures[f"{key}_max"] = max(values)
    worst = "_min" if len(runs) > 1 else ""
    ctx.parameters["goals"] = {
        "speedup_int8 >= 1.5": measures[f"speedup_int8{worst}"] >= 1.5,
        # The other reading of "fp32": the version as the platform serves it (PyTorch eager),
        # against its int8 variant (what a user gains by releasing the variant instead).
        "speedup_int8_vs_torch >= 1.5": measures[f"speedup_int8_vs_torch{worst}"] >= 1.5,
        "auc_loss_int8 <= 0.001": measures[f"auc_loss_int8{'_max' if worst else ''}"] <= 0.001,
    }
    return measures
