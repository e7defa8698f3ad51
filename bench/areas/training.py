"""Training: fine-ranking accuracy (demo oracle, MovieLens) and the platform's training overhead.

Demo data: ``features.demo.generate`` at ``DEMO_SCALE`` (clicks drawn from a known logistic
model), laid out as a platform dataset (``training.synthetic``). A ``fine_ranking`` job runs
through the real platform path in the throwaway database: ``job_create`` -> placed on a node ->
``training.agent.execute_job`` (the Celery task's body), i.e. a ``python -m training.runner``
child with checkpoints, progress streamed to the database and MLflow, evaluation and the bundle.

Measures:

- ``oracle_auc_ratio``: that job's held-out AUC / the AUC of the generator's true click
  probabilities on the same held-out rows (goal >= 0.98).
- ``movielens_auc_fine`` / ``movielens_auc_lr``: MovieLens 100K (rating >= 4 is a click, the
  newest 20% of ratings held out), user and item ids, user attributes and item genres/year as
  features; fine ranking vs logistic regression, same epochs and seed (goal: fine > lr).
- ``samples_per_s_platform``: training samples per second of the platform job (its training
  loop and checkpoints included; the per-epoch held-out evaluation, the child's start-up and
  data load are not); ``samples_per_s_bare``: the same model, tensors, batch size, epochs and thread
  count in a bare PyTorch loop (no checkpoints, events or evaluation), in a process of its own
  with the same environment as the agent's child. Both run ``ROUNDS`` times, interleaved, the
  order alternating each round (the machine is shared and its load drifts); the measures are the
  medians. ``samples_per_cpu_s_platform`` / ``_bare``: the same samples per CPU second of the
  training process (``time.process_time``, every thread; evaluation excluded), and
  ``overhead_pct`` = 100 * (1 - the median over the rounds of platform / bare per CPU second)
  (goal <= 5), with the rounds' ``_min`` and ``_max``: the CPU a sample costs barely moves with
  the machine's other load, where the wall-clock rate does. ``overhead_pct_wall`` is the
  wall-clock figure, 100 * (1 - samples_per_s_platform / samples_per_s_bare); the per-round
  ratios go to ``parameters.round_ratios`` and ``round_cpu_ratios``.
- ``samples_per_s_cuda``: only where CUDA is available (the same job with ``device=cuda``),
  and ``cuda_over_cpu`` = ``samples_per_s_cuda`` / ``samples_per_s_platform`` (same job, same
  batch and thread count, on the CPU); elsewhere ``parameters.cuda_note`` says why they are
  missing. ``bench/cuda_check.py`` measures the same against the CPU per batch size without
  Django (for a GPU machine that has only torch).
- ``ddp_1rank_samples_per_s``, ``ddp_2rank_samples_per_s``: the demo job (its last round's spec,
  global batch ``DDP_BATCHES[0]``) trained by ``python -m training.runner`` with one and with two
  data-parallel ranks (``training.distributed``, gloo, one thread each), ``DDP_ROUNDS``
  interleaved rounds (``DDP_ROUNDS_OTHER`` at the other batch sizes), medians;
  ``ddp_scaling_efficiency`` = the median over the rounds of 2-rank / (2 x 1-rank), each round's
  two runs being neighbours in time (goal >= 0.85), with the rounds' ``_min`` and ``_max``, and
  ``ddp_scaling_efficiency_batch<B>`` per batch size;
  ``ddp_auc_1rank``, ``ddp_auc_2rank`` and their difference (goal: within 0.005). Per-round
  figures in ``parameters``.
- ``ddp_independent_halves_samples_per_s``: two one-rank runs of half the global batch each,
  started together with nothing shared (the ranks' own work, without their collective), summed;
  ``ddp_efficiency_ceiling`` = the median over the rounds of that / (2 x 1-rank), with ``_min``
  and ``_max``:
  what this machine allows any data-parallel scheme at this batch, since the ranks do that work
  and add their ``all_reduce`` to it (the goal sits above it where the ceiling is below 0.85).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import REPO_ROOT, Context

MOVIELENS_DIR = Path(
    os.environ.get("BENCH_MOVIELENS_DIR", REPO_ROOT.parent / "shared" / "data" / "movielens-100k")
)
DEMO_SCALE = 5.0
ROUNDS = 6
# Interleaved rounds of the data-parallel runs at the headline batch (3 rounds gave medians
# 8.4 points apart on two runs; a round is about 15 s), and at the other batch sizes.
DDP_ROUNDS = 7
DDP_ROUNDS_OTHER = 3
# Global batch sizes of the data-parallel measures: CTR batches as the BARS configs use them
# (16384, then 4096). A step's collective costs about 1.5-2 ms here (gloo over the loopback
# between two busy one-thread processes on two cores), so the efficiency is a function of the
# compute per step: about 0.84 at 16384, 0.5 at 4096 and 0.25 at the demo job's 512.
DDP_BATCHES = (16384, 4096)
SEED = 7
THREADS = 1
# Enough epochs that a run trains for seconds, not a fraction of one (the rate's noise).
DDP_PARAMS = {"threads": THREADS, "epochs": 20, "early_stopping_patience": 0}
HOLDOUT = 0.2
DEMO_PARAMS = {
    "epochs": 6,
    "batch_size": 512,
    "lr": 0.004,
    "seed": SEED,
    "threads": THREADS,
    "importance": False,
    "checkpoint_every_steps": 200,
    "log_every_steps": 20,
}
ML_PARAMS = {
    "epochs": 4,
    "batch_size": 512,
    "lr": 0.003,
    "seed": SEED,
    "threads": THREADS,
    "importance": False,
    "embedding_dim": 16,
    "weight_decay": 1e-6,
}
GENRES = [
    "unknown", "action", "adventure", "animation", "children", "comedy", "crime", "documentary",
    "drama", "fantasy", "film_noir", "horror", "musical", "mystery", "romance", "sci_fi",
    "thriller", "war", "western",
]  # fmt: skip


# --- MovieLens --------------------------------------------------------------------------------


def movielens_table():
    import pyarrow as pa

    users = {}
    for line in (MOVIELENS_DIR / "u.user").read_text().splitlines():
        uid, age, gender, occupation, _zip = line.split("|")
        users[uid] = (int(age), gender, occupation)
    items = {}
    for line in (MOVIELENS_DIR / "u.item").read_text(encoding="latin-1").splitlines():
        parts = line.split("|")
        flags = [int(x) for x in parts[5:24]]
        year = parts[2][-4:]
        genre = GENRES[flags.index(1)] if 1 in flags else "unknown"
        items[parts[0]] = (int(year) if year.isdigit() else None, genre, flags)
    rows = [line.split("\t") for line in (MOVIELENS_DIR / "u.data").read_text().splitlines()]
    rows.sort(key=lambda r: int(r[3]))
    uid = [r[0] for r in rows]
    iid = [r[1] for r in rows]
    columns: dict[str, Any] = {
        "user_id": pa.array(uid),
        "item_id": pa.array(iid),
        "event_time": pa.array([int(r[3]) * 1_000_000 for r in rows], pa.timestamp("us", "UTC")),
        "click": pa.array([int(int(r[2]) >= 4) for r in rows]),
        "ml_user__id": pa.array(uid),
        "ml_user__age": pa.array([users[u][0] for u in uid]),
        "ml_user__gender": pa.array([users[u][1] for u in uid]),
        "ml_user__occupation": pa.array([users[u][2] for u in uid]),
        "ml_item__id": pa.array(iid),
        "ml_item__year": pa.array([items[i][0] for i in iid], pa.int64()),
        "ml_item__genre": pa.array([items[i][1] for i in iid]),
    }
    for index, name in enumerate(GENRES):
        columns[f"ml_item__is_{name}"] = pa.array([bool(items[i][2][index]) for i in iid])
    return pa.table(columns)


def movielens_features() -> list[dict[str, Any]]:
    features = [
        ("ml_user:id", "categorical", "user"),
        ("ml_user:age", "int", "user"),
        ("ml_user:gender", "categorical", "user"),
        ("ml_user:occupation", "categorical", "user"),
        ("ml_item:id", "categorical", "item"),
        ("ml_item:year", "int", "item"),
        ("ml_item:genre", "categorical", "item"),
        *((f"ml_item:is_{name}", "bool", "item") for name in GENRES),
    ]
    return [
        {"ref": ref, "column": ref.replace(":", "__"), "dtype": dtype, "entity": entity}
        for ref, dtype, entity in features
    ]


def _train_in_process(spec) -> dict[str, Any]:
    from training import runner

    events: list[dict] = []
    code = runner.train(spec, emit=runner.Emitter(sink=events.append))
    if code != 0:
        raise RuntimeError(f"training {spec.template} exited with {code}: {events[-3:]}")
    return next(e for e in events if e["type"] == "done")["metrics"]


def run_movielens(ctx: Context) -> dict[str, float]:
    import pyarrow.parquet as pq

    from training.data import JobSpec

    path = ctx.workdir / "movielens.parquet"
    pq.write_table(movielens_table(), path)
    result = {}
    for template, key in (("fine_ranking", "movielens_auc_fine"), ("logreg", "movielens_auc_lr")):
        spec = JobSpec(
            job_id=0,
            template=template,
            dataset_path=str(path),
            features=movielens_features(),
            work_dir=str(ctx.workdir / f"ml-{template}"),
            label="click",
            params={**ML_PARAMS, "holdout_fraction": HOLDOUT},
        )
        started = time.perf_counter()
        metrics = _train_in_process(spec)
        result[key] = metrics["holdout"]["auc"]
        ctx.log(
            f"movielens {template}: AUC {result[key]:.4f} ({time.perf_counter() - started:.1f}s)"
        )
    return result


# --- the bare loop ----------------------------------------------------------------------------


def bare_samples_per_s(spec, params: dict[str, Any]) -> tuple[float, float]:
    """The same model on the same tensors in a plain PyTorch loop (no checkpoints, no events):
    samples per wall-clock second and per CPU second of the process."""
    import torch
    from torch.nn import functional as F

    from training import data
    from training.bundle import build_model

    torch.set_num_threads(int(params["threads"]))
    torch.manual_seed(SEED)
    loaded = data.load(spec)
    model = build_model(loaded.spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params["lr"]))
    dense, cat, label = loaded.train.dense, loaded.train.cat, loaded.train.label
    n, batch = loaded.train.n, int(params["batch_size"])
    model.train()
    samples = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for epoch in range(int(params["epochs"])):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(SEED + epoch))
        for start in range(0, n, batch):
            index = perm[start : start + batch]
            loss = F.binary_cross_entropy_with_logits(model(dense[index], cat[index]), label[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            samples += int(index.shape[0])
    return samples / (time.perf_counter() - started), samples / (time.process_time() - cpu_started)


def bare_main(path: str) -> None:
    """Entry of the bare loop's own process: print its samples per second and per CPU second."""
    from training.data import JobSpec

    spec = JobSpec.from_json(Path(path).read_text())
    print(*bare_samples_per_s(spec, spec.params), flush=True)


def bare_in_child(spec) -> tuple[float, float]:
    """The bare loop in a fresh process with the agent child's environment (one thread, no
    GPU), so both sides pay the same process set-up and neither shares the bench's process."""
    import subprocess
    import sys

    path = Path(f"{spec.work_dir}.json")
    path.write_text(spec.to_json())
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(THREADS))
    code = "import sys; from bench.areas.training import bare_main; bare_main(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        cwd=str(REPO_ROOT),
        env=env,
        check=True,
        timeout=600,
    )
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


# --- the platform job -------------------------------------------------------------------------


def _runner_child(spec) -> dict[str, Any]:
    """``spec`` trained by ``python -m training.runner`` in a process of its own, as the agent
    starts it (rank 0 in the bench's own process, beside Django, ran its ranks at half speed)."""
    return _concurrent_runner_children([spec])[0]


def _concurrent_runner_children(specs: list) -> list[dict[str, Any]]:
    """Each spec trained by its own ``python -m training.runner``, all started together and
    nothing shared between them; their metrics, in order."""
    import json
    import subprocess
    import sys

    procs = []
    for spec in specs:
        work = Path(spec.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        path = work / "spec.json"
        path.write_text(spec.to_json())
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "training.runner", str(path)],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        finished = [e for e in events if e["type"] == "done"]
        if proc.returncode != 0 or not finished:
            raise RuntimeError(f"runner exited with {proc.returncode}: {stderr[-2000:]}")
        out.append(finished[0]["metrics"])
    return out


def run_ddp(ctx: Context, spec) -> dict[str, float]:
    """The demo job with 1 and with 2 data-parallel ranks (``training.distributed``, gloo), one
    thread each, ``DDP_ROUNDS`` interleaved rounds, for each batch size of ``DDP_BATCHES``:
    global training samples per second (rank 0's count of every rank's rows) and the held-out
    AUC of each. The first batch size gives the headline measures."""
    from dataclasses import replace

    out: dict[str, float] = {}
    for batch in DDP_BATCHES:
        rates: dict[int, list[float]] = {1: [], 2: []}
        aucs: dict[int, list[float]] = {1: [], 2: []}
        ceiling: list[float] = []
        rounds = DDP_ROUNDS if batch == DDP_BATCHES[0] else DDP_ROUNDS_OTHER
        for round_ in range(rounds):
            if batch == DDP_BATCHES[0]:
                # The same per-rank work with no collective at all: two independent one-rank
                # runs of half the batch each, side by side. No data-parallel scheme can beat
                # their summed rate on this machine (the ranks compute exactly that, and add
                # their all_reduce), so its ratio to 2 x 1-rank bounds the scaling efficiency.
                halves = [
                    replace(
                        spec,
                        workers=1,
                        work_dir=str(ctx.workdir / f"ddp-ceiling-{round_}-{i}"),
                        params={**spec.params, **DDP_PARAMS, "batch_size": batch // 2},
                    )
                    for i in range(2)
                ]
                both = _concurrent_runner_children(halves)
                ceiling.append(sum(m["train_samples_per_s"] for m in both))
                ctx.log(f"ddp batch {batch} round {round_}: independent halves {ceiling[-1]:.0f}/s")
                for half in halves:
                    shutil.rmtree(half.work_dir, ignore_errors=True)
            for workers in (1, 2) if round_ % 2 == 0 else (2, 1):
                work = ctx.workdir / f"ddp-{batch}-{workers}-{round_}"
                job = replace(
                    spec,
                    workers=workers,
                    work_dir=str(work),
                    params={**spec.params, **DDP_PARAMS, "batch_size": batch},
                )
                metrics = _runner_child(job)
                rates[workers].append(metrics["train_samples_per_s"])
                aucs[workers].append(metrics["holdout"]["auc"])
                ctx.log(
                    f"ddp batch {batch} round {round_}: {workers} rank(s) "
                    f"{rates[workers][-1]:.0f}/s, AUC {aucs[workers][-1]:.4f}"
                )
                shutil.rmtree(work, ignore_errors=True)
        one, two = float(np.median(rates[1])), float(np.median(rates[2]))
        # Each round's 1-rank and 2-rank runs are neighbours in time: their ratio cancels the
        # machine's drift between rounds, and the median of those ratios is the headline.
        per_round = [b / (2 * a) for a, b in zip(rates[1], rates[2], strict=True)]
        ctx.parameters[f"ddp_rates_batch{batch}"] = rates
        ctx.parameters[f"ddp_scaling_per_round_batch{batch}"] = per_round
        out[f"ddp_scaling_efficiency_batch{batch}"] = float(np.median(per_round))
        if batch == DDP_BATCHES[0]:
            bound = [c / (2 * a) for a, c in zip(rates[1], ceiling, strict=True)]
            ctx.parameters["ddp_ceiling_rates"] = ceiling
            ctx.parameters["ddp_efficiency_ceiling_per_round"] = bound
            out.update(
                ddp_independent_halves_samples_per_s=float(np.median(ceiling)),
                ddp_efficiency_ceiling=float(np.median(bound)),
                ddp_efficiency_ceiling_min=min(bound),
                ddp_efficiency_ceiling_max=max(bound),
                ddp_1rank_samples_per_s=one,
                ddp_2rank_samples_per_s=two,
                ddp_scaling_efficiency=float(np.median(per_round)),
                ddp_scaling_efficiency_min=min(per_round),
                ddp_scaling_efficiency_max=max(per_round),
                ddp_auc_1rank=float(np.mean(aucs[1])),
                ddp_auc_2rank=float(np.mean(aucs[2])),
                ddp_auc_2rank_minus_1rank=float(np.mean(aucs[2]) - np.mean(aucs[1])),
            )
    return out


def _platform_job(workspace, dataset, node, params: dict[str, Any], name: str):
    from training import agent
    from training.services import job_create
    from training.tests.factories import place

    job = job_create(
        actor=None,
        workspace=workspace,
        name=name,
        dataset=dataset,
        template="fine_ranking",
        params={**params, "holdout_fraction": HOLDOUT},
        cpu_milli=THREADS * 1000,
    )
    place(job, node)
    state = agent.execute_job(job.pk)
    job.refresh_from_db()
    if state != "succeeded":
        raise RuntimeError(f"platform job {job.pk} ended {state}: {job.state_reason}")
    return job


def _run(ctx: Context) -> dict[str, float]:
    from django.test import override_settings

    artifacts = ctx.workdir / "artifacts"
    mlflow_dir = ctx.workdir / "mlflow"
    mlflow_dir.mkdir(parents=True, exist_ok=True)
    with override_settings(
        ARTIFACT_ROOT=str(artifacts),
        MLFLOW_TRACKING_URI=f"sqlite:///{mlflow_dir / 'mlflow.db'}",
        MLFLOW_ARTIFACT_ROOT=str(mlflow_dir / "artifacts"),
    ):
        return _run_with_settings(ctx)


def _run_with_settings(ctx: Context) -> dict[str, float]:
    from features.samples import dataset_file
    from training import agent, synthetic
    from training.tests.factories import make_demo_dataset, make_node
    from workspaces.testing.factories import make_workspace

    measures: dict[str, float] = {}
    measures.update(run_movielens(ctx))

    workspace = make_workspace()
    dataset = make_demo_dataset(workspace, scale=DEMO_SCALE, name="bench_demo")
    node = make_node("bench-node")
    path = dataset_file(dataset)
    oracle = synthetic.oracle_auc(path, HOLDOUT)
    ctx.log(f"demo dataset: {dataset.row_count} rows, oracle AUC {oracle:.4f}")

    platform_rates, bare_rates, aucs = [], [], []
    platform_cpu, bare_cpu = [], []
    spec = None
    for round_ in range(ROUNDS):
        # Alternate which side goes first, so a drift in the machine's load favours neither.
        bare_first = round_ % 2 == 1 and spec is not None
        if bare_first:
            wall, cpu = bare_in_child(spec)
            bare_rates.append(wall)
            bare_cpu.append(cpu)
        job = _platform_job(workspace, dataset, node, DEMO_PARAMS, f"bench-{round_}")
        platform_rates.append(job.metrics["train_samples_per_s"])
        platform_cpu.append(job.metrics["train_samples_per_cpu_s"])
        aucs.append(job.metrics["holdout"]["auc"])
        spec = agent.build_job_spec(job)
        spec.work_dir = str(ctx.workdir / f"bare-{round_}")
        if not bare_first:
            wall, cpu = bare_in_child(spec)
            bare_rates.append(wall)
            bare_cpu.append(cpu)
        ctx.log(
            f"round {round_}: platform {platform_rates[-1]:.0f}/s "
            f"({platform_cpu[-1]:.0f}/CPU s, AUC {aucs[-1]:.4f}), "
            f"bare {bare_rates[-1]:.0f}/s ({bare_cpu[-1]:.0f}/CPU s)"
        )
        shutil.rmtree(spec.work_dir, ignore_errors=True)
    platform, bare = float(np.median(platform_rates)), float(np.median(bare_rates))
    ratios = [p / b for p, b in zip(platform_rates, bare_rates, strict=True)]
    cpu_ratios = [p / b for p, b in zip(platform_cpu, bare_cpu, strict=True)]
    measures["oracle_auc"] = oracle
    measures["fine_auc_demo"] = float(np.mean(aucs))
    measures["oracle_auc_ratio"] = float(np.mean(aucs)) / oracle
    measures["samples_per_s_platform"] = platform
    measures["samples_per_s_bare"] = bare
    measures["samples_per_cpu_s_platform"] = float(np.median(platform_cpu))
    measures["samples_per_cpu_s_bare"] = float(np.median(bare_cpu))
    # The overhead is the CPU the platform's child spends per sample beyond the bare loop's:
    # a process's CPU time per sample barely moves with the machine's other load, where its
    # wall-clock rate does (two runs of the wall-clock figure gave 2.2% and 7.2%, earlier 28% and
    # -5%). Median of the rounds' paired ratios, with their spread; the wall-clock figure beside.
    measures["overhead_pct"] = 100.0 * (1.0 - float(np.median(cpu_ratios)))
    measures["overhead_pct_min"] = 100.0 * (1.0 - max(cpu_ratios))
    measures["overhead_pct_max"] = 100.0 * (1.0 - min(cpu_ratios))
    measures["overhead_pct_wall"] = 100.0 * (1.0 - platform / bare)

    assert spec is not None
    measures.update(run_ddp(ctx, spec))

    import torch

    if torch.cuda.is_available():
        node.gpus = agent.find_gpus()
        node.save()
        job = _platform_job(
            workspace, dataset, node, {**DEMO_PARAMS, "device": "cuda"}, "bench-cuda"
        )
        measures["samples_per_s_cuda"] = job.metrics["train_samples_per_s"]
        measures["cuda_over_cpu"] = measures["samples_per_s_cuda"] / platform
    else:
        ctx.parameters["cuda_note"] = (
            "samples_per_s_cuda and cuda_over_cpu skipped: torch.cuda.is_available() is False"
        )
    ctx.parameters.update(
        {
            "demo_scale": DEMO_SCALE,
            "demo_params": DEMO_PARAMS,
            "movielens_params": ML_PARAMS,
            "rounds": ROUNDS,
            "platform_rates": platform_rates,
            "bare_rates": bare_rates,
            "round_ratios": ratios,
            "platform_cpu_rates": platform_cpu,
            "bare_cpu_rates": bare_cpu,
            "round_cpu_ratios": cpu_ratios,
            "overhead_pct_median_of_ratios": 100.0 * (1.0 - float(np.median(ratios))),
            "cuda": torch.cuda.is_available(),
            "goals": {
                "oracle_auc_ratio>=0.98": measures["oracle_auc_ratio"] >= 0.98,
                "movielens_fine>lr": measures["movielens_auc_fine"] > measures["movielens_auc_lr"],
                "overhead_pct<=5": measures["overhead_pct"] <= 5.0,
                "ddp_scaling_efficiency>=0.85": measures["ddp_scaling_efficiency"] >= 0.85,
                "ddp_auc_within_0.005": abs(measures["ddp_auc_2rank_minus_1rank"]) <= 0.005,
            },
        }
    )
    for goal, met in ctx.parameters["goals"].items():
        ctx.log(f"goal {goal}: {'met' if met else 'NOT met'}")
    return measures


def run(ctx: Context) -> dict[str, float]:
    return _run(ctx)
