"""CUDA against CPU training samples/s for the training bench's job, without Django.

The job is the training bench's demo job (``bench.areas.training``): template ``fine_ranking``
on ``training.synthetic``'s demo dataset at ``DEMO_SCALE`` (100,000 rows; clicks from the
generator's logistic model), ``DEMO_PARAMS`` (seed, lr, one thread), the same time-ordered
split (``HOLDOUT``, the default validation fraction). Everything below runs the platform's own
code: ``training.data.load`` (read, split, fit the encoding, encode), ``training.bundle.
build_model`` (the template's DCN-v2), the runner's Adam config, ``training.data.BatchOrder``
and the runner's step (index on the device, gather, BCE with logits, ``zero_grad``,
``backward``, the loss read back to the host as ``training.runner.train`` does every step,
``optimizer.step``). Two measures per device:

- ``steps``: that step loop alone for each batch size of ``--batch-sizes`` (the demo job's 512
  and the data-parallel measures' ``DDP_BATCHES``): the data loaded and on the device first
  (not timed), ``--warmup-steps`` steps, then ``--rounds`` rounds of at least ``--samples``
  samples each (whole batches, epochs wrapping as ``BatchOrder`` orders them), the device
  synchronised before each clock read; samples/s per round, median, min and max.
- ``runner``: ``--runner-rounds`` whole jobs through ``training.runner.train`` in this process
  (the training child's function, what ``python -m training.runner`` runs: checkpoints,
  progress events, per-epoch validation and held-out evaluation, the bundle), its own
  ``train_samples_per_s`` (start-up, data load and evaluation excluded by the runner itself).

The data file comes from ``--make-data PATH`` (needs Django: ``features.demo`` imports the
models), run once where the platform is installed; the measuring runs need only torch, numpy
and pyarrow (and scikit-learn for the runner's calibration), so the file and this repository are
all a GPU machine needs::

    DJANGO_SETTINGS_MODULE=config.settings python bench/cuda_check.py \
        --make-data var/cuda_check/demo_scale5.parquet
    python bench/cuda_check.py --data var/cuda_check/demo_scale5.parquet --device cuda \
        --out cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def make_data(path: str, scale: float) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from training import synthetic

    written = synthetic.write_demo_dataset(path, scale=scale)
    print(f"wrote {written}")


def job_spec(data_path: str, work_dir: str, **params: Any):
    """The bench's demo job as ``agent.build_job_spec`` hands it to the child (features as
    ``training.synthetic`` lays them out; the params the bench gives ``job_create``)."""
    from bench.areas.training import DEMO_PARAMS, HOLDOUT
    from training import synthetic
    from training.data import JobSpec

    return JobSpec(
        job_id=0,
        template="fine_ranking",
        dataset_path=data_path,
        features=synthetic.feature_dicts(),
        work_dir=work_dir,
        label="click",
        params={**DEMO_PARAMS, "holdout_fraction": HOLDOUT, **params},
    )


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line]
    return names[0] if names else platform.processor()


def summary(rates: list[float]) -> dict[str, Any]:
    import statistics

    return {
        "rates": rates,
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
    }


def step_rates(loaded, spec, device, batch_size: int, args) -> dict[str, Any]:
    """The runner's training step alone, ``args.rounds`` timed rounds after a warm-up."""
    import torch
    from torch.nn import functional as F

    from training import data
    from training.bundle import build_model

    seed = int(spec.param("seed", 0))
    torch.manual_seed(seed)
    model = build_model(loaded.spec).to(device)
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=float(spec.param("lr", 0.01)),
        weight_decay=float(spec.param("weight_decay", 0.0)),
    )
    order = data.BatchOrder(loaded.train.n, batch_size, seed)
    train = loaded.train
    dense_all, cat_all, y_all = train.dense.to(device), train.cat.to(device), train.label.to(device)
    model.train()
    step = 0

    def run_steps(min_samples: int, max_steps: int) -> int:
        nonlocal step
        samples = steps = 0
        while samples < min_samples or steps < max_steps:
            index = order.indices(step).to(device)
            dense, cat, label = dense_all[index], cat_all[index], y_all[index]
            loss = F.binary_cross_entropy_with_logits(model(dense, cat), label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            float(loss.detach())  # the runner reads every step's loss (a sync on CUDA)
            optimizer.step()
            samples += int(index.shape[0])
            steps += 1
            step += 1
        return samples

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run_steps(0, args.warmup_steps)
    sync()
    rates, steps_per_round = [], 0
    for _ in range(args.rounds):
        before = step
        started = time.perf_counter()
        samples = run_steps(args.samples, 1)
        sync()
        rates.append(samples / (time.perf_counter() - started))
        steps_per_round = step - before
    return {
        **summary(rates),
        "batch_size": batch_size,
        "steps_per_round": steps_per_round,
        "warmup_steps": args.warmup_steps,
        "train_rows": train.n,
    }


def runner_rates(args, device_name: str) -> dict[str, Any]:
    """Whole jobs through ``training.runner.train`` (in this process): the runner's own rate."""
    from training import runner

    rates, aucs = [], []
    for round_ in range(args.runner_rounds):
        with tempfile.TemporaryDirectory(prefix=f"cuda-check-{round_}-") as work:
            spec = job_spec(args.data, work, device=device_name, threads=args.threads)
            events: list[dict] = []
            code = runner.train(spec, emit=runner.Emitter(sink=events.append))
            if code != 0:
                raise RuntimeError(f"runner exited with {code}: {events[-3:]}")
            metrics = next(e for e in events if e["type"] == "done")["metrics"]
            rates.append(float(metrics["train_samples_per_s"]))
            aucs.append(float(metrics["holdout"]["auc"]))
            print(f"  runner round {round_}: {rates[-1]:.0f}/s, AUC {aucs[-1]:.4f}", flush=True)
    return {**summary(rates), "holdout_auc": aucs, "params": spec.params}


def measure(args) -> dict[str, Any]:
    import numpy as np
    import torch

    from training import data

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here")
    result: dict[str, Any] = {
        "device": args.device,
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
        ),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "data": args.data,
        "samples_per_round": args.samples,
        "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as work:
        spec = job_spec(args.data, work, threads=args.threads)
        started = time.perf_counter()
        loaded = data.load(spec)
        result["load_s"] = time.perf_counter() - started
    result["params"] = spec.params
    result["steps"] = {}
    for batch_size in args.batch_sizes:
        out = step_rates(loaded, spec, device, batch_size, args)
        result["steps"][str(batch_size)] = out
        print(
            f"{args.device} threads={args.threads} batch {batch_size}: median "
            f"{out['median']:.0f}/s (min {out['min']:.0f}, max {out['max']:.0f}, "
            f"{out['steps_per_round']} steps a round)",
            flush=True,
        )
    if args.runner_rounds:
        out = runner_rates(args, args.device)
        result["runner"] = out
        print(
            f"{args.device} threads={args.threads} runner (batch "
            f"{out['params']['batch_size']}): median {out['median']:.0f}/s "
            f"(min {out['min']:.0f}, max {out['max']:.0f})",
            flush=True,
        )
    if device.type == "cuda":
        result["cuda_max_memory_mb"] = torch.cuda.max_memory_allocated(device) // (1024 * 1024)
    return result


def main(argv: list[str] | None = None) -> int:
    from bench.areas.training import DDP_BATCHES, DEMO_PARAMS, DEMO_SCALE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make-data", metavar="PATH", help="write the demo dataset (Django)")
    parser.add_argument("--scale", type=float, default=DEMO_SCALE)
    parser.add_argument("--data", default="var/cuda_check/demo_scale5.parquet")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=int(DEMO_PARAMS["threads"]))
    parser.add_argument(
        "--batch-sizes",
        type=lambda text: [int(x) for x in text.split(",") if x],
        default=[int(DEMO_PARAMS["batch_size"]), *DDP_BATCHES],
    )
    parser.add_argument("--samples", type=int, default=200_000, help="per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--runner-rounds", type=int, default=0)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.make_data:
        make_data(args.make_data, args.scale)
        return 0
    result = measure(args)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
