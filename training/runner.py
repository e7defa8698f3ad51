"""The training child: ``python -m training.runner <work_dir>/spec.json``.

The node agent starts it with the job's devices (``CUDA_VISIBLE_DEVICES``) and reads its stdout:
one JSON object per line (``progress``, ``metric``, ``checkpoint``, ``log``, ``done``,
``stopped``). It never touches the database; the agent owns the job row and MLflow.

Checkpoints (``<work_dir>/checkpoint.pt``) are written to a temporary name and renamed, every
``checkpoint_every_steps`` steps or ``checkpoint_every_s`` seconds and on SIGTERM; they hold the
model and optimiser state, the step (which fixes the data position, see ``data.BatchOrder``), the
torch RNG state, the fitted bundle spec and the early-stopping state (the best epoch's model so
far). A restarted run loads it and continues from the same step, so an interrupted run ends with
the same model as an uninterrupted one with the same seed.

Early stopping and calibration read only the validation rows (``data.load``): after each epoch
the runner scores them (``val_auc``/``val_logloss`` metrics), keeps the best epoch's weights by
``early_stopping_metric``, stops after ``early_stopping_patience`` epochs without improvement and
restores the best weights; then it fits ``calibration`` on the validation logits and stores it in
the bundle. The test rows (``holdout``) are read for reporting only: the per-epoch held-out
curves and the final evaluation.

Gradient-boosted trees (template ``lightgbm``) take another loop with the same contract:
``training.gbdt`` (boosting rounds as steps, the booster's text model in the checkpoint); so
does the fine-tuning of a language model on a record set (templates ``lm_lora``: LoRA, and
``lm_full``: every weight): ``training.lm``.

Exit codes: 0 done, ``EXIT_STOPPED`` checkpointed and stopped on SIGTERM, anything else failed.

User entry points follow the same contract as a template: the module (dotted path or a ``.py``
file) defines ``build(spec: BundleSpec) -> torch.nn.Module`` (``forward(dense, cat)`` -> logits,
optionally ``training_loss(dense, cat, label)``); it is registered as template ``entry_point``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_STOPPED = 3
CHECKPOINT_FORMAT = "rankops-checkpoint/1"


class Emitter:
    """JSON lines to a stream (the agent reads them); a callable sink in-process."""

    def __init__(self, sink: Callable[[dict], None] | None = None, stream=None) -> None:
        self.sink = sink
        self.stream = stream

    def __call__(self, kind: str, **data: Any) -> None:
        event = {"type": kind, **data}
        if self.sink is not None:
            self.sink(event)
        if self.stream is not None:
            self.stream.write(json.dumps(event, default=float) + "\n")
            self.stream.flush()


class StopFlag:
    def __init__(self) -> None:
        self.requested = False

    def set(self, *_args) -> None:
        self.requested = True


def load_entry_point(target: str) -> None:
    """Import user code and register its ``build`` as the ``entry_point`` template."""
    from training.bundle import register_template

    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("rankops_entry_point", target)
        if module_spec is None or module_spec.loader is None:
            raise RuntimeError(f"cannot load entry point {target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    build = getattr(module, "build", None)
    if not callable(build):
        raise RuntimeError("an entry point must define build(spec) -> torch.nn.Module")
    register_template("entry_point")(build)


def improves(metric: str, value: float | None, best: float | None) -> bool:
    """Whether a validation ``value`` beats ``best`` (higher AUC, lower log loss); no value (one
    class) or NaN never does. Early stopping by epoch (here) and by round (``gbdt``) share it."""
    if value is None or value != value:
        return False
    if best is None:
        return True
    return value > best if metric == "auc" else value < best


def job_data(job, *, checkpoint: dict | None, base, emit):
    """The job's rows (``data.load``) with the spec it runs with: a resumed run's from its
    checkpoint, an incremental one's from its base model (the base's encoding: buckets,
    mean/std), else fitted on the data. The torch and boosted-trees loops share it. None after
    telling the agent why for data the job cannot use or without training rows (the caller
    exits 2)."""
    from training import data
    from training.bundle import BundleSpec

    spec = None
    if checkpoint is not None:
        spec = BundleSpec.from_json(json.loads(checkpoint["spec"]))
    elif base is not None:
        spec = base.spec
        spec.template = job.template or spec.template
    started = time.monotonic()
    try:
        loaded = data.load(job, spec=spec)
    except data.DataError as exc:
        emit("error", message=str(exc))
        return None
    emit(
        "log",
        message=f"data: {loaded.train.n} train rows, {loaded.validation.n} validation, "
        f"{loaded.holdout.n} held out ({time.monotonic() - started:.2f}s)",
    )
    if loaded.train.n == 0:
        emit("log", message="the dataset has no training rows")
        return None
    # A base model's calibration belongs to the base model: this run fits its own (or none).
    loaded.spec.extra = {
        **{k: v for k, v in loaded.spec.extra.items() if k != "calibration"},
        "job_id": job.job_id,
    }
    return loaded


class CheckpointedStopping:
    """What early stopping by epoch (here) and by round (``gbdt.RoundStopping``) share: the
    comparison by metric and the state a checkpoint keeps, named by ``STATE`` (the checkpoint's
    keys, so a resumed run goes on from the same best), ``COUNTER`` the steps since the best."""

    STATE: tuple[str, ...] = ()
    COUNTER = ""
    metric: str
    best_value: float | None
    stopped: bool
    curve: list[list[float]]

    def _better(self, value: float | None) -> bool:
        return improves(self.metric, value, self.best_value)

    def final_curve(self) -> list[list[float]]:
        """The curve the run reports: every point seen."""
        return self.curve

    def state(self) -> dict[str, Any]:
        """The checkpoint's copy of the state (JSON- or torch-serialisable)."""
        return {name: getattr(self, name) for name in self.STATE}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Back to a checkpoint's state (nothing for a run without one)."""
        if not state:
            return
        for name in self.STATE:
            setattr(self, name, state.get(name))
        setattr(self, self.COUNTER, int(getattr(self, self.COUNTER) or 0))
        self.stopped = bool(self.stopped)
        self.curve = [list(point) for point in self.curve or []]


class EarlyStopping(CheckpointedStopping):
    """The best epoch so far by a validation metric, its weights (on the CPU) and the count of
    epochs since; ``stopped`` once ``patience`` epochs in a row did not improve (0: never)."""

    STATE = ("best_value", "best_epoch", "best_state", "bad_epochs", "stopped", "curve")
    COUNTER = "bad_epochs"

    def __init__(self, *, metric: str, patience: int) -> None:
        if metric not in {"auc", "logloss"}:
            raise ValueError(f"unknown early_stopping_metric {metric!r}; use auc or logloss")
        self.metric = metric
        self.patience = patience
        self.best_value: float | None = None
        self.best_epoch: float | None = None
        self.best_state: dict | None = None
        self.bad_epochs = 0
        self.stopped = False
        self.curve: list[list[float]] = []  # [epoch, value]

    def update(self, epoch: float, value: float | None, model) -> None:
        epoch = int(epoch) if float(epoch).is_integer() else round(epoch, 6)
        self.curve.append([epoch, value])
        if self._better(value):
            self.best_value, self.best_epoch, self.bad_epochs = value, epoch, 0
            self.best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            return
        self.bad_epochs += 1
        if self.patience and self.bad_epochs >= self.patience:
            self.stopped = True


def _atomic_save(obj: Any, path: Path) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def checkpoint_write(job, emit, *, step: int, spec, stopping, parts: dict[str, Any]) -> None:
    """Write the job's checkpoint whole (a temporary file renamed over it, so a kill leaves the
    previous one) with what every loop keeps, the step, the spec and the early-stopping state,
    and the loop's own ``parts`` (format, model, optimiser, ...); then tell the agent."""
    _atomic_save(
        {
            **parts,
            "step": step,
            "spec": json.dumps(spec.to_json()),
            "early_stopping": stopping.state(),
        },
        job.checkpoint_file,
    )
    emit("checkpoint", step=step, path=str(job.checkpoint_file))


def _device(job) -> Any:
    import torch

    wanted = str(job.param("device", "auto"))
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(wanted)


def train(job, *, emit: Emitter, stop: StopFlag | None = None) -> int:
    """Run (or resume) the job described by ``job`` (a ``data.JobSpec``). Returns an exit code."""
    import torch
    from torch.nn import functional as F

    from training import data, distributed, evaluation
    from training.bundle import (
        apply_calibration,
        build_model,
        is_language_model,
        load_bundle,
        template_kind,
    )

    stop = stop or StopFlag()
    if not job.entry_point and is_language_model(job.template):
        from training import lm

        return lm.train(job, emit=emit, stop=stop)
    if not job.entry_point:
        from training.bundle import averaged_members

        if averaged_members(job.template, job.params) > 1:
            return train_members(job, emit=emit, stop=stop)
    if not job.entry_point and template_kind(job.template) == "gbdt":
        from training import gbdt

        return gbdt.train(job, emit=emit, stop=stop)
    seed = int(job.param("seed", 0))
    threads = int(job.param("threads", 0))
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if job.entry_point:
        load_entry_point(job.entry_point)
    device = _device(job)
    work = Path(job.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    checkpoint = None
    if job.checkpoint_file.exists():
        checkpoint = torch.load(job.checkpoint_file, map_location="cpu", weights_only=True)
        if checkpoint.get("format") != CHECKPOINT_FORMAT:
            checkpoint = None
    base = load_bundle(job.base_model_path) if job.base_model_path and checkpoint is None else None

    loaded = job_data(job, checkpoint=checkpoint, base=base, emit=emit)
    if loaded is None:
        return 2
    spec = loaded.spec
    validation = loaded.validation

    model = build_model(spec)
    if base is not None:
        model.load_state_dict(base.model.state_dict())
        emit("log", message=f"incremental: starting from {job.base_model_path}")
    model.to(device)
    if str(job.param("solver", getattr(model, "default_solver", "adam"))) == "lbfgs":
        if distributed.world_of(job, device) > 1:
            emit("log", message="the lbfgs solver trains in one process; workers ignored")
        return train_convex(job, model=model, loaded=loaded, seed=seed, emit=emit)
    group = distributed.start(job, device=device, emit=emit)
    if group.active and device.type == "cuda":
        device = torch.device("cuda", group.rank % torch.cuda.device_count())
        model.to(device)
    if group.active:
        emit("log", message=f"data-parallel: {group.world} ranks ({group.backend})")
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=float(job.param("lr", 0.01)),
        weight_decay=float(job.param("weight_decay", 0.0)),
    )
    order = data.BatchOrder(loaded.train.n, int(job.param("batch_size", 512)), seed)
    epochs = int(job.param("epochs", 2))
    total = int(job.param("max_steps", 0)) or epochs * order.steps_per_epoch
    step = 0
    stopping = EarlyStopping(
        metric=str(job.param("early_stopping_metric", "logloss")),
        patience=int(job.param("early_stopping_patience", 2)) if validation.n else 0,
    )
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = int(checkpoint["step"])
        torch.set_rng_state(checkpoint["rng"])
        stopping.restore(checkpoint.get("early_stopping"))
        emit("log", message=f"resumed from checkpoint at step {step}")
    distributed.check_same_step(group, step)
    # Data-parallel: the gradients live in one flat buffer the collective reduces in place.
    grads = distributed.gradient_buffer(group, model)

    train_x = loaded.train
    dense_all, cat_all, y_all = (
        train_x.dense.to(device),
        train_x.cat.to(device),
        train_x.label.to(device),
    )
    every_steps = int(job.param("checkpoint_every_steps", 200))
    every_s = float(job.param("checkpoint_every_s", 30.0))
    log_every = max(1, int(job.param("log_every_steps", 10)))
    custom_loss = getattr(model, "training_loss", None)
    # A throttle for demos and tests that need a run to last a while (0: full speed).
    step_sleep_s = float(job.param("step_sleep_s", 0.0))
    epoch_eval = bool(job.param("epoch_eval", True))
    eval_s = 0.0

    def save_checkpoint(at: int) -> None:
        parts = {
            "format": CHECKPOINT_FORMAT,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
        }
        checkpoint_write(job, emit, step=at, spec=spec, stopping=stopping, parts=parts)

    emit(
        "start",
        total_steps=total,
        step=step,
        steps_per_epoch=order.steps_per_epoch,
        train_rows=train_x.n,
        validation_rows=validation.n,
        holdout_rows=loaded.holdout.n,
        device=str(device),
        workers=group.world,
    )
    model.train()
    window_start, window_samples = time.monotonic(), 0
    train_start, train_samples = time.monotonic(), 0
    # This process's CPU time (every thread) spent training: a rate that the machine's other
    # load moves far less than the wall clock's (the training bench's overhead_pct reads it).
    cpu_start, eval_cpu_s = time.process_time(), 0.0
    last_checkpoint = time.monotonic()
    running_loss, running_n = 0.0, 0
    val_dense, val_cat = validation.dense.to(device), validation.cat.to(device)
    val_y = validation.label.numpy()

    def validate(at: int) -> None:
        """Score the validation rows (raw model) and let early stopping see the result."""
        logits = evaluation.predict_logits(model, val_dense, val_cat)
        prob = apply_calibration(logits, None)
        values = {"auc": evaluation.auc(val_y, prob), "logloss": evaluation.logloss(val_y, prob)}
        emit("metric", step=at, name="val_auc", value=values["auc"])
        emit("metric", step=at, name="val_logloss", value=values["logloss"])
        stopping.update(at / order.steps_per_epoch, values[stopping.metric], model)

    def rows_of(at: int) -> tuple[Any, Any, Any, Any, Any]:
        """Step ``at``'s batch (every rank's rows), this rank's share of it and those rows."""
        batch = order.indices(at)
        index = distributed.shard(group, batch).to(device)
        return batch, index, dense_all[index], cat_all[index], y_all[index]

    ahead: tuple[Any, ...] | None = None  # this step's rows, read during the last collective
    while step < total:
        if not group.active:
            if stopping.stopped:
                break
            if stop.requested:
                save_checkpoint(step)
                emit("stopped", step=step)
                return EXIT_STOPPED
        batch, index, dense, cat, label = ahead if ahead is not None else rows_of(step)
        ahead = None
        if custom_loss is not None:
            loss = custom_loss(dense, cat, label)
        else:
            loss = F.binary_cross_entropy_with_logits(model(dense, cat), label)
        if grads is not None:
            grads.zero()
        else:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        rows = int(index.shape[0])
        step_loss = float(loss.detach()) * rows
        if group.active:
            # One collective: the mean gradient, rank 0's decisions and the step's loss over
            # every rank's rows. A decision takes effect before this step is applied.
            sync = distributed.synchronise(
                group,
                model,
                stop=stop.requested,
                stopped_early=stopping.stopped,
                loss_sum=step_loss,
                rows=rows,
                buffer=grads,
                during=functools.partial(rows_of, step + 1) if step + 1 < total else None,
            )
            ahead = sync.during
            if sync.stopped_early:
                break
            if sync.stop:
                if group.leader:
                    save_checkpoint(step)
                    emit("stopped", step=step)
                distributed.finish(group)
                return EXIT_STOPPED
            step_loss, rows = sync.loss_sum, sync.rows
        optimizer.step()
        step += 1
        if step_sleep_s:
            time.sleep(step_sleep_s)
        if not group.leader:
            continue  # rank 0 reports, validates and checkpoints for the job
        running_loss += step_loss
        running_n += rows
        log_now = step % log_every == 0 or step == total
        window_samples += int(batch.shape[0])
        train_samples += int(batch.shape[0])
        epoch, _ = order.position(step - 1)
        if log_now:
            now = time.monotonic()
            rate = window_samples / max(now - window_start, 1e-9)
            steps_left = total - step
            per_step = (now - train_start) / max(step - (checkpoint or {}).get("step", 0), 1)
            emit(
                "progress",
                step=step,
                total_steps=total,
                epoch=epoch,
                loss=running_loss / max(running_n, 1),
                samples_per_s=rate,
                eta_s=steps_left * per_step,
                gpu_memory_mb=(
                    torch.cuda.max_memory_allocated(device) // (1024 * 1024)
                    if device.type == "cuda"
                    else 0
                ),
            )
            window_start, window_samples = now, 0
            running_loss, running_n = 0.0, 0
        # The epoch's evaluation comes before its checkpoint, so a checkpoint at an epoch's
        # end holds that epoch's early-stopping decision.
        if step % order.steps_per_epoch == 0:
            eval_start, eval_cpu_start = time.monotonic(), time.process_time()
            if validation.n and (epoch_eval or stopping.patience):
                validate(step)
            if loaded.holdout.n and epoch_eval:
                # Reported only: nothing is chosen by the test rows.
                prob = evaluation.predict(
                    model, loaded.holdout.dense.to(device), loaded.holdout.cat.to(device)
                )
                y = loaded.holdout.label.numpy()
                emit("metric", step=step, name="holdout_auc", value=evaluation.auc(y, prob))
                emit("metric", step=step, name="holdout_logloss", value=evaluation.logloss(y, prob))
            eval_s += time.monotonic() - eval_start
            eval_cpu_s += time.process_time() - eval_cpu_start
        if (step < total and not stopping.stopped) and (
            step % every_steps == 0 or time.monotonic() - last_checkpoint >= every_s
        ):
            save_checkpoint(step)
            last_checkpoint = time.monotonic()
    # Training throughput: the time spent in evaluation between epochs is not training time,
    # nor is waiting for the other ranks to exit.
    elapsed = time.monotonic() - train_start - eval_s
    train_rate = train_samples / elapsed if elapsed > 0 else 0.0
    train_cpu_s = time.process_time() - cpu_start - eval_cpu_s
    failed = distributed.finish(group)
    if not group.leader:
        return 0
    if failed:
        emit("error", message=f"a training rank exited with code {failed}")
        return 1
    if stopping.patience and step % order.steps_per_epoch and not stopping.stopped:
        validate(step)  # a run cut by max_steps: its last, partial epoch counts too
    save_checkpoint(step)

    if stopping.patience and stopping.best_state is not None:
        model.load_state_dict(stopping.best_state)
    model.to("cpu")
    metrics: dict[str, Any] = {
        "train_samples_per_s": train_rate,
        # Samples per CPU second of this process (rank 0's own, in a data-parallel run).
        "train_samples_per_cpu_s": train_samples / train_cpu_s if train_cpu_s > 0 else 0.0,
        "steps": step,
        "epoch_eval_s": eval_s,
        "best_epoch": stopping.best_epoch if stopping.patience else None,
        "stopped_early": stopping.stopped,
    }
    return finish_run(job, model, loaded, metrics, stopping, step=step, seed=seed, emit=emit)


# A member's checkpoint stays in its folder: the agent copies the job's own checkpoint file,
# which a members run does not write (a run moved to another node starts its members again).
MEMBER_EVENTS = ("log", "progress", "metric", "error")
# A cross-fitted run's out-of-fold logits, in its work folder (``train_members``).
OUT_OF_FOLD_FILE = "out_of_fold.npz"


def train_members(job, *, emit: Emitter, stop: StopFlag) -> int:
    """A run that averages models (``members`` > 1, or ``cv_folds`` >= 2): each member is a run
    of its own (``train`` with ``members`` 1, the seed + its number, in ``member-<i>/`` of the
    work folder, no calibration and no test rows), then their average (``Averaged``) is
    calibrated, evaluated and saved as the job's bundle by ``finish_run``, like any model.

    With ``cv_folds`` k, member i is fold i's model (``cv_fold`` i: never trained or stopped
    on fold i; ``training.data.cv_split``), and the run's validation rows are the whole pool
    scored out of fold: each row by the member that neither trained nor stopped on it. The
    calibration is fitted on those logits and the validation metrics (what the tuner reads)
    are theirs. (The average's logit on a pooled row also holds the k - 1 members that trained
    on it, so the out-of-fold figures describe one member's error more than the average's,
    which is as good or better: they are conservative, as bagging's out-of-bag estimates are.)

    A stopped run resumes where it was: finished members are loaded from their bundles, the
    interrupted one goes on from its own checkpoint. Progress counts the steps of all members
    (one member's total times the members); the validation curve shown is the first member's."""
    from dataclasses import replace

    import numpy as np

    from training import data, evaluation
    from training.bundle import averaged_members, load_bundle, template_kind
    from training.templates.inputs import Averaged

    folds = data.cv_folds(job)
    count = averaged_members(job.template, job.params)
    seed = int(job.param("seed", 0))
    if job.base_model_path:
        emit("error", message="members > 1 cannot start from a base model: train with members 1")
        return 2
    if folds and int(job.param("members", 1) or 1) > 1:
        emit("error", message="cv_folds and members > 1 cannot be combined: the folds' models "
             "are the members; give one of them")  # fmt: skip
        return 2
    work = Path(job.work_dir)
    models = []
    for i in range(count):
        member = replace(
            job,
            work_dir=str(work / f"member-{i}"),
            params={
                **job.params,
                "members": 1,
                "seed": seed + i,
                "calibration": "none",
                "importance": False,
                **({"cv_fold": i} if folds else {}),
            },
        )
        done_marker = Path(member.work_dir) / "member-done"
        if not done_marker.exists():
            code = train(member, emit=_member_emitter(emit, i, count, cv=bool(folds)), stop=stop)
            if code != 0:
                return code
            done_marker.write_text("")
        models.append(load_bundle(member.model_dir).model)
        what = f"fold {i + 1} of {count}" if folds else f"member {i + 1} of {count}"
        emit("log", message=f"{what} trained (seed {seed + i})")
    loaded = job_data(job, checkpoint=None, base=None, emit=emit)
    if loaded is None:
        return 2
    if template_kind(job.template) == "gbdt":  # one booster of all the folds' trees
        from training.templates.lightgbm import averaged

        model = averaged(models, loaded.spec)
    else:
        model = Averaged(models)
    model.eval()
    stopping = EarlyStopping(metric=str(job.param("early_stopping_metric", "logloss")), patience=0)
    metrics: dict[str, Any] = {"members": count}
    out_of_fold = None
    if folds:
        pooled = loaded.train  # the pool, in its order (``data.cv_split``)
        which = data.cv_fold_of(pooled.n, folds)
        logits = np.empty(pooled.n, dtype=np.float64)
        for i, member_model in enumerate(models):
            rows = np.flatnonzero(which == i)
            logits[rows] = evaluation.predict_logits(
                member_model, pooled.dense[rows], pooled.cat[rows]
            )
        out_of_fold = (pooled.label.numpy(), logits)
        metrics["cv_folds"] = folds
        # For whoever compares or stacks models on these rows (the quality bench does): each
        # pooled row's position in the dataset (time order), label and out-of-fold logit.
        np.savez(
            work / OUT_OF_FOLD_FILE,
            positions=np.asarray(loaded.rows["train"]),
            label=out_of_fold[0],
            logit=logits,
        )
    return finish_run(
        job, model, loaded, metrics, stopping, step=0, seed=seed, emit=emit, scored=out_of_fold
    )


def _member_emitter(emit: Emitter, index: int, count: int, *, cv: bool = False) -> Emitter:
    """A member's events as the job's: its steps offset by the members before it, totals
    times the members, its start and done kept to itself (the job has one of each). A fold's
    validation rows are one of ``count`` folds: the run's (out of fold) are about ``count``
    times as many, which is what ``start`` says (the tuner caps its trials by them)."""

    def forward(event: dict) -> None:
        kind, data = event["type"], {k: v for k, v in event.items() if k != "type"}
        if kind == "start" and index == 0:
            data = {**data, "total_steps": int(data.get("total_steps", 0)) * count}
            if cv and data.get("validation_rows") is not None:
                data["validation_rows"] = int(data["validation_rows"]) * count
            emit("start", **data)
            return
        if kind not in MEMBER_EVENTS:
            return
        if kind == "metric" and index:
            return
        if kind == "progress":
            total = int(data.get("total_steps", 0))
            data = {
                **data,
                "step": int(data.get("step", 0)) + index * total,
                "total_steps": total * count,
            }
        emit(kind, **data)

    return Emitter(sink=forward)


def fit_convex(model, dense, cat, label, *, l2: float, max_iter: int) -> dict[str, float]:
    """Minimise the mean log loss plus ``l2``/2 times the squared weights (biases unpenalised)
    with full-batch L-BFGS (strong-Wolfe line search) to convergence: the fit of scikit-learn's
    ``LogisticRegression`` (C = 1 / (l2 * rows)), in torch so the model and its bundle are the
    template's own. Returns the final penalised loss and the iterations it took."""
    import torch
    from torch.nn import functional as F

    params = list(model.parameters())
    penalised = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    optimizer = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-7,
        tolerance_change=1e-10,
        line_search_fn="strong_wolfe",
    )

    def closure():
        optimizer.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(dense, cat), label)
        if l2:
            loss = loss + 0.5 * l2 * sum((p * p).sum() for p in penalised)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    state = optimizer.state_dict()["state"]
    iterations = int(next(iter(state.values())).get("n_iter", 0)) if state else 0
    return {"loss": float(loss.detach()), "iterations": iterations}


def train_convex(job, *, model, loaded, seed: int, emit: Emitter) -> int:
    """A template fitted by ``fit_convex`` (``solver: lbfgs``): one full-batch solve on the
    training rows (seconds on a single core for 100k rows), then the shared ``finish_run``
    (calibration on validation, the test-row evaluation, the bundle). No checkpoint: a solve
    interrupted is simply solved again."""
    from training import evaluation

    train_x, validation = loaded.train, loaded.validation
    emit(
        "start",
        total_steps=1,
        step=0,
        steps_per_epoch=1,
        train_rows=train_x.n,
        validation_rows=validation.n,
        holdout_rows=loaded.holdout.n,
        device=str(next(model.parameters()).device),
    )
    started = time.monotonic()
    device = next(model.parameters()).device
    model.train()
    fitted = fit_convex(
        model,
        train_x.dense.to(device),
        train_x.cat.to(device),
        train_x.label.to(device),
        l2=float(job.param("l2", 1e-4)),
        max_iter=int(job.param("max_iter", 200)),
    )
    elapsed = time.monotonic() - started
    emit(
        "progress",
        step=1,
        total_steps=1,
        epoch=0,
        loss=fitted["loss"],
        samples_per_s=train_x.n / max(elapsed, 1e-9),
        eta_s=0.0,
        gpu_memory_mb=0,
    )
    # One solve: the "stopping" record holds its one validation value (no patience, no epochs).
    stopping = EarlyStopping(metric=str(job.param("early_stopping_metric", "logloss")), patience=0)
    if validation.n:
        prob = evaluation.predict(model, validation.dense.to(device), validation.cat.to(device))
        val_y = validation.label.numpy()
        values = {"auc": evaluation.auc(val_y, prob), "logloss": evaluation.logloss(val_y, prob)}
        emit("metric", step=1, name="val_auc", value=values["auc"])
        emit("metric", step=1, name="val_logloss", value=values["logloss"])
        stopping.update(1, values[stopping.metric], model)
    model.to("cpu")
    metrics: dict[str, Any] = {
        "train_samples_per_s": train_x.n / max(elapsed, 1e-9),
        "steps": 1,
        "solver": "lbfgs",
        "solver_iterations": fitted["iterations"],
        "epoch_eval_s": 0.0,
        "best_epoch": None,
        "stopped_early": False,
    }
    return finish_run(job, model, loaded, metrics, stopping, step=1, seed=seed, emit=emit)


SELECTION_ROWS_FILE = "selection_rows.npz"


def save_selection_rows(work: Path, label: Any, prob: Any) -> None:
    """Beside the model (``SELECTION_ROWS_FILE``): each validation row's label and the
    calibrated probability the run's validation log loss averages (cross-fitted where it
    could be), for whoever compares runs on the same rows row by row
    (``training.tuner.chosen_trial``)."""
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    np.savez(
        work / SELECTION_ROWS_FILE,
        label=np.asarray(label, dtype=np.int8),
        prob=np.asarray(prob, dtype=np.float32),
    )


def selection_row_losses(work: Path) -> Any:
    """A run's per-row validation log losses from its ``SELECTION_ROWS_FILE`` (None without
    one, or when it cannot be read)."""
    import numpy as np

    from training import evaluation

    try:
        with np.load(Path(work) / SELECTION_ROWS_FILE) as saved:
            return evaluation.row_logloss(saved["label"], saved["prob"])
    except (OSError, KeyError, ValueError):
        return None


def finish_run(
    job,
    model,
    loaded,
    metrics: dict[str, Any],
    stopping,
    *,
    step: int,
    seed: int,
    emit: Emitter,
    scored: tuple[Any, Any] | None = None,
) -> int:
    """The end of every run, torch or boosted trees: fit the calibration on the validation rows
    (and report it, with the cross-fitted log loss model selection reads, and the early
    stopping's best and curve), evaluate on the test rows (reported only), save the bundle
    (its spec is ``loaded.spec``) and emit ``done``. Returns exit code 0. ``scored``: the
    (labels, logits) that stand for the validation rows (a cross-fitted run's out-of-fold
    ones), instead of the model's logits on ``loaded.validation``."""
    from training import evaluation
    from training.bundle import apply_calibration, save_bundle

    spec = loaded.spec
    validation = loaded.validation
    if scored is None and validation.n:
        scored = (
            validation.label.numpy(),
            evaluation.predict_logits(model, validation.dense, validation.cat),
        )
    if scored is not None and len(scored[0]):
        val_y, logits = scored
        method = str(job.param("calibration", "temperature"))
        fitted = evaluation.fit_calibration(method, val_y, logits)
        if fitted is not None:
            spec.extra = {**spec.extra, "calibration": fitted}
        raw = evaluation.summary(val_y, apply_calibration(logits, None))
        calibrated = evaluation.summary(val_y, apply_calibration(logits, fitted))
        crossfit = evaluation.crossfit_probabilities(method, val_y, logits)
        save_selection_rows(
            Path(job.work_dir),
            val_y,
            crossfit if crossfit is not None else apply_calibration(logits, fitted),
        )
        metrics["validation"] = {
            **calibrated,
            # What model selection reads (``tuner.validation_value``): the log loss of rows
            # the calibration was not fitted on.
            "crossfit_logloss": (None if crossfit is None else evaluation.logloss(val_y, crossfit)),
            "uncalibrated_logloss": raw["logloss"],
            "uncalibrated_ece": raw["ece"],
            "rows": len(val_y),
            "calibration": (fitted or {}).get("method", "none"),
            "temperature": (fitted or {}).get("temperature"),
            "early_stopping_metric": stopping.metric,
            "best_value": stopping.best_value,
            "curve": stopping.final_curve(),
        }
    if loaded.holdout.n:
        metrics.update(
            evaluation.evaluate(
                model,
                spec,
                loaded.holdout,
                seed=seed,
                importance=bool(job.param("importance", True)),
            )
        )
    spec.extra = {**spec.extra, "holdout": metrics.get("holdout", {})}
    save_bundle(job.model_dir, model, spec)
    emit("done", step=step, metrics=metrics, model_path=str(job.model_dir))
    return 0


def _stop_with_agent() -> None:
    """Lower this child's process limit, and ask the kernel for SIGTERM when the agent that
    started it dies (SIGKILL included): the child then checkpoints and exits, and the restarted
    agent resumes from that checkpoint instead of finding a stray process. Linux only."""
    limit = os.environ.get("RANKOPS_MAX_PROCESSES", "")
    if limit.isdigit():
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (int(limit), int(limit)))
    parent = os.environ.get("RANKOPS_AGENT_PID", "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    # A data-parallel rank other than 0 has nothing to save: it ends with its rank 0.
    rank = os.environ.get("RANKOPS_DDP_RANK", "0")
    death = signal.SIGKILL if rank not in ("", "0") else signal.SIGTERM
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(death))
    if os.getppid() != int(parent):  # the agent died before the request took effect
        signal.raise_signal(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    from training.data import JobSpec

    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--rank" and args[1].isdigit():
        args = args[2:]  # a data-parallel rank (training.distributed); the rank is in its env
    if len(args) != 1:
        print("usage: python -m training.runner [--rank N] <spec.json>", file=sys.stderr)
        return 2
    job = JobSpec.from_json(Path(args[0]).read_text())
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.set)
    _stop_with_agent()
    out = sys.stdout
    # Anything a library prints goes to stderr (the log); stdout carries only events.
    sys.stdout = sys.stderr
    emit = Emitter(stream=out)
    from training import distributed

    try:
        code = train(job, emit=emit, stop=stop)
    except Exception as exc:  # noqa: BLE001 - reported to the agent, then exit 1
        import traceback

        traceback.print_exc()
        emit("error", message=f"{type(exc).__name__}: {exc}"[:2000])
        distributed.abandon_current()
        code = 1
    if distributed.joined():
        # torch.distributed's threads can abort the interpreter's teardown ("terminate called
        # without an active exception", exit -6: seen in a CI run, from a rank that had
        # finished cleanly): everything is written, so leave without it.
        out.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
